// keyfence._core: the native half of the Python package, a thin skin over
// keyfence's C ABI (bindings/c/include/keyfence.h). Behaviour lives in the
// Rust core; this file converts arguments, releases the GIL around every
// call that does cryptography or I/O, and turns result codes into the
// exception classes of keyfence.exceptions (mapped there, in one place).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "keyfence.h"

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------------
// Errors

// An attribute of keyfence.exceptions. Leaked on purpose: a static
// py::object would be released after the interpreter has finalized.
py::handle exceptions_attr(const char *name) {
    return py::module_::import("keyfence.exceptions").attr(name).cast<py::object>().release();
}

[[noreturn]] void raise_object(const py::object &exc) {
    PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(exc.ptr())), exc.ptr());
    throw py::error_already_set();
}

// Raises the exception class of `code` with `msg`. Every error this
// module raises goes through here or raise_type, so all of them are
// keyfence.KeyfenceError subclasses with a code and a message (a bare
// ValueError or TypeError would escape `except KeyfenceError`).
[[noreturn]] void raise_error(keyfence_result code, std::string msg, py::object position = py::none()) {
    // The C library sets a message with every failure; should one ever be
    // missing, the code's name still says what went wrong.
    if (msg.empty()) msg = std::string("keyfence error ") + keyfence_result_name(code);
    static py::handle from_code = exceptions_attr("_from_code");
    raise_object(from_code(static_cast<uint32_t>(code), py::str(msg), position));
}

// Raises the Python exception for `code`, with the calling thread's last
// keyfence message (and policy position, when there is one). Must run on
// the thread that made the failing call, with the GIL held.
[[noreturn]] void raise_code(keyfence_result code) {
    size_t n = 0;
    keyfence_error_message(nullptr, 0, &n);
    std::string msg(n + 1, '\0');
    keyfence_error_message(msg.data(), msg.size(), &n);
    msg.resize(n);
    size_t pos = 0;
    py::object position = py::none();
    if (keyfence_error_position(&pos)) position = py::int_(pos);
    raise_error(code, msg, position);
}

// An argument of the wrong type: keyfence.InvalidArgumentType, which is
// both an InvalidArgument and a TypeError.
[[noreturn]] void raise_type(const std::string &msg) {
    static py::handle cls = exceptions_attr("InvalidArgumentType");
    raise_object(cls(py::str(msg), py::arg("code") = "INVALID_ARGUMENT", py::arg("number") = 1));
}

// An argument of the right type but an unusable value, or a closed object.
[[noreturn]] void raise_value(const std::string &msg) { raise_error(KEYFENCE_INVALID_ARGUMENT, msg); }

[[noreturn]] void raise_shut_down(const char *what) {
    raise_error(KEYFENCE_SHUT_DOWN, std::string("the ") + what + " is closed");
}

void check(keyfence_result r) {
    if (r != KEYFENCE_OK) raise_code(r);
}

// Runs `f` (a C call) without the GIL, so other Python threads run while
// keyfence computes; the result is checked once the GIL is back.
template <class F>
void nogil(F &&f) {
    keyfence_result r;
    {
        py::gil_scoped_release release;
        r = f();
    }
    check(r);
}

// ---------------------------------------------------------------------
// Arguments

// A read-only view of any contiguous bytes-like object (bytes, bytearray,
// memoryview, ...), held for the duration of a call: while the view is
// held, a bytearray cannot be resized under keyfence.
std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

class Bytes {
  public:
    Bytes(py::handle obj, const char *what) {
        if (PyUnicode_Check(obj.ptr()))
            raise_type(std::string(what) + " must be bytes-like, not str");
        if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) {
            PyErr_Clear();
            raise_type(std::string(what) + " must be a bytes-like object, not '" + type_name(obj) + "'");
        }
    }
    ~Bytes() { PyBuffer_Release(&view_); }
    Bytes(const Bytes &) = delete;
    Bytes &operator=(const Bytes &) = delete;
    const uint8_t *data() const { return static_cast<const uint8_t *>(view_.buf); }
    size_t size() const { return static_cast<size_t>(view_.len); }

  private:
    Py_buffer view_{};
};

// Text for a C string parameter: a str without NUL characters (a NUL would
// silently cut the text short in C).
std::string text(py::handle obj, const char *what) {
    if (!PyUnicode_Check(obj.ptr())) raise_type(std::string(what) + " must be str, not '" + type_name(obj) + "'");
    Py_ssize_t n = 0;
    const char *utf8 = PyUnicode_AsUTF8AndSize(obj.ptr(), &n);
    if (!utf8) {
        // A lone surrogate has no UTF-8 form.
        PyErr_Clear();
        raise_value(std::string(what) + " is not valid Unicode text (it holds a lone surrogate)");
    }
    std::string s(utf8, static_cast<size_t>(n));
    if (s.find('\0') != std::string::npos) raise_value(std::string(what) + " contains a NUL character");
    return s;
}

