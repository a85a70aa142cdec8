// keyfence.policy's native half: checking attributes against a policy, and
// a policy's canonical text.
#include "native.h"

namespace kfpy {

namespace {

bool policy_check(py::handle policy, py::handle attrs) {
    std::string p = text(policy, "policy");
    Attributes a(attrs);
    bool sat = false;
    nogil([&] { return keyfence_policy_check_pairs(p.c_str(), a.data(), a.size(), &sat); });
    return sat;
}

py::str policy_canonical(py::handle policy) {
    std::string p = text(policy, "policy");
    Owned out;
    nogil([&] { return keyfence_policy_canonical(p.c_str(), &out.b); });
    return out.to_str();
}

}  // namespace

void bind_policy(py::module_ &m) {
    m.def("policy_check", &policy_check, py::arg("policy"), py::arg("attributes"));
    m.def("policy_canonical", &policy_canonical, py::arg("policy"));
}

}  // namespace kfpy
