// What every area of keyfence._core shares: errors and the conversion of
// arguments (see native.h).
#include "native.h"

#include <string_view>

namespace kfpy {

namespace {

// An attribute of keyfence.exceptions. Leaked on purpose: a static
// py::object would be released after the interpreter has finalized.
py::handle exceptions_attr(const char *name) {
    return py::module_::import("keyfence.exceptions").attr(name).cast<py::object>().release();
}

[[noreturn]] void raise_object(const py::object &exc) {
    PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(exc.ptr())), exc.ptr());
    throw py::error_already_set();
}

// The UTF-8 of a str, without copying: a view into the object's own cache,
// valid while the object lives. A lone surrogate has no UTF-8 form.
std::string_view utf8(py::handle obj, const char *what) {
    Py_ssize_t n = 0;
    const char *s = PyUnicode_AsUTF8AndSize(obj.ptr(), &n);
    if (!s) {
        PyErr_Clear();
        raise_value(std::string(what) + " is not valid Unicode text (it holds a lone surrogate)");
    }
    return std::string_view(s, static_cast<size_t>(n));
}

}  // namespace

[[noreturn]] void raise_error(keyfence_result code, std::string msg, py::object position) {
    // The C library sets a message with every failure; should one ever be
    // missing, the code's name still says what went wrong.
    if (msg.empty()) msg = std::string("keyfence error ") + keyfence_result_name(code);
    static py::handle from_code = exceptions_attr("_from_code");
    raise_object(from_code(static_cast<uint32_t>(code), py::str(msg), position));
}

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

[[noreturn]] void raise_type(const std::string &msg) {
    static py::handle cls = exceptions_attr("InvalidArgumentType");
    raise_object(cls(py::str(msg), py::arg("code") = "INVALID_ARGUMENT", py::arg("number") = 1));
}

[[noreturn]] void raise_value(const std::string &msg) { raise_error(KEYFENCE_INVALID_ARGUMENT, msg); }

std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

Bytes::Bytes(py::handle obj, const char *what) {
    if (PyUnicode_Check(obj.ptr())) raise_type(std::string(what) + " must be bytes-like, not str");
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        raise_type(std::string(what) + " must be a bytes-like object, not '" + type_name(obj) + "'");
    }
}

std::string text(py::handle obj, const char *what) {
    if (!PyUnicode_Check(obj.ptr())) raise_type(std::string(what) + " must be str, not '" + type_name(obj) + "'");
    std::string s(utf8(obj, what));
    if (s.find('\0') != std::string::npos) raise_value(std::string(what) + " contains a NUL character");
    return s;
}

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

Attributes::Attributes(py::handle obj) {
    if (!PyMapping_Check(obj.ptr()) || PyUnicode_Check(obj.ptr()) || !py::hasattr(obj, "items"))
        raise_type("attributes must be a mapping of str to str, such as {\"region\": \"EU\"}, not '" + type_name(obj) +
                   "'");
    for (py::handle item : obj.attr("items")()) {
        if (!PyTuple_Check(item.ptr()) || PyTuple_GET_SIZE(item.ptr()) != 2)
            raise_type("attributes.items() must give (label, value) pairs");
        py::tuple kv = py::reinterpret_borrow<py::tuple>(item);
        if (!PyUnicode_Check(kv[0].ptr()) || !PyUnicode_Check(kv[1].ptr()))
            raise_type("attribute labels and values must be str");
        // The pair holds its label and value alive, so the views stay valid.
        keep_.push_back(kv);
        std::string_view label = utf8(kv[0], "attribute label"), value = utf8(kv[1], "attribute value");
        pairs_.push_back(keyfence_attribute{label.data(), label.size(), value.data(), value.size()});
    }
}

}  // namespace kfpy