// A filesystem path: str or os.PathLike, as the C API's NUL-terminated text.
std::string path(py::handle obj, const char *what) {
    static py::handle fspath = py::module_::import("os").attr("fspath").cast<py::object>().release();
    static py::handle fsdecode = py::module_::import("os").attr("fsdecode").cast<py::object>().release();
    py::object p;
    try {
        p = fsdecode(fspath(obj));
    } catch (py::error_already_set &e) {
        if (!e.matches(PyExc_TypeError)) throw;
        raise_type(std::string(what) + " must be a str or os.PathLike path, not '" + type_name(obj) + "'");
    }
    return text(p, what);
}

// Appends `s` as a quoted word of the C API's attribute syntax, which
// carries any text (commas, '=', quotes, spaces) unchanged.
void quote(std::string &out, const std::string &s) {
    out.push_back('"');
    for (char c : s) {
        if (c == '"' || c == '\\') out.push_back('\\');
        out.push_back(c);
    }
    out.push_back('"');
}

// A Mapping[str, str] of attributes as the C API's `label=value,...` text.
std::string attributes(py::handle obj) {
    if (!PyMapping_Check(obj.ptr()) || PyUnicode_Check(obj.ptr()) || !py::hasattr(obj, "items"))
        raise_type("attributes must be a mapping of str to str, such as {\"region\": \"EU\"}, not '" + type_name(obj) +
                   "'");
    std::string out;
    for (py::handle item : obj.attr("items")()) {
        if (!PyTuple_Check(item.ptr()) || PyTuple_GET_SIZE(item.ptr()) != 2)
            raise_type("attributes.items() must give (label, value) pairs");
        py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
        if (!PyUnicode_Check(kv[0].ptr()) || !PyUnicode_Check(kv[1].ptr()))
            raise_type("attribute labels and values must be str");
        if (!out.empty()) out.push_back(',');
        quote(out, text(kv[0], "attribute label"));
        out.push_back('=');
        quote(out, text(kv[1], "attribute value"));
    }
    return out;
}

// ---------------------------------------------------------------------
// Results

// A keyfence_bytes the caller owns: freed (and wiped) when it goes.
struct Owned {
    keyfence_bytes b{nullptr, 0};
    Owned() = default;
    Owned(const Owned &) = delete;
    Owned &operator=(const Owned &) = delete;
    ~Owned() { keyfence_bytes_free(&b); }
    py::bytes to_bytes() const { return py::bytes(reinterpret_cast<const char *>(b.data), b.len); }
    py::str to_str() const { return py::str(reinterpret_cast<const char *>(b.data), b.len); }
};

// A C handle owned by a Python object.
template <class T, void (*Free)(T *)>
struct Handle {
    struct Deleter {
        void operator()(T *p) const { Free(p); }
    };
    std::unique_ptr<T, Deleter> h;
    T *get() const { return h.get(); }
};

// ---------------------------------------------------------------------
// policy

bool policy_check(py::handle policy, py::handle attrs) {
    std::string p = text(policy, "policy"), a = attributes(attrs);
    bool sat = false;
    nogil([&] { return keyfence_policy_check(p.c_str(), a.c_str(), &sat); });
    return sat;
}

py::str policy_canonical(py::handle policy) {
    std::string p = text(policy, "policy");
    Owned out;
    nogil([&] { return keyfence_policy_canonical(p.c_str(), &out.b); });
    return out.to_str();
}

// ---------------------------------------------------------------------
// abe

using PublicKey = Handle<keyfence_abe_public_key, keyfence_abe_public_key_free>;
using MasterSecretKey = Handle<keyfence_abe_master_key, keyfence_abe_master_key_free>;
using AttributeKey = Handle<keyfence_abe_attribute_key, keyfence_abe_attribute_key_free>;

py::tuple abe_setup() {
    keyfence_abe_public_key *pk = nullptr;
    keyfence_abe_master_key *msk = nullptr;
    nogil([&] { return keyfence_abe_setup(&pk, &msk); });
    PublicKey p;
    p.h.reset(pk);
    MasterSecretKey m;
    m.h.reset(msk);
    return py::make_tuple(std::move(p), std::move(m));
}

