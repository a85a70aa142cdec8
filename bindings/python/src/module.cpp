// keyfence._core: the module, put together from each area's bindings
// (native.h says what they share).
#include "native.h"

PYBIND11_MODULE(_core, m) {
    namespace py = pybind11;
    m.doc() = "keyfence's native module (over the C ABI). Use the public modules: keyfence.abe, .policy, .wrap, .sign.";
    m.def("version", [] { return std::string(keyfence_version()); });
    m.def("result_name", [](uint32_t code) { return std::string(keyfence_result_name(code)); }, py::arg("code"));
    kfpy::bind_policy(m);
    kfpy::bind_abe(m);
    kfpy::bind_wrap(m);
    kfpy::bind_sign(m);
    kfpy::bind_remote(m);
}
