// keyfence.abe's native half: CP-ABE keys and ciphertexts in CIRCL's
// formats.
#include "native.h"

#include <utility>

namespace kfpy {

namespace {

using PublicKey = Handle<keyfence_abe_public_key, keyfence_abe_public_key_free>;
using MasterSecretKey = Handle<keyfence_abe_master_key, keyfence_abe_master_key_free>;
using AttributeKey = Handle<keyfence_abe_attribute_key, keyfence_abe_attribute_key_free>;

py::tuple abe_setup() {
    keyfence_abe_public_key *pk = nullptr;
    keyfence_abe_master_key *msk = nullptr;
    nogil([&] { return keyfence_abe_setup(&pk, &msk); });
    return py::make_tuple(PublicKey(pk), MasterSecretKey(msk));
}

AttributeKey abe_keygen(const MasterSecretKey &msk, py::handle attrs) {
    Attributes a(attrs);
    keyfence_abe_attribute_key *key = nullptr;
    nogil([&] { return keyfence_abe_keygen_pairs(msk.get(), a.data(), a.size(), &key); });
    return AttributeKey(key);
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
    Attributes a(attrs);
    Bytes ct(ciphertext, "ciphertext");
    bool could = false;
    nogil([&] { return keyfence_abe_could_decrypt_pairs(a.data(), a.size(), ct.data(), ct.size(), &could); });
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
                return K(p);
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

}  // namespace

void bind_abe(py::module_ &m) {
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
}

}  // namespace kfpy
