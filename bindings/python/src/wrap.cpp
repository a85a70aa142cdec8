// keyfence.wrap's native half: the authority and the machine side of
// policy-key wrapping, on a store named by one string: a directory or
// etcd://HOST:PORT[,HOST:PORT...]/PREFIX.
#include "native.h"

namespace kfpy {

namespace {

std::unique_ptr<Authority> authority_make(py::handle store, bool create) {
    std::string dir = path(store, "store");
    keyfence_authority *out = nullptr;
    nogil([&] { return create ? keyfence_authority_init(dir.c_str(), &out) : keyfence_authority_open(dir.c_str(), &out); });
    return std::make_unique<Authority>(out);
}

// The C handle needs exclusive use for wrap and rotation: those calls hold
// the authority's lock exclusive, issue holds it shared.
py::bytes authority_issue(Authority &a, py::handle attrs) {
    Attributes t(attrs);
    Owned out;
    a.call([&](keyfence_authority *h) { return keyfence_authority_issue_pairs(h, t.data(), t.size(), &out.b); });
    return out.to_bytes();
}

py::bytes authority_wrap(Authority &a, py::handle policy, py::handle secret) {
    std::string p = text(policy, "policy");
    Bytes s(secret, "secret");
    Owned out;
    a.call<Authority::Unique>(
        [&](keyfence_authority *h) { return keyfence_authority_wrap(h, p.c_str(), s.data(), s.size(), &out.b); });
    return out.to_bytes();
}

size_t authority_rotate_master(Authority &a) {
    size_t n = 0;
    a.call<Authority::Unique>([&](keyfence_authority *h) { return keyfence_authority_rotate_master(h, &n); });
    return n;
}

// `revoke`: the report as the C ABI's JSON text (keyfence.wrap turns it
// into a Revocation).
std::string authority_revoke(Authority &a, py::handle machine_id) {
    std::string id = text(machine_id, "machine_id");
    Owned out;
    a.call<Authority::Unique>(
        [&](keyfence_authority *h) { return keyfence_authority_revoke_report(h, id.c_str(), &out.b); });
    return std::string(reinterpret_cast<const char *>(out.b.data), out.b.len);
}

// `where`: the answer as the C ABI's JSON text (keyfence.wrap turns it
// into typed results). `traffic` is a sequence of (group, rps) and
// `latency` of (from, to, ms), already checked by keyfence.wrap; the
// strings are copied into `names`, sized first so that the pointers the C
// structs hold stay put.
std::string authority_where(Authority &a, py::handle policy, py::handle by, py::handle near, py::handle traffic,
                            py::handle latency, double warn_ratio, bool machines) {
    std::string p = text(policy, "policy");
    bool has_by = !by.is_none(), has_near = !near.is_none();
    std::string b = has_by ? text(by, "by") : std::string(), n = has_near ? text(near, "near") : std::string();
    py::list t = traffic.is_none() ? py::list() : py::list(py::reinterpret_borrow<py::object>(traffic));
    py::list l = latency.is_none() ? py::list() : py::list(py::reinterpret_borrow<py::object>(latency));
    std::vector<std::string> names;
    names.reserve(t.size() + 2 * l.size());
    std::vector<keyfence_group_rate> rates;
    for (py::handle item : t) {
        py::tuple row = py::reinterpret_borrow<py::tuple>(item);
        names.push_back(text(row[0], "traffic group"));
        rates.push_back(keyfence_group_rate{names.back().c_str(), row[1].cast<double>()});
    }
    std::vector<keyfence_group_latency> lats;
    for (py::handle item : l) {
        py::tuple row = py::reinterpret_borrow<py::tuple>(item);
        names.push_back(text(row[0], "latency from"));
        const char *from = names.back().c_str();
        names.push_back(text(row[1], "latency to"));
        lats.push_back(keyfence_group_latency{from, names.back().c_str(), row[2].cast<double>()});
    }
    Owned out;
    a.call([&](keyfence_authority *h) {
        return keyfence_authority_where(h, p.c_str(), has_by ? b.c_str() : nullptr, has_near ? n.c_str() : nullptr,
                                        traffic.is_none() ? nullptr : rates.data(), rates.size(),
                                        latency.is_none() ? nullptr : lats.data(), lats.size(), warn_ratio, machines,
                                        &out.b);
    });
    return std::string(reinterpret_cast<const char *>(out.b.data), out.b.len);
}

size_t authority_import_inventory(Authority &a, py::handle lines, py::handle name) {
    std::string t = text(lines, "text");
    std::string nm = text(name, "name");
    size_t added = 0;
    a.call([&](keyfence_authority *h) { return keyfence_authority_import_inventory(h, t.c_str(), nm.c_str(), &added); });
    return added;
}

// With a state path, the machine keeps its floor (the newest lists it
// accepts) in that file and starts from it: reading it and taking its lock
// file are I/O, without the GIL as every other call.
std::unique_ptr<Machine> machine_new(py::handle key, py::handle store, py::handle state) {
    Bytes k(key, "machine_key");
    std::string dir = path(store, "store");
    keyfence_machine *out = nullptr;
    if (state.is_none()) {
        nogil([&] { return keyfence_machine_new(k.data(), k.size(), dir.c_str(), &out); });
    } else {
        std::string file = path(state, "state");
        nogil([&] { return keyfence_machine_new_with_state(k.data(), k.size(), dir.c_str(), file.c_str(), &out); });
    }
    return std::make_unique<Machine>(out);
}

void machine_require(const Machine &mc, py::handle lists) {
    Bytes l(lists, "lists");
    nogil([&] { return keyfence_machine_require(mc.get(), l.data(), l.size()); });
}

py::bytes machine_newest_lists(const Machine &mc) {
    Owned out;
    nogil([&] { return keyfence_machine_newest_lists(mc.get(), &out.b); });
    return out.to_bytes();
}

bool machine_could_open(const Machine &mc, py::handle env) {
    Bytes e(env, "envelope");
    bool could = false;
    nogil([&] { return keyfence_machine_could_open(mc.get(), e.data(), e.size(), &could); });
    return could;
}

py::bytes machine_open(const Machine &mc, py::handle env) {
    Bytes e(env, "envelope");
    Owned out;
    nogil([&] { return keyfence_machine_open(mc.get(), e.data(), e.size(), &out.b); });
    return out.to_bytes();
}

std::string machine_id(const Machine &mc) {
    Owned out;
    nogil([&] { return keyfence_machine_id(mc.get(), &out.b); });
    py::bytes b = out.to_bytes();
    return std::string(b);
}

void machine_follow(const Machine &mc) {
    nogil([&] { return keyfence_machine_follow(mc.get()); });
}

py::dict machine_cache_stats(const Machine &mc) {
    keyfence_cache_stats s{};
    nogil([&] { return keyfence_machine_cache_stats(mc.get(), &s); });
    py::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["evictions"] = s.evictions;
    d["entries"] = s.entries;
    d["watch_events"] = s.watch_events;
    d["resyncs"] = s.resyncs;
    d["propagations"] = s.propagations;
    d["propagation_last_us"] = s.propagation_last_us;
    d["propagation_max_us"] = s.propagation_max_us;
    return d;
}

}  // namespace

void bind_wrap(py::module_ &m) {
    py::class_<Authority>(m, "Authority",
                         "An authority opened on a store, named by one string: a directory, or "
                         "etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?cacert=&cert=&key=] for an etcd cluster.")
        .def_static("init", [](py::handle store) { return authority_make(store, true); }, py::arg("store"),
                    "Creates an authority, with its first master generation, in the store named (a directory "
                    "or etcd://...).\n\n"
                    "Raises AuthorityExists if the store holds one, StoreIOError if it cannot be written, "
                    "StoreConflict if another authority was created at the same time, InvalidArgument for "
                    "a name that names no store.")
        .def_static("open", [](py::handle store) { return authority_make(store, false); }, py::arg("store"),
                    "Opens the authority in the store named (a directory or etcd://...).\n\n"
                    "Raises NoAuthority if the store holds none, StoreError if its state does not decode.")
        .def("issue", &authority_issue, py::arg("attributes"),
             "Issues a machine key (bytes, a secret: give it to that machine only) for a mapping of "
             "attributes: one attribute key per live master generation.\n\n"
             "Raises InvalidAttributes, ReservedLabel, LimitExceeded, StoreError.")
        .def("wrap", &authority_wrap, py::arg("policy"), py::arg("secret"),
             "Wraps a secret under a policy: an envelope (bytes) any machine whose attributes satisfy "
             "the policy can open.\n\n"
             "Raises PolicySyntaxError (with .position), LimitExceeded, StoreError.")
        .def("rotate_master", &authority_rotate_master,
             "Rotates the master key: a new active generation, every policy key re-sealed under it "
             "(envelopes are never touched). Returns how many policy keys were re-sealed.")
        .def("revoke", &authority_revoke, py::arg("machine_id"),
             "Revokes a machine by its id (Machine.id): records it, gives every policy a new key sealed so "
             "that machine cannot open it, re-wraps the store's envelopes to them and retires the old keys, "
             "so the policy keys it cached open nothing the store serves. Returns the report as the JSON text "
             "of `keyfence authority revoke --json` (keyfence.wrap.Authority.revoke gives a Revocation). Call again after an interruption to finish; issue "
             "refuses the id afterwards (MachineRevoked).\n\n"
             "Raises InvalidAttributes for an id a policy cannot name, PolicyTooLarge when the negations "
             "no longer fit (rotate the master key twice), StoreError.")
        .def("where", &authority_where, py::arg("policy"), py::kw_only(), py::arg("by") = py::none(),
             py::arg("near") = py::none(), py::arg("traffic") = py::none(), py::arg("latency") = py::none(),
             py::arg("warn_ratio") = 0.0, py::arg("machines") = false,
             "Where a key wrapped under the policy can be used, as the JSON text of `keyfence authority "
             "where --json` (keyfence.wrap.Authority.where gives typed results).")
        .def("import_inventory", &authority_import_inventory, py::arg("text"), py::kw_only(),
             py::arg("name") = "inventory",
             "Adds machines already issued to the inventory from text, one a line: the machine id, a tab, "
             "its attributes (label=value,...). Returns how many were new.\n\n"
             "Raises InvalidArgument naming the line and field of a line that does not read, StoreError.")
        .def("close", &Authority::close,
             "Frees the authority and wipes its master keys; later calls raise InvalidArgument.")
        .def_property_readonly("closed", &Authority::closed)
        .def("__repr__", [](const Authority &a) {
            return std::string(a.closed() ? "<keyfence.wrap.Authority (closed)>" : "<keyfence.wrap.Authority>");
        });

    py::class_<Machine>(m, "Machine", "A machine: its machine key and the store of sealed policy keys.")
        .def(py::init(&machine_new), py::arg("machine_key"), py::arg("store"), py::kw_only(),
             py::arg("state") = py::none(),
             "A machine holding the machine key the authority issued it, reading sealed policy keys from "
             "the store named (a directory or etcd://...).\n\n"
             "With state (a file path; usually beside the machine key file, KEY.newest, where the command "
             "line, the key process and the agent keep it), it keeps the newest generation and revocation "
             "lists it accepts in that file and starts from the lists the file holds: a store rolled back "
             "to an older list is refused (ReplayedObject) by every process of this machine that names "
             "the file, after a restart too. Without it, each process starts with no floor.\n\n"
             "Raises InvalidKey if the machine key does not decode, InvalidArgument for a name that "
             "names no store, StoreIOError if the state file exists but cannot be read or its folder "
             "cannot take its lock file (state + '.lock'), InvalidEnvelope if the state file does not "
             "decode (delete it to start again from the store).")
        .def("could_open", &machine_could_open, py::arg("envelope"),
             "Whether this machine could open the envelope, from its policy and the machine's attributes "
             "alone (no cryptography): to forward the request to a machine that can.\n\n"
             "Raises InvalidEnvelope if the bytes are not an envelope.")
        .def("open", &machine_open, py::arg("envelope"),
             "Opens the envelope and returns its secret. The first open under a policy decrypts its policy "
             "key with CP-ABE (milliseconds); later ones hit the cache.\n\n"
             "Raises PolicyNotSatisfied, RetiredGeneration, UnknownPolicyKey, InvalidEnvelope, "
             "ReplayedObject (the store put back an older generation list), MachineRevoked (this "
             "machine was revoked), StoreError.")
        .def("require", &machine_require, py::arg("lists"),
             "Requires lists (bytes from newest_lists(), of this process or another of the same machine) "
             "as a floor: from now on this machine refuses a generation list that goes back on them, or "
             "a revocation list that lacks one of their ids (ReplayedObject from open). Lists older than "
             "those it accepted change nothing. A machine made with state= also writes a floor it was "
             "raised to into its file.\n\n"
             "Raises InvalidEnvelope if the bytes do not decode or a list's signature fails, "
             "InconsistentState for a malformed list, WrongAuthority for lists another authority signed "
             "(nothing is required then), StoreIOError if the state file cannot be written.")
        .def("newest_lists", &machine_newest_lists,
             "The newest generation and revocation lists this machine has accepted (or was required to), "
             "as the authority signed them, encoded as bytes (not secret): what to hand to another machine "
             "of the same authority with require().")
        .def_property_readonly("id", &machine_id,
             "The machine's id: the machine attribute the authority set when it issued the key, which "
             "Authority.revoke takes; empty for a key issued before keyfence had machine ids.")
        .def("follow", &machine_follow,
             "Follows the store: a watch (etcd's stream, or a poll of a directory every 100 ms) brings "
             "each change to the cache as it is committed: a retired policy key is forgotten at once, a "
             "rotated one opened ahead, a new generation list verified. Until the machine is freed; a "
             "second call changes nothing.\n\nRaises StoreIOError if the watch cannot start.")
        .def("cache_stats", &machine_cache_stats,
             "The cache's counters as a dict of ints: hits, misses, evictions, entries, and what "
             "following the store did: watch_events, resyncs, propagations (generation lists received), "
             "propagation_last_us and propagation_max_us (authority commit to this cache).")
        .def("__repr__", [](const Machine &) { return std::string("<keyfence.wrap.Machine (secret)>"); });
}

}  // namespace kfpy
