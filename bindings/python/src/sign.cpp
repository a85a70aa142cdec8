// keyfence.sign's native half: the signing engine, private keys, and the
// completion queue asyncio waits on.
#include "native.h"

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>

namespace kfpy {

namespace {

using CompletionQueue = Handle<keyfence_completion_queue, keyfence_completion_queue_free>;
using Operation = Handle<keyfence_operation, keyfence_operation_free>;

// The engine a key is loaded through: None, a keyfence.sign.Engine (which
// keeps its native engine in `_native`), or the native engine itself.
Engine *engine_arg(py::handle obj) {
    if (obj.is_none()) return nullptr;
    py::handle native = obj;
    if (!py::isinstance<Engine>(obj) && py::hasattr(obj, "_native")) native = obj.attr("_native");
    if (!py::isinstance<Engine>(native))
        raise_type("engine must be a keyfence.sign.Engine or None, not '" + type_name(obj) + "'");
    return native.cast<Engine *>();
}

// Runs load(e) without the GIL, e being the engine's handle (held for
// reading) or nullptr without an engine; a closed engine raises ShutDown.
template <class F>
PrivateKey load_key(Engine *engine, F &&load) {
    keyfence_private_key *out = nullptr;
    auto call = [&](keyfence_engine *e) { return load(e, &out); };
    if (engine)
        engine->call(call);
    else
        nogil([&] { return call(nullptr); });
    return PrivateKey(out);
}

std::unique_ptr<Engine> engine_new(py::list classes, uint32_t timeout_ms, bool isolated, py::object key_process,
                                   py::object agent, py::object offload, py::object crypto_mb) {
    keyfence_engine_config *cfg = nullptr;
    check(keyfence_engine_config_new(&cfg));
    Handle<keyfence_engine_config, keyfence_engine_config_free> config(cfg);
    for (py::handle c : classes) {
        auto t = c.cast<std::tuple<uint32_t, uint32_t, uint32_t>>();
        check(keyfence_engine_config_set_class(cfg, std::get<0>(t), std::get<1>(t), std::get<2>(t)));
    }
    if (timeout_ms) check(keyfence_engine_config_set_timeout_ms(cfg, timeout_ms));
    std::optional<std::string> program;
    if (!key_process.is_none()) program = path(key_process, "key_process");
    if (isolated) check(keyfence_engine_config_set_isolated(cfg, program ? program->c_str() : nullptr));
    // The agent's socket: the engine connects to it now (BackendFailed, with
    // the reason, when no agent answers or it refuses this user).
    if (!agent.is_none()) {
        if (isolated)
            raise_value("agent and isolated=True are exclusive: an engine's keys are either in its own key process "
                        "or in the key agent");
        std::string socket = path(agent, "agent");
        if (socket.empty()) raise_value("agent is an empty path: name the agent's socket, such as /run/keyfence/agent.sock");
        check(keyfence_engine_config_set_agent(cfg, socket.c_str()));
    }
    // The multi-buffer device: the core parses the mode and refuses it for
    // an agent's engine (the agent chooses), at keyfence_engine_new.
    if (!offload.is_none() || !crypto_mb.is_none()) {
        std::optional<std::string> mode, library;
        if (!offload.is_none()) mode = text(offload, "offload");
        if (!crypto_mb.is_none()) library = path(crypto_mb, "crypto_mb");
        check(keyfence_engine_config_set_offload(cfg, mode ? mode->c_str() : nullptr, library ? library->c_str() : nullptr));
    }
    keyfence_engine *out = nullptr;
    nogil([&] { return keyfence_engine_new(cfg, &out); });
    return std::make_unique<Engine>(out, !agent.is_none());
}

PrivateKey key_from_pem(py::handle pem, py::handle engine_obj) {
    Engine *engine = engine_arg(engine_obj);
    // PEM may come as text; DER only as bytes.
    std::string pem_text;
    std::optional<Bytes> raw;
    const uint8_t *data;
    size_t len;
    if (PyUnicode_Check(pem.ptr())) {
        pem_text = text(pem, "pem");
        data = reinterpret_cast<const uint8_t *>(pem_text.data());
        len = pem_text.size();
    } else {
        raw.emplace(pem, "pem");
        data = raw->data();
        len = raw->size();
    }
    struct Wipe {
        std::string &s;
        // Our copy of PEM text is a secret too, whatever happens.
        ~Wipe() { std::fill(s.begin(), s.end(), '\0'); }
    } wipe{pem_text};
    return load_key(engine, [&](keyfence_engine *e, keyfence_private_key **out) {
        return keyfence_key_from_pem(e, data, len, out);
    });
}

// Opens an envelope holding a PEM/DER private key and loads it, without the
// key's bytes ever becoming a Python object.
PrivateKey key_from_envelope(const Machine &machine, py::handle envelope, py::handle engine_obj) {
    Engine *engine = engine_arg(engine_obj);
    Bytes env(envelope, "envelope");
    return load_key(engine, [&](keyfence_engine *e, keyfence_private_key **out) {
        Owned secret;
        keyfence_result r = keyfence_machine_open(machine.get(), env.data(), env.size(), &secret.b);
        return r != KEYFENCE_OK ? r : keyfence_key_from_pem(e, secret.b.data, secret.b.len, out);
    });
}

// Loads the key an envelope holds with the machine key *file*: with an
// isolated engine its key process opens the envelope and this process reads
// only the machine key's public part; otherwise it is opened here. With an
// agent's engine the agent opens it with its own machine key and store:
// `store` and `machine_key` may be None then (and are not read if given);
// the core refuses None for any other engine, saying so.
PrivateKey key_load_envelope(py::handle store, py::handle machine_key, py::handle envelope, py::handle engine_obj) {
    Engine *engine = engine_arg(engine_obj);
    std::optional<std::string> dir, mk;
    if (!store.is_none()) dir = path(store, "store");
    if (!machine_key.is_none()) mk = path(machine_key, "machine_key");
    Bytes env(envelope, "envelope");
    return load_key(engine, [&](keyfence_engine *e, keyfence_private_key **out) {
        return keyfence_key_from_envelope(e, dir ? dir->c_str() : nullptr, mk ? mk->c_str() : nullptr, env.data(),
                                          env.size(), out);
    });
}

// load_envelope(envelope, engine=...): the short form for an agent's engine.
PrivateKey key_load_agent_envelope(py::handle envelope, py::handle engine_obj) {
    return key_load_envelope(py::none(), py::none(), envelope, engine_obj);
}

// Loads the key a PKCS#11 URI names where the engine holds its keys: here
// (the module loaded and the PIN read in this process), or in the engine's
// key process or agent, which this process never maps the module for.
PrivateKey key_load_pkcs11(py::handle uri, py::handle engine_obj) {
    Engine *engine = engine_arg(engine_obj);
    std::string u = text(uri, "uri");
    return load_key(engine, [&](keyfence_engine *e, keyfence_private_key **out) {
        return keyfence_key_load_pkcs11(e, u.c_str(), out);
    });
}

py::bytes engine_sign(Engine &engine, const PrivateKey &key, py::handle alg, py::handle data, uint32_t timeout_ms) {
    std::string a = text(alg, "algorithm");
    Bytes msg(data, "data");
    Owned sig;
    engine.call([&](keyfence_engine *e) {
        return keyfence_engine_sign(e, key.get(), a.c_str(), msg.data(), msg.size(), timeout_ms, &sig.b);
    });
    return sig.to_bytes();
}

// Submits without blocking (no cryptography here, so the GIL stays held:
// releasing it would cost more than the call). The outcome arrives on
// `queue` tagged with `token`.
Operation engine_submit(Engine &engine, const PrivateKey &key, py::handle alg, py::handle data, uint32_t timeout_ms,
                        const CompletionQueue &queue, uint64_t token) {
    std::string a = text(alg, "algorithm");
    Bytes msg(data, "data");
    keyfence_operation *op = nullptr;
    engine.call_now([&](keyfence_engine *e) {
        return keyfence_engine_submit_to_queue(e, key.get(), a.c_str(), msg.data(), msg.size(), timeout_ms,
                                               queue.get(), reinterpret_cast<void *>(static_cast<uintptr_t>(token)),
                                               &op);
    });
    return Operation(op);
}

// Completes the futures of finished operations: `pending` maps each
// operation's token to its asyncio future, and loses the entries of those
// resolved here; `error(code, message)` makes the exception of a failed one.
// Done here rather than in Python because the loop runs it once per wake-up
// for every signature: a Python loop over tuples cost about 1.9 us per
// completion, more than the rest of the drain (issue 29's profile). Returns
// how many completions it took.
size_t queue_resolve(const CompletionQueue &queue, py::dict pending, py::handle error, size_t max) {
    // Interned once: the attribute names of asyncio.Future called per completion.
    static PyObject *const done_name = PyUnicode_InternFromString("done");
    static PyObject *const result_name = PyUnicode_InternFromString("set_result");
    static PyObject *const exception_name = PyUnicode_InternFromString("set_exception");
    constexpr size_t chunk = 64;
    keyfence_completion done[chunk];
    size_t taken = 0;
    // A failure while completing one future must not strand the others (nor
    // leak their signatures): the first is raised once all are handled.
    std::optional<py::error_already_set> first_error;
    while (taken < max) {
        size_t n = 0;
        size_t want = std::min(chunk, max - taken);
        check(keyfence_completion_queue_drain(queue.get(), done, want, &n));
        for (size_t i = 0; i < n; i++) {
            keyfence_completion &c = done[i];
            try {
                py::int_ token(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(c.user_data)));
                // Absent once its task was cancelled and moved on.
                PyObject *found = PyDict_GetItemWithError(pending.ptr(), token.ptr());
                if (!found && PyErr_Occurred()) throw py::error_already_set();
                if (found) {
                    py::object fut = py::reinterpret_borrow<py::object>(found);
                    if (PyDict_DelItem(pending.ptr(), token.ptr()) != 0) throw py::error_already_set();
                    py::object is_done = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(fut.ptr(), done_name));
                    if (!is_done) throw py::error_already_set();
                    if (!PyObject_IsTrue(is_done.ptr())) {
                        py::object arg;
                        PyObject *method = result_name;
                        if (c.result == KEYFENCE_OK) {
                            arg = py::bytes(reinterpret_cast<const char *>(c.signature.data), c.signature.len);
                        } else {
                            arg = error(static_cast<uint32_t>(c.result),
                                        py::str(reinterpret_cast<const char *>(c.message.data), c.message.len));
                            method = exception_name;
                        }
                        py::object r = py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(fut.ptr(), method, arg.ptr()));
                        if (!r) throw py::error_already_set();
                    }
                }
            } catch (py::error_already_set &e) {
                if (!first_error) first_error.emplace(std::move(e));
            }
            keyfence_bytes_free(&c.signature);
            keyfence_bytes_free(&c.message);
        }
        taken += n;
        if (n < want) break;
    }
    if (first_error) throw std::move(*first_error);
    return taken;
}