AttributeKey abe_keygen(const MasterSecretKey &msk, py::handle attrs) {
    std::string a = attributes(attrs);
    keyfence_abe_attribute_key *key = nullptr;
    nogil([&] { return keyfence_abe_keygen(msk.get(), a.c_str(), &key); });
    AttributeKey k;
    k.h.reset(key);
    return k;
}

py::bytes abe_encrypt(const PublicKey &pk, py::handle policy, py::handle message) {
    std::string p = text(policy, "policy");
    Bytes m(message, "message");
    Owned out;
    nogil([&] { return keyfence_abe_encrypt(pk.get(), p.c_str(), m.data(), m.size(), &out.b); });
    return out.to_bytes();
}

py::bytes abe_decrypt(const AttributeKey &key, py::handle ciphertext) {
    Bytes ct(ciphertext, "ciphertext");
    Owned out;
    nogil([&] { return keyfence_abe_decrypt(key.get(), ct.data(), ct.size(), &out.b); });
    return out.to_bytes();
}

bool abe_could_decrypt(py::handle attrs, py::handle ciphertext) {
    std::string a = attributes(attrs);
    Bytes ct(ciphertext, "ciphertext");
    bool could = false;
    nogil([&] { return keyfence_abe_could_decrypt(a.c_str(), ct.data(), ct.size(), &could); });
    return could;
}

py::str abe_policy_of(py::handle ciphertext) {
    Bytes ct(ciphertext, "ciphertext");
    Owned out;
    nogil([&] { return keyfence_abe_policy_of(ct.data(), ct.size(), &out.b); });
    return out.to_str();
}

// Binds from_bytes/to_bytes for one key type over its C functions.
template <class K, class CT>
void bind_key(py::module_ &m, const char *name, const char *doc,
              keyfence_result (*from)(const uint8_t *, size_t, CT **),
              keyfence_result (*to)(const CT *, keyfence_bytes *), bool secret) {
    py::class_<K>(m, name, doc)
        .def_static(
            "from_bytes",
            [from](py::handle b) {
                Bytes in(b, "data");
                CT *p = nullptr;
                nogil([&] { return from(in.data(), in.size(), &p); });
                K k;
                k.h.reset(p);
                return k;
            },
            py::arg("data"), "Loads the key from its CIRCL-compatible encoding; raises InvalidKey.")
        .def("to_bytes",
             [to](const K &k) {
                 Owned out;
                 nogil([&] { return to(k.get(), &out.b); });
                 return out.to_bytes();
             },
             "The key's CIRCL-compatible encoding (a secret for master and attribute keys).")
        .def("__repr__", [name, secret](const K &) {
            return std::string("<keyfence.abe.") + name + (secret ? " (secret)>" : ">");
        });
}

// ---------------------------------------------------------------------
// wrap

// An authority; its C handle needs exclusive use for wrap and rotation,
// and close() must not free it under another thread's call, hence the
// lock (taken without the GIL, so a waiting thread never blocks Python).
struct Authority {
    Handle<keyfence_authority, keyfence_authority_free> a;
    std::shared_mutex lock;

    // Runs `f(handle)` (a C call) without the GIL, holding the lock as
    // `Hold` (shared for reads, unique for writes); a closed authority is
    // InvalidArgument (it is this call's unusable `self`), a failed call
    // its exception.
    template <class Hold, class F>
    void call(F &&f) {
        keyfence_result r = KEYFENCE_OK;
        bool closed;
        {
            py::gil_scoped_release release;
            Hold hold(lock);
            closed = !a.get();
            if (!closed) r = f(a.get());
        }
        if (closed) raise_value("the authority is closed");
        check(r);
    }
};

std::unique_ptr<Authority> authority_make(py::handle store, bool create) {
    std::string dir = path(store, "store");
    keyfence_authority *out = nullptr;
    nogil([&] { return create ? keyfence_authority_init(dir.c_str(), &out) : keyfence_authority_open(dir.c_str(), &out); });
    auto a = std::make_unique<Authority>();
    a->a.h.reset(out);
    return a;
}

struct Machine {
    Handle<keyfence_machine, keyfence_machine_free> m;
};

// ---------------------------------------------------------------------
// sign

struct Engine {
    Handle<keyfence_engine, keyfence_engine_free> e;
    std::shared_mutex lock;  // shared by calls, exclusive for close()
};

using PrivateKey = Handle<keyfence_private_key, keyfence_key_free>;

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
using CompletionQueue = Handle<keyfence_completion_queue, keyfence_completion_queue_free>;
using Operation = Handle<keyfence_operation, keyfence_operation_free>;

