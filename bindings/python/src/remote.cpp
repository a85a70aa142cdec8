// The native half of keyfence.sign.RemoteSigner: a client of remote key
// servers whose keys are ordinary PrivateKey handles.
#include "native.h"

#include <optional>

namespace kfpy {

namespace {

// Peers are (name, address, attributes, server_name or None) tuples: the
// Python layer turns its Peer named tuples into them.
std::unique_ptr<RemoteSigner> remote_new(py::list peers, py::handle cert, py::handle key, py::handle ca, uint64_t tenant,
                                         uint32_t connect_ms, uint32_t request_ms, uint32_t max_attempts) {
    std::string cert_path = path(cert, "cert"), key_path = path(key, "key"), ca_path = path(ca, "ca");
    keyfence_remote_config *cfg = nullptr;
    check(keyfence_remote_config_new(cert_path.c_str(), key_path.c_str(), ca_path.c_str(), &cfg));
    Handle<keyfence_remote_config, keyfence_remote_config_free> config(cfg);
    for (py::handle p : peers) {
        auto t = p.cast<py::tuple>();
        std::string name = text(t[0], "peer name"), addr = text(t[1], "peer address");
        // A peer's attributes go in as text: keyfence writes it from the
        // pairs, quoting what needs it.
        Attributes pairs(t[2]);
        Owned attrs;
        check(keyfence_attributes_text(pairs.data(), pairs.size(), &attrs.b));
        std::optional<std::string> server_name;
        if (!t[3].is_none()) server_name = text(t[3], "peer server_name");
        check(keyfence_remote_config_add_peer(cfg, name.c_str(), addr.c_str(), reinterpret_cast<const char *>(attrs.b.data),
                                              server_name ? server_name->c_str() : nullptr));
    }
    check(keyfence_remote_config_set_tenant(cfg, tenant));
    check(keyfence_remote_config_set_limits(cfg, connect_ms, request_ms, max_attempts));
    keyfence_remote *out = nullptr;
    nogil([&] { return keyfence_remote_new(cfg, &out); });
    return std::make_unique<RemoteSigner>(out);
}

PrivateKey remote_key(RemoteSigner &remote, py::handle envelope) {
    Bytes env(envelope, "envelope");
    keyfence_private_key *out = nullptr;
    remote.call([&](keyfence_remote *r) { return keyfence_remote_key(r, env.data(), env.size(), &out); });
    return PrivateKey(out);
}

PrivateKey remote_open_or_forward(RemoteSigner &remote, const Machine &machine, py::handle envelope) {
    Bytes env(envelope, "envelope");
    keyfence_private_key *out = nullptr;
    remote.call([&](keyfence_remote *r) {
        return keyfence_remote_open_or_forward(r, machine.get(), env.data(), env.size(), &out);
    });
    return PrivateKey(out);
}

py::str remote_metrics(RemoteSigner &remote) {
    Owned out;
    remote.call([&](keyfence_remote *r) { return keyfence_remote_metrics_prometheus(r, &out.b); });
    return out.to_str();
}

}  // namespace

void bind_remote(py::module_ &m) {
    py::class_<RemoteSigner>(m, "RemoteSigner", "A client of remote key servers (see keyfence.sign.RemoteSigner).")
        .def(py::init(&remote_new), py::arg("peers"), py::arg("cert"), py::arg("key"), py::arg("ca"), py::arg("tenant"),
             py::arg("connect_ms"), py::arg("request_ms"), py::arg("max_attempts"))
        .def("key", &remote_key, py::arg("envelope"))
        .def("open_or_forward", &remote_open_or_forward, py::arg("machine"), py::arg("envelope"))
        .def("metrics", &remote_metrics)
        .def("close", &RemoteSigner::close)
        .def_property_readonly("closed", &RemoteSigner::closed)
        .def("__repr__", [](const RemoteSigner &) { return std::string("<keyfence.sign.RemoteSigner>"); });
}

}  // namespace kfpy