py::dict engine_metrics(Engine &engine) {
    static const std::pair<const char *, uint32_t> classes[] = {
        {"rsa", KEYFENCE_CLASS_RSA}, {"ec", KEYFENCE_CLASS_EC}, {"slow", KEYFENCE_CLASS_SLOW},
        {"token", KEYFENCE_CLASS_TOKEN}};
    // Each field of keyfence_class_metrics under its own name.
    using M = keyfence_class_metrics;
    static const std::pair<const char *, uint32_t M::*> gauges[] = {
        {"workers", &M::workers}, {"queue_capacity", &M::queue_capacity}, {"queue_depth", &M::queue_depth},
        {"in_flight", &M::in_flight}};
    static const std::pair<const char *, uint64_t M::*> counters[] = {
        {"submitted", &M::submitted}, {"completed", &M::completed}, {"errors", &M::errors},
        {"overloaded", &M::overloaded}, {"timed_out", &M::timed_out}, {"p50_ns", &M::p50_ns},
        {"p99_ns", &M::p99_ns}, {"p999_ns", &M::p999_ns}};
    py::dict out;
    for (auto [name, cls] : classes) {
        keyfence_class_metrics m{};
        engine.call([&](keyfence_engine *e) { return keyfence_engine_metrics(e, cls, &m); });
        py::dict d;
        for (auto [field, member] : gauges) d[field] = m.*member;
        for (auto [field, member] : counters) d[field] = m.*member;
        out[name] = d;
    }
    return out;
}