std::unique_ptr<Engine> engine_new(py::list classes, uint32_t timeout_ms, bool isolated, py::object key_process) {
    keyfence_engine_config *cfg = nullptr;
    check(keyfence_engine_config_new(&cfg));
    Handle<keyfence_engine_config, keyfence_engine_config_free> config;
    config.h.reset(cfg);
    for (py::handle c : classes) {
        auto t = c.cast<std::tuple<uint32_t, uint32_t, uint32_t>>();
        check(keyfence_engine_config_set_class(cfg, std::get<0>(t), std::get<1>(t), std::get<2>(t)));
    }
    if (timeout_ms) check(keyfence_engine_config_set_timeout_ms(cfg, timeout_ms));
    std::optional<std::string> keyd;
    if (!key_process.is_none()) keyd = path(key_process, "key_process");
    if (isolated) check(keyfence_engine_config_set_isolated(cfg, keyd ? keyd->c_str() : nullptr));
    keyfence_engine *out = nullptr;
    nogil([&] { return keyfence_engine_new(cfg, &out); });
    auto e = std::make_unique<Engine>();
    e->e.h.reset(out);
    return e;
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
    keyfence_private_key *out = nullptr;
    if (engine) {
        keyfence_result r = KEYFENCE_OK;
        bool closed = false;
        {
            py::gil_scoped_release release;
            std::shared_lock<std::shared_mutex> hold(engine->lock);
            closed = !engine->e.get();
            if (!closed) r = keyfence_key_from_pem(engine->e.get(), data, len, &out);
        }
        if (closed) raise_shut_down("engine");
        check(r);
    } else {
        nogil([&] { return keyfence_key_from_pem(nullptr, data, len, &out); });
    }
    // Our copy of PEM text is a secret too.
    std::fill(pem_text.begin(), pem_text.end(), '\0');
    PrivateKey k;
    k.h.reset(out);
    return k;
}

// Runs load(e) with the engine's handle held for reading, e being nullptr
// without an engine; the caller has released the GIL. If the engine has
// been closed, load does not run, `closed` is set and the result is
// KEYFENCE_SHUT_DOWN.
template <class F>
keyfence_result with_engine(Engine *engine, bool &closed, F load) {
    std::shared_lock<std::shared_mutex> hold;
    keyfence_engine *e = nullptr;
    if (engine) {
        hold = std::shared_lock<std::shared_mutex>(engine->lock);
        e = engine->e.get();
        closed = !e;
    }
    return closed ? KEYFENCE_SHUT_DOWN : load(e);
}

// The key a loading call made, or its error raised (ShutDown for a closed
// engine).
PrivateKey loaded_key(bool closed, keyfence_result r, keyfence_private_key *out) {
    if (closed) raise_shut_down("engine");
    check(r);
    PrivateKey k;
    k.h.reset(out);
    return k;
}

// Opens an envelope holding a PEM/DER private key and loads it, without the
// key's bytes ever becoming a Python object.
PrivateKey key_from_envelope(const Machine &machine, py::handle envelope, py::handle engine_obj) {
    Engine *engine = engine_arg(engine_obj);
    Bytes env(envelope, "envelope");
    keyfence_private_key *out = nullptr;
    keyfence_result r;
    bool closed = false;
    {
        py::gil_scoped_release release;
        Owned secret;
        r = keyfence_machine_open(machine.m.get(), env.data(), env.size(), &secret.b);
        if (r == KEYFENCE_OK) {
            r = with_engine(engine, closed, [&](keyfence_engine *e) {
                return keyfence_key_from_pem(e, secret.b.data, secret.b.len, &out);
            });
        }
    }
    return loaded_key(closed, r, out);
}

// Loads the key an envelope holds with the machine key *file*: with an
// isolated engine its key process opens the envelope and this process reads
// only the machine key's public part; otherwise it is opened here.
PrivateKey key_load_envelope(py::handle store, py::handle machine_key, py::handle envelope, py::handle engine_obj) {
    Engine *engine = engine_arg(engine_obj);
    std::string dir = path(store, "store");
    std::string mk = path(machine_key, "machine_key");
    Bytes env(envelope, "envelope");
    keyfence_private_key *out = nullptr;
    keyfence_result r;
    bool closed = false;
    {
        py::gil_scoped_release release;
        r = with_engine(engine, closed, [&](keyfence_engine *e) {
            return keyfence_key_from_envelope(e, dir.c_str(), mk.c_str(), env.data(), env.size(), &out);
        });
    }
    return loaded_key(closed, r, out);
}

