// keyfence._core: the native half of the Python package, a thin skin over
// keyfence's C ABI (bindings/c/include/keyfence.h). Behaviour lives in the
// Rust core; these files convert arguments, release the GIL around every
// call that does cryptography or I/O, and turn result codes into the
// exception classes of keyfence.exceptions (mapped there, in one place).
//
// This header holds what every area shares: errors, argument conversions,
// owned results and handles, and the one check of a closed object. Each
// area (policy, abe, wrap, sign, remote) binds its classes and functions
// in its own file; module.cpp puts them together.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "keyfence.h"

namespace kfpy {

namespace py = pybind11;

// ---------------------------------------------------------------------
// Errors

// Raises the exception class of `code` with `msg` (and a policy position).
// Every error the module raises goes through here or raise_type, so all of
// them are keyfence.KeyfenceError subclasses with a code and a message.
[[noreturn]] void raise_error(keyfence_result code, std::string msg, py::object position = py::none());

// Raises the Python exception for `code`, with the calling thread's last
// keyfence message. Must run on the thread that made the failing call,
// with the GIL held.
[[noreturn]] void raise_code(keyfence_result code);

// An argument of the wrong type: keyfence.InvalidArgumentType, which is
// both an InvalidArgument and a TypeError.
[[noreturn]] void raise_type(const std::string &msg);

// An argument of the right type but an unusable value.
[[noreturn]] void raise_value(const std::string &msg);

inline void check(keyfence_result r) {
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

std::string type_name(py::handle obj);

// A read-only view of any contiguous bytes-like object (bytes, bytearray,
// memoryview, ...), held for the duration of a call: while the view is
// held, a bytearray cannot be resized under keyfence.
class Bytes {
  public:
    Bytes(py::handle obj, const char *what);
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
std::string text(py::handle obj, const char *what);

// A filesystem path: str or os.PathLike, as the C API's NUL-terminated text.
std::string path(py::handle obj, const char *what);

// A Mapping[str, str] of attributes as the C API's (label, value) pairs,
// pointing into the mapping's str objects (kept alive here), so nothing
// is copied and nothing is quoted: keyfence checks the text itself.
class Attributes {
  public:
    explicit Attributes(py::handle mapping);
    const keyfence_attribute *data() const { return pairs_.data(); }
    size_t size() const { return pairs_.size(); }

  private:
    std::vector<py::object> keep_;
    std::vector<keyfence_attribute> pairs_;
};

// ---------------------------------------------------------------------
// Results and handles

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
    explicit Handle(T *p = nullptr) : h(p) {}
    T *get() const { return h.get(); }
};

// A C handle that close() may free while other threads use it. Calls hold
// the lock shared (or exclusive, for the calls that change the object)
// without the GIL, close() holds it exclusive; a call on a closed object
// raises `closed_code` with "the <what> is closed". The one place that
// check is written.
template <class T, void (*Free)(T *)>
class Closable {
  public:
    using Shared = std::shared_lock<std::shared_mutex>;
    using Unique = std::unique_lock<std::shared_mutex>;

    Closable(T *h, const char *what, keyfence_result closed_code) : h_(h), what_(what), closed_code_(closed_code) {}

    // Runs `f(handle)` without the GIL, holding the lock as `Hold`, then
    // raises what went wrong: closed, or the call's error.
    template <class Hold = Shared, class F>
    void call(F &&f) {
        keyfence_result r = KEYFENCE_OK;
        bool open;
        {
            py::gil_scoped_release release;
            open = run<Hold>(f, r);
        }
        finish(open, r);
    }

    // As call, keeping the GIL (for calls cheaper than releasing it): a
    // close() under way counts as closed, so this never waits.
    template <class F>
    void call_now(F &&f) {
        keyfence_result r = KEYFENCE_OK;
        bool open;
        {
            Shared hold(lock_, std::try_to_lock);
            open = hold.owns_lock() && h_.get();
            if (open) r = f(h_.get());
        }
        finish(open, r);
    }

    // Runs `f(handle)` into `r` with the lock held as `Hold`, touching
    // neither the GIL nor Python: false, and `f` not run, when closed.
    template <class Hold = Shared, class F>
    bool run(F &&f, keyfence_result &r) {
        Hold hold(lock_);
        if (!h_.get()) return false;
        r = f(h_.get());
        return true;
    }

    void finish(bool open, keyfence_result r) const {
        if (!open) raise_closed();
        check(r);
    }

    // The C library was never called, so it has no message to give: this
    // one says what is closed.
    [[noreturn]] void raise_closed() const { raise_error(closed_code_, std::string("the ") + what_ + " is closed"); }

    // Frees the handle once no call uses it; later calls raise.
    void close() {
        py::gil_scoped_release release;
        Unique hold(lock_);
        h_.h.reset();
    }

    bool closed() const { return !h_.get(); }

  private:
    Handle<T, Free> h_;
    std::shared_mutex lock_;
    const char *what_;
    keyfence_result closed_code_;
};

// ---------------------------------------------------------------------
// Types more than one area uses

// A closed authority is InvalidArgument (it is the call's unusable
// `self`); a closed engine or signer is ShutDown.
struct Authority : Closable<keyfence_authority, keyfence_authority_free> {
    explicit Authority(keyfence_authority *a) : Closable(a, "authority", KEYFENCE_INVALID_ARGUMENT) {}
};
struct Engine : Closable<keyfence_engine, keyfence_engine_free> {
    explicit Engine(keyfence_engine *e, bool agent = false)
        : Closable(e, "engine", KEYFENCE_SHUT_DOWN), agent(agent) {}
    // Whether its keys are in a key agent (made with agent=...): envelopes
    // then load without a store or machine key.
    const bool agent;
};
struct RemoteSigner : Closable<keyfence_remote, keyfence_remote_free> {
    explicit RemoteSigner(keyfence_remote *r) : Closable(r, "remote signer", KEYFENCE_SHUT_DOWN) {}
};
using Machine = Handle<keyfence_machine, keyfence_machine_free>;
using PrivateKey = Handle<keyfence_private_key, keyfence_key_free>;

// ---------------------------------------------------------------------
// Each area's bindings, in the order module.cpp registers them.

void bind_policy(py::module_ &m);
void bind_abe(py::module_ &m);
void bind_wrap(py::module_ &m);
void bind_sign(py::module_ &m);
void bind_remote(py::module_ &m);

}  // namespace kfpy