py::str engine_metrics_prometheus(Engine &engine) {
    Owned out;
    engine.call([&](keyfence_engine *e) { return keyfence_engine_metrics_prometheus(e, &out.b); });
    return out.to_str();
}

// Both handles held for reading; either one closed raises ShutDown.
void engine_attach_remote(Engine &engine, RemoteSigner &remote) {
    bool engine_open = true;
    remote.call([&](keyfence_remote *r) {
        keyfence_result res = KEYFENCE_OK;
        engine_open = engine.run([&](keyfence_engine *e) { return keyfence_engine_attach_remote(e, r); }, res);
        return res;
    });
    if (!engine_open) engine.raise_closed();
}

}  // namespace

void bind_sign(py::module_ &m) {
    py::class_<Engine>(m, "Engine", "A signing engine (see keyfence.sign.Engine).")
        .def(py::init(&engine_new), py::arg("classes"), py::arg("timeout_ms"), py::arg("isolated"),
             py::arg("key_process"), py::arg("agent") = py::none(), py::arg("offload") = py::none(),
             py::arg("crypto_mb") = py::none())
        .def("sign", &engine_sign, py::arg("key"), py::arg("algorithm"), py::arg("data"), py::arg("timeout_ms"))
        .def("submit", &engine_submit, py::arg("key"), py::arg("algorithm"), py::arg("data"), py::arg("timeout_ms"),
             py::arg("queue"), py::arg("token"))
        .def("metrics", &engine_metrics)
        .def("metrics_prometheus", &engine_metrics_prometheus)
        .def("attach_remote", &engine_attach_remote, py::arg("remote"))
        .def("close", &Engine::close)
        .def_property_readonly("closed", &Engine::closed);

    py::class_<PrivateKey>(m, "PrivateKey", "A private key, in this process or held by a key process.")
        .def_static("from_pem", &key_from_pem, py::arg("pem"), py::arg("engine") = py::none(),
                    "Loads a private key from PEM (bytes or str) or DER: RSA 2048-4096, ECDSA P-256/P-384, "
                    "Ed25519. With an isolated engine the key goes to its key process.\n\n"
                    "Raises InvalidPrivateKey (what is wrong with it, never its contents), BackendFailed.")
        .def_static("from_envelope", &key_from_envelope, py::arg("machine"), py::arg("envelope"),
                    py::arg("engine") = py::none(),
                    "Opens an envelope holding a private key with a Machine and loads the key, without its "
                    "bytes ever becoming a Python object.\n\nRaises as Machine.open and from_pem.")
        .def_static("load_envelope", &key_load_envelope, py::arg("store"), py::arg("machine_key"),
                    py::arg("envelope"), py::kw_only(), py::arg("engine") = py::none(),
                    "Loads the private key an envelope holds, opened with the machine key file machine_key "
                    "against the store folder. With an isolated engine its key process opens the envelope and "
                    "keeps the key: this process reads only the machine key's public part, so neither the "
                    "machine key's secret nor the private key is ever here. Otherwise it is opened here. With "
                    "an agent's engine (Engine(agent=...)) the agent opens it with its own machine key and "
                    "store: store and machine_key may be None, and are not read.\n\n"
                    "Raises ResourceError (the machine key file cannot be read), InvalidArgument (store or "
                    "machine_key None without an agent's engine), BackendFailed (the agent refuses it, its "
                    "reason in the message, e.g. POLICY_NOT_SATISFIED), and as Machine.open and from_pem.")
        .def_static("load_envelope", &key_load_agent_envelope, py::arg("envelope"), py::kw_only(),
                    py::arg("engine") = py::none(),
                    "Loads the private key an envelope holds through an agent's engine (Engine(agent=...)): "
                    "the agent opens it with its own machine key and store, and this process reads neither. "
                    "Same as load_envelope(None, None, envelope, engine=engine).\n\n"
                    "Raises InvalidArgument (engine is not an agent's), BackendFailed (the agent refuses it, "
                    "its reason in the message, e.g. POLICY_NOT_SATISFIED), InvalidEnvelope.")
        .def_static("load_pkcs11", &key_load_pkcs11, py::arg("uri"), py::kw_only(), py::arg("engine") = py::none(),
                    "Loads the private key a PKCS#11 URI (RFC 7512) names: a handle on a key that never leaves "
                    "its token, signed by the token on the engine's token class. The module and PIN come from "
                    "the URI (module-path, pin-source=file:...) or the environment of the process that loads it "
                    "(KEYFENCE_PKCS11_MODULE, KEYFENCE_PKCS11_PIN_FILE, KEYFENCE_PKCS11_PIN). With an isolated "
                    "or an agent's engine that process is the key process or the agent, and this one never "
                    "maps the module nor reads the PIN.\n\n"
                    "Raises InvalidArgument (a URI that does not parse or holds a PIN, a PIN file that cannot "
                    "be read), InvalidConfig (no module, or one that cannot be loaded), InvalidPrivateKey (no "
                    "such token or key), TokenLogin (no PIN, or a PIN the token refused), TokenUnavailable, "
                    "BackendFailed, ShutDown.")
        .def("public_key_der",
             [](const PrivateKey &k) {
                 Owned out;
                 nogil([&] { return keyfence_key_public_der(k.get(), &out.b); });
                 return out.to_bytes();
             },
             "The public half as DER SubjectPublicKeyInfo, for verifiers and certificates.")
        .def_property_readonly(
            "is_local",
            [](const PrivateKey &k) {
                bool local = false;
                check(keyfence_key_is_local(k.get(), &local));
                return local;
            },
            "True for a key in this process's memory; False for a handle on a key held by an isolated key "
            "process or by remote key servers.")
        .def("__repr__", [](const PrivateKey &) { return std::string("<keyfence.sign.PrivateKey (secret)>"); });

    py::class_<CompletionQueue>(m, "CompletionQueue", "Where finished operations wait; its fd is readable then.")
        .def(py::init([] {
            keyfence_completion_queue *q = nullptr;
            check(keyfence_completion_queue_new(&q));
            return CompletionQueue(q);
        }))
        .def("fileno", [](const CompletionQueue &q) { return keyfence_completion_queue_fd(q.get()); })
        .def("resolve", &queue_resolve, py::arg("pending"), py::arg("error"), py::arg("max") = 1024,
             "Completes the futures of finished operations (see keyfence.sign._LoopQueue).");

    py::class_<Operation>(m, "Operation", "A submitted operation, for cancelling it.")
        .def_property_readonly("id", [](const Operation &o) { return keyfence_operation_id(o.get()); })
        .def("cancel", [](const Operation &o) {
            bool cancelled = false;
            check(keyfence_operation_cancel(o.get(), &cancelled));
            return cancelled;
        });
}

}  // namespace kfpy