py::bytes engine_sign(Engine &engine, const PrivateKey &key, py::handle alg, py::handle data, uint32_t timeout_ms) {
    std::string a = text(alg, "algorithm");
    Bytes msg(data, "data");
    Owned sig;
    keyfence_result r;
    bool closed = false;
    {
        py::gil_scoped_release release;
        std::shared_lock<std::shared_mutex> hold(engine.lock);
        closed = !engine.e.get();
        r = closed ? KEYFENCE_SHUT_DOWN
                   : keyfence_engine_sign(engine.e.get(), key.get(), a.c_str(), msg.data(), msg.size(), timeout_ms, &sig.b);
    }
    if (closed) raise_shut_down("engine");
    check(r);
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
    keyfence_result r;
    {
        std::shared_lock<std::shared_mutex> hold(engine.lock, std::try_to_lock);
        if (!hold.owns_lock() || !engine.e.get()) raise_shut_down("engine");
        r = keyfence_engine_submit_to_queue(engine.e.get(), key.get(), a.c_str(), msg.data(), msg.size(), timeout_ms,
                                            queue.get(), reinterpret_cast<void *>(static_cast<uintptr_t>(token)), &op);
    }
    check(r);
    Operation o;
    o.h.reset(op);
    return o;
}

// Finished operations as (token, code, signature or None, message or None).
// ---------------------------------------------------------------------
// remote

struct RemoteSigner {
    Handle<keyfence_remote, keyfence_remote_free> r;
    std::shared_mutex lock;  // shared by calls, exclusive for close()

    // Runs `f` on the live handle without the GIL; a closed signer is
    // ShutDown, as a closed engine's operations are.
    template <class F>
    void call(F &&f) {
        keyfence_result r = KEYFENCE_OK;
        bool closed;
        {
            py::gil_scoped_release release;
            std::shared_lock<std::shared_mutex> hold(lock);
            closed = !this->r.get();
            if (!closed) r = f(this->r.get());
        }
        if (closed) raise_shut_down("remote signer");
        check(r);
    }
};

// Peers are (name, address, attributes, server_name or None) tuples: the
// Python layer turns its Peer named tuples into them.
std::unique_ptr<RemoteSigner> remote_new(py::list peers, py::handle cert, py::handle key, py::handle ca, uint64_t tenant,
                                         uint32_t connect_ms, uint32_t request_ms, uint32_t max_attempts) {
    std::string cert_path = path(cert, "cert"), key_path = path(key, "key"), ca_path = path(ca, "ca");
    keyfence_remote_config *cfg = nullptr;
    check(keyfence_remote_config_new(cert_path.c_str(), key_path.c_str(), ca_path.c_str(), &cfg));
    Handle<keyfence_remote_config, keyfence_remote_config_free> config;
    config.h.reset(cfg);
    for (py::handle p : peers) {
        auto t = p.cast<py::tuple>();
        std::string name = text(t[0], "peer name"), addr = text(t[1], "peer address"), attrs = attributes(t[2]);
        std::optional<std::string> server_name;
        if (!t[3].is_none()) server_name = text(t[3], "peer server_name");
        check(keyfence_remote_config_add_peer(cfg, name.c_str(), addr.c_str(), attrs.c_str(),
                                              server_name ? server_name->c_str() : nullptr));
    }
    check(keyfence_remote_config_set_tenant(cfg, tenant));
    check(keyfence_remote_config_set_limits(cfg, connect_ms, request_ms, max_attempts));
    keyfence_remote *out = nullptr;
    nogil([&] { return keyfence_remote_new(cfg, &out); });
    auto r = std::make_unique<RemoteSigner>();
    r->r.h.reset(out);
    return r;
}

PrivateKey remote_key(RemoteSigner &remote, py::handle envelope) {
    Bytes env(envelope, "envelope");
    keyfence_private_key *out = nullptr;
    remote.call([&](keyfence_remote *r) { return keyfence_remote_key(r, env.data(), env.size(), &out); });
    PrivateKey k;
    k.h.reset(out);
    return k;
}

PrivateKey remote_open_or_forward(RemoteSigner &remote, const Machine &machine, py::handle envelope) {
    Bytes env(envelope, "envelope");
    keyfence_private_key *out = nullptr;
    remote.call([&](keyfence_remote *r) {
        return keyfence_remote_open_or_forward(r, machine.m.get(), env.data(), env.size(), &out);
    });
    PrivateKey k;
    k.h.reset(out);
    return k;
}

py::list queue_drain(const CompletionQueue &queue, size_t max) {
    constexpr size_t chunk = 64;
    keyfence_completion done[chunk];
    py::list out;
    while (max > 0) {
        size_t n = 0;
        check(keyfence_completion_queue_drain(queue.get(), done, std::min(chunk, max), &n));
        for (size_t i = 0; i < n; i++) {
            keyfence_completion &c = done[i];
            py::object sig = py::none(), msg = py::none();
            if (c.result == KEYFENCE_OK)
                sig = py::bytes(reinterpret_cast<const char *>(c.signature.data), c.signature.len);
            else
                msg = py::str(reinterpret_cast<const char *>(c.message.data), c.message.len);
            keyfence_bytes_free(&c.signature);
            keyfence_bytes_free(&c.message);
            out.append(py::make_tuple(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(c.user_data)),
                                      static_cast<uint32_t>(c.result), sig, msg));
        }
        if (n < std::min(chunk, max)) break;
        max -= n;
    }
    return out;
}

py::dict engine_metrics(Engine &engine) {
    static const std::pair<const char *, uint32_t> classes[] = {
        {"rsa", KEYFENCE_CLASS_RSA}, {"ec", KEYFENCE_CLASS_EC}, {"slow", KEYFENCE_CLASS_SLOW}};
    py::dict out;
    for (auto [name, cls] : classes) {
        keyfence_class_metrics m{};
        {
            std::shared_lock<std::shared_mutex> hold(engine.lock);
            if (!engine.e.get()) raise_shut_down("engine");
            check(keyfence_engine_metrics(engine.e.get(), cls, &m));
        }
        py::dict d;
        d["workers"] = m.workers;
        d["queue_capacity"] = m.queue_capacity;
        d["queue_depth"] = m.queue_depth;
        d["in_flight"] = m.in_flight;
        d["submitted"] = m.submitted;
        d["completed"] = m.completed;
        d["errors"] = m.errors;
        d["overloaded"] = m.overloaded;
        d["timed_out"] = m.timed_out;
        d["p50_ns"] = m.p50_ns;
        d["p99_ns"] = m.p99_ns;
        d["p999_ns"] = m.p999_ns;
        out[name] = d;
    }
    return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "keyfence's native module (over the C ABI). Use the public modules: keyfence.abe, .policy, .wrap, .sign.";
    m.def("version", [] { return std::string(keyfence_version()); });
    m.def("result_name", [](uint32_t code) { return std::string(keyfence_result_name(code)); }, py::arg("code"));

    m.def("policy_check", &policy_check, py::arg("policy"), py::arg("attributes"));
    m.def("policy_canonical", &policy_canonical, py::arg("policy"));

    bind_key<PublicKey, keyfence_abe_public_key>(
        m, "PublicKey", "An authority's CP-ABE public key: what encryptors need.", keyfence_abe_public_key_from_bytes,
        keyfence_abe_public_key_to_bytes, false);
    bind_key<MasterSecretKey, keyfence_abe_master_key>(
        m, "MasterSecretKey", "An authority's master secret key: issues attribute keys. Wiped when freed.",
        keyfence_abe_master_key_from_bytes, keyfence_abe_master_key_to_bytes, true);
    bind_key<AttributeKey, keyfence_abe_attribute_key>(
        m, "AttributeKey", "An attribute key: decrypts what its attributes satisfy. Wiped when freed.",
        keyfence_abe_attribute_key_from_bytes, keyfence_abe_attribute_key_to_bytes, true);
    m.def("abe_setup", &abe_setup);
    m.def("abe_keygen", &abe_keygen, py::arg("msk"), py::arg("attributes"));
    m.def("abe_encrypt", &abe_encrypt, py::arg("pk"), py::arg("policy"), py::arg("message"));
    m.def("abe_decrypt", &abe_decrypt, py::arg("key"), py::arg("ciphertext"));
    m.def("abe_could_decrypt", &abe_could_decrypt, py::arg("attributes"), py::arg("ciphertext"));
    m.def("abe_policy_of", &abe_policy_of, py::arg("ciphertext"));

    py::class_<Authority>(m, "Authority", "An authority opened on a store directory.")
        .def_static("init", [](py::handle store) { return authority_make(store, true); }, py::arg("store"),
                    "Creates an authority, with its first master generation, in the store directory.\n\n"
                    "Raises AuthorityExists if the store holds one, StoreIOError if it cannot be written.")
        .def_static("open", [](py::handle store) { return authority_make(store, false); }, py::arg("store"),
                    "Opens the authority in the store directory.\n\n"
                    "Raises NoAuthority if the store holds none, StoreError if its state does not decode.")
        .def(
            "issue",
            [](Authority &a, py::handle attrs) {
                std::string t = attributes(attrs);
                Owned out;
                a.call<std::shared_lock<std::shared_mutex>>(
                    [&](keyfence_authority *h) { return keyfence_authority_issue(h, t.c_str(), &out.b); });
                return out.to_bytes();
            },
            py::arg("attributes"),
            "Issues a machine key (bytes, a secret: give it to that machine only) for a mapping of "
            "attributes: one attribute key per live master generation.\n\n"
            "Raises InvalidAttributes, ReservedLabel, LimitExceeded, StoreError.")
        .def(
            "wrap",
            [](Authority &a, py::handle policy, py::handle secret) {
                std::string p = text(policy, "policy");
                Bytes s(secret, "secret");
                Owned out;
                a.call<std::unique_lock<std::shared_mutex>>([&](keyfence_authority *h) {
                    return keyfence_authority_wrap(h, p.c_str(), s.data(), s.size(), &out.b);
                });
                return out.to_bytes();
            },
            py::arg("policy"), py::arg("secret"),
            "Wraps a secret under a policy: an envelope (bytes) any machine whose attributes satisfy "
            "the policy can open.\n\n"
            "Raises PolicySyntaxError (with .position), LimitExceeded, StoreError.")
        .def("rotate_master",
             [](Authority &a) {
                 size_t n = 0;
                 a.call<std::unique_lock<std::shared_mutex>>(
                     [&](keyfence_authority *h) { return keyfence_authority_rotate_master(h, &n); });
                 return n;
             },
             "Rotates the master key: a new active generation, every policy key re-sealed under it "
             "(envelopes are never touched). Returns how many policy keys were re-sealed.")
        .def("close",
             [](Authority &a) {
                 py::gil_scoped_release release;
                 std::unique_lock<std::shared_mutex> hold(a.lock);
                 a.a.h.reset();
             },
             "Frees the authority and wipes its master keys; later calls raise InvalidArgument.")
        .def_property_readonly("closed", [](const Authority &a) { return a.a.get() == nullptr; })
        .def("__repr__", [](const Authority &a) {
            return std::string(a.a.get() ? "<keyfence.wrap.Authority>" : "<keyfence.wrap.Authority (closed)>");
        });

    py::class_<Machine>(m, "Machine", "A machine: its machine key and the store of sealed policy keys.")
        .def(py::init([](py::handle key, py::handle store) {
                 Bytes k(key, "machine_key");
                 std::string dir = path(store, "store");
                 keyfence_machine *out = nullptr;
                 nogil([&] { return keyfence_machine_new(k.data(), k.size(), dir.c_str(), &out); });
                 auto mc = std::make_unique<Machine>();
                 mc->m.h.reset(out);
                 return mc;
             }),
             py::arg("machine_key"), py::arg("store"),
             "A machine holding the machine key the authority issued it, reading sealed policy keys from "
             "the store directory.\n\nRaises InvalidKey if the machine key does not decode.")
        .def(
            "could_open",
            [](const Machine &mc, py::handle env) {
                Bytes e(env, "envelope");
                bool could = false;
                nogil([&] { return keyfence_machine_could_open(mc.m.get(), e.data(), e.size(), &could); });
                return could;
            },
            py::arg("envelope"),
            "Whether this machine could open the envelope, from its policy and the machine's attributes "
            "alone (no cryptography): to forward the request to a machine that can.\n\n"
            "Raises InvalidEnvelope if the bytes are not an envelope.")
        .def(
            "open",
            [](const Machine &mc, py::handle env) {
                Bytes e(env, "envelope");
                Owned out;
                nogil([&] { return keyfence_machine_open(mc.m.get(), e.data(), e.size(), &out.b); });
                return out.to_bytes();
            },
            py::arg("envelope"),
            "Opens the envelope and returns its secret. The first open under a policy decrypts its policy "
            "key with CP-ABE (milliseconds); later ones hit the cache.\n\n"
            "Raises PolicyNotSatisfied, RetiredGeneration, UnknownPolicyKey, InvalidEnvelope, StoreError.")
        .def("__repr__", [](const Machine &) { return std::string("<keyfence.wrap.Machine (secret)>"); });

    py::class_<Engine>(m, "Engine", "A signing engine (see keyfence.sign.Engine).")
        .def(py::init(&engine_new), py::arg("classes"), py::arg("timeout_ms"), py::arg("isolated"),
             py::arg("key_process"))
        .def("sign", &engine_sign, py::arg("key"), py::arg("algorithm"), py::arg("data"), py::arg("timeout_ms"))
        .def("submit", &engine_submit, py::arg("key"), py::arg("algorithm"), py::arg("data"), py::arg("timeout_ms"),
             py::arg("queue"), py::arg("token"))
        .def("metrics", &engine_metrics)
        .def("metrics_prometheus",
             [](Engine &e) {
                 Owned out;
                 keyfence_result r = KEYFENCE_OK;
                 bool closed;
                 {
                     py::gil_scoped_release release;
                     std::shared_lock<std::shared_mutex> hold(e.lock);
                     closed = !e.e.get();
                     if (!closed) r = keyfence_engine_metrics_prometheus(e.e.get(), &out.b);
                 }
                 if (closed) raise_shut_down("engine");
                 check(r);
                 return out.to_str();
             })
        .def("attach_remote",
             [](Engine &e, RemoteSigner &remote) {
                 // A closed engine is reported as such, with a message: the
                 // C library was never called, so it has none to give.
                 bool engine_closed = false;
                 remote.call([&](keyfence_remote *r) {
                     std::shared_lock<std::shared_mutex> hold(e.lock);
                     engine_closed = !e.e.get();
                     return engine_closed ? KEYFENCE_OK : keyfence_engine_attach_remote(e.e.get(), r);
                 });
                 if (engine_closed) raise_shut_down("engine");
             },
             py::arg("remote"))
        .def("close",
             [](Engine &e) {
                 py::gil_scoped_release release;
                 std::unique_lock<std::shared_mutex> hold(e.lock);
                 e.e.h.reset();
             })
        .def_property_readonly("closed", [](const Engine &e) { return e.e.get() == nullptr; });

    py::class_<PrivateKey>(m, "PrivateKey", "A private key, in this process or held by an isolated key process.")
        .def_static("from_pem", &key_from_pem, py::arg("pem"), py::arg("engine") = py::none(),
                    "Loads a private key from PEM (bytes or str) or DER: RSA 2048-4096, ECDSA P-256/P-384, "
                    "Ed25519. With an isolated engine the key goes to its key process.\n\n"
                    "Raises InvalidPrivateKey (what is wrong with it, never its contents), BackendFailed.")
        .def_static("from_envelope", &key_from_envelope, py::arg("machine"), py::arg("envelope"),
                    py::arg("engine") = py::none(),
                    "Opens an envelope holding a private key with a Machine and loads the key, without its "
                    "bytes ever becoming a Python object.\n\nRaises as Machine.open and from_pem.")
        .def_static("load_envelope", &key_load_envelope, py::arg("store"), py::arg("machine_key"), py::arg("envelope"),
                    py::kw_only(), py::arg("engine") = py::none(),
                    "Loads the private key an envelope holds, opened with the machine key file machine_key "
                    "against the store folder. With an isolated engine its key process opens the envelope and "
                    "keeps the key: this process reads only the machine key's public part, so neither the "
                    "machine key's secret nor the private key is ever here. Otherwise it is opened here.\n\n"
                    "Raises ResourceError (the machine key file cannot be read), and as Machine.open and from_pem.")
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

    py::class_<RemoteSigner>(m, "RemoteSigner", "A client of remote key servers (see keyfence.sign.RemoteSigner).")
        .def(py::init(&remote_new), py::arg("peers"), py::arg("cert"), py::arg("key"), py::arg("ca"), py::arg("tenant"),
             py::arg("connect_ms"), py::arg("request_ms"), py::arg("max_attempts"))
        .def("key", &remote_key, py::arg("envelope"))
        .def("open_or_forward", &remote_open_or_forward, py::arg("machine"), py::arg("envelope"))
        .def("metrics",
             [](RemoteSigner &remote) {
                 Owned out;
                 remote.call([&](keyfence_remote *r) { return keyfence_remote_metrics_prometheus(r, &out.b); });
                 return out.to_str();
             })
        .def("close",
             [](RemoteSigner &remote) {
                 py::gil_scoped_release release;
                 std::unique_lock<std::shared_mutex> hold(remote.lock);
                 remote.r.h.reset();
             })
        .def_property_readonly("closed", [](const RemoteSigner &r) { return r.r.get() == nullptr; })
        .def("__repr__", [](const RemoteSigner &) { return std::string("<keyfence.sign.RemoteSigner>"); });

    py::class_<CompletionQueue>(m, "CompletionQueue", "Where finished operations wait; its fd is readable then.")
        .def(py::init([] {
            keyfence_completion_queue *q = nullptr;
            check(keyfence_completion_queue_new(&q));
            CompletionQueue c;
            c.h.reset(q);
            return c;
        }))
        .def("fileno", [](const CompletionQueue &q) { return keyfence_completion_queue_fd(q.get()); })
        .def("drain", &queue_drain, py::arg("max") = 1024);

    py::class_<Operation>(m, "Operation", "A submitted operation, for cancelling it.")
        .def_property_readonly("id", [](const Operation &o) { return keyfence_operation_id(o.get()); })
        .def("cancel", [](const Operation &o) {
            bool cancelled = false;
            check(keyfence_operation_cancel(o.get(), &cancelled));
            return cancelled;
        });
}
