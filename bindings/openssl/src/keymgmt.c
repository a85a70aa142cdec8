/* Key management: keyfence keys as OpenSSL sees them. Everything about
 * the public half is answered by an ordinary public key of the default
 * provider held beside the key's location; only signing reaches the
 * private half, through keyfence's engine (signature.c). */
#include "provider.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/core_object.h>
#include <openssl/err.h>
#include <openssl/params.h>
#include <openssl/x509.h>

const char *kf_type_name(int type) {
    switch (type) {
    case KF_EC: return "EC";
    case KF_RSA: return "RSA";
    default: return "ED25519";
    }
}

int kf_key_pass(kf_key *key, int type, OSSL_CALLBACK *cb, void *cbarg) {
    int object_type = OSSL_OBJECT_PKEY;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_int(OSSL_OBJECT_PARAM_TYPE, &object_type),
        /* Constructed, so the type's length is counted. */
        OSSL_PARAM_construct_utf8_string(OSSL_OBJECT_PARAM_DATA_TYPE, (char *)kf_type_name(type), 0),
        OSSL_PARAM_construct_octet_string(OSSL_OBJECT_PARAM_REFERENCE, &key, sizeof(key)),
        OSSL_PARAM_construct_end(),
    };
    int ok = cb(params, cbarg);
    kf_key_free(key);
    return ok;
}

kf_key *kf_key_new(kf_prov *prov, int type) {
    kf_key *k = calloc(1, sizeof(*k));
    if (k == NULL) return NULL;
    k->refs = 1;
    k->prov = prov;
    k->type = type;
    pthread_mutex_init(&k->lock, NULL);
    return k;
}

void kf_key_free(kf_key *k) {
    if (k == NULL || __atomic_sub_fetch(&k->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    /* Handles made before a fork belong to the parent's engine. */
    if (k->pid == getpid()) {
        keyfence_key_free(k->handle);
        keyfence_remote_free(k->remote);
    }
    EVP_PKEY_free(k->pub);
    if (k->has_file) kf_keyfile_clear(&k->file);
    pthread_mutex_destroy(&k->lock);
    free(k);
}

static int type_of(const EVP_PKEY *pub) {
    if (EVP_PKEY_is_a(pub, "EC")) return KF_EC;
    if (EVP_PKEY_is_a(pub, "RSA")) return KF_RSA;
    if (EVP_PKEY_is_a(pub, "ED25519")) return KF_ED25519;
    return -1;
}

/* Opens (local) or reaches (remote) the private key for this process.
 * Called with k->lock held. */
static int open_handle(kf_key *k, keyfence_engine *engine) {
    kf_prov *prov = k->prov;
    keyfence_private_key *h = NULL;
    keyfence_remote *remote = NULL;
    keyfence_result r;
    const kf_keyfile *f = &k->file;
    if (f->mode == KF_MODE_LOCAL) {
        const char *store = f->store != NULL ? f->store : prov->store;
        const char *mk = f->machine_key != NULL ? f->machine_key : prov->machine_key;
        if (store == NULL || mk == NULL) {
            kf_raise(prov, KF_R_BAD_KEY_FILE,
                     "the key file names no %s and the provider's configuration gives none",
                     store == NULL ? "store" : "machine key");
            return 0;
        }
        r = keyfence_key_from_envelope(engine, store, mk, f->envelope, f->envelope_len, &h);
        if (r != KEYFENCE_OK) {
            kf_raise_keyfence(prov, KF_R_KEY_UNAVAILABLE, r, "cannot open the key's envelope");
            return 0;
        }
    } else if (f->mode == KF_MODE_PKCS11) {
        /* A token key: loaded where the engine keeps its keys (this
         * process, the key process when isolated, or the agent the file
         * names), which alone maps the token's module and reads its PIN. */
        r = keyfence_key_load_pkcs11(engine, f->pkcs11_uri, &h);
        if (r != KEYFENCE_OK) {
            kf_raise_keyfence(prov, KF_R_KEY_UNAVAILABLE, r, "cannot load the token's key");
            return 0;
        }
    } else if (f->mode == KF_MODE_AGENT) {
        /* The agent opens the envelope with its own machine key and
         * store: this process names neither. */
        r = keyfence_key_from_envelope(engine, NULL, NULL, f->envelope, f->envelope_len, &h);
        if (r != KEYFENCE_OK) {
            kf_raise_keyfence(prov, KF_R_KEY_UNAVAILABLE, r, "the key agent cannot load the key");
            return 0;
        }
    } else {
        keyfence_remote_config *cfg = NULL;
        r = keyfence_remote_config_new(f->tls_cert, f->tls_key, f->tls_ca, &cfg);
        for (size_t i = 0; r == KEYFENCE_OK && i < f->n_peers; i++)
            r = keyfence_remote_config_add_peer(cfg, f->peers[i].name, f->peers[i].addr, f->peers[i].attrs,
                                                f->peers[i].server_name);
        if (r == KEYFENCE_OK) r = keyfence_remote_new(cfg, &remote);
        keyfence_remote_config_free(cfg);
        if (r == KEYFENCE_OK) r = keyfence_remote_key(remote, f->envelope, f->envelope_len, &h);
        if (r != KEYFENCE_OK) {
            kf_raise_keyfence(prov, KF_R_KEY_UNAVAILABLE, r, "cannot reach the remote key");
            keyfence_remote_free(remote);
            return 0;
        }
    }
    /* The file's public key must be the key's: a certificate is matched
     * against the file's copy, and signing with another key would fail
     * only at the peer. */
    keyfence_bytes der = {0};
    r = keyfence_key_public_der(h, &der);
    bool same = r == KEYFENCE_OK && der.len == f->spki_len && memcmp(der.data, f->spki, der.len) == 0;
    keyfence_bytes_free(&der);
    if (!same) {
        kf_raise(prov, KF_R_BAD_KEY_FILE, "the key file's public key is not the public half of the key it names");
        keyfence_key_free(h);
        keyfence_remote_free(remote);
        return 0;
    }
    k->handle = h;
    k->remote = remote;
    k->pid = getpid();
    return 1;
}

keyfence_private_key *kf_key_handle(kf_key *k, keyfence_engine **engine) {
    if (!k->has_file) {
        kf_raise(k->prov, KF_R_PUBLIC_ONLY, "this %s key was made from public parameters", kf_type_name(k->type));
        return NULL;
    }
    keyfence_engine *e = k->file.agent_socket != NULL ? kf_agent_engine(k->prov, k->file.agent_socket) : kf_engine(k->prov);
    if (e == NULL) return NULL;
    keyfence_private_key *h = NULL;
    pthread_mutex_lock(&k->lock);
    if (k->handle == NULL || k->pid != getpid()) {
        k->handle = NULL; /* the parent's, see kf_key_free */
        k->remote = NULL;
        if (!open_handle(k, e)) goto out;
    }
    h = k->handle;
    *engine = e;
out:
    pthread_mutex_unlock(&k->lock);
    return h;
}

kf_key *kf_key_from_file(kf_prov *prov, kf_keyfile *file) {
    const unsigned char *p = file->spki;
    EVP_PKEY *pub = d2i_PUBKEY(NULL, &p, (long)file->spki_len);
    if (pub == NULL || p != file->spki + file->spki_len) {
        EVP_PKEY_free(pub);
        ERR_clear_error();
        kf_raise(prov, KF_R_BAD_KEY_FILE, "the key file's public key is not a DER SubjectPublicKeyInfo");
        kf_keyfile_clear(file);
        return NULL;
    }
    int type = type_of(pub);
    if (type < 0) {
        kf_raise(prov, KF_R_UNSUPPORTED, "keys of type %s are not supported (EC, RSA, Ed25519 are)",
                 EVP_PKEY_get0_type_name(pub));
        EVP_PKEY_free(pub);
        kf_keyfile_clear(file);
        return NULL;
    }
    kf_key *k = kf_key_new(prov, type);
    if (k == NULL) {
        EVP_PKEY_free(pub);
        kf_keyfile_clear(file);
        return NULL;
    }
    k->pub = pub;
    k->file = *file;
    k->has_file = true;
    memset(file, 0, sizeof(*file));
    keyfence_engine *e = NULL;
    if (kf_key_handle(k, &e) == NULL) {
        kf_key_free(k);
        return NULL;
    }
    return k;
}

/* ---- the keymgmt dispatch ---- */

static void *new_ec(void *provctx) { return kf_key_new(provctx, KF_EC); }
static void *new_rsa(void *provctx) { return kf_key_new(provctx, KF_RSA); }
static void *new_ed25519(void *provctx) { return kf_key_new(provctx, KF_ED25519); }

static void km_free(void *keydata) { kf_key_free(keydata); }

/* The decoder hands over its key by reference (its address); the
 * keymgmt takes a reference of its own, the decoder drops its one. */
static void *km_load(const void *reference, size_t reference_sz) {
    if (reference == NULL || reference_sz != sizeof(kf_key *)) return NULL;
    kf_key *k = *(kf_key *const *)reference;
    /* A key file whose key could not be used (see decoder.c): refused, so
     * that OpenSSL keeps the reason the decoder raised. */
    if (k == NULL) return NULL;
    __atomic_add_fetch(&k->refs, 1, __ATOMIC_ACQ_REL);
    return k;
}

static int km_has(const void *keydata, int selection) {
    const kf_key *k = keydata;
    if (k == NULL) return 0;
    if ((selection & OSSL_KEYMGMT_SELECT_PRIVATE_KEY) != 0 && !k->has_file) return 0;
    if ((selection & (OSSL_KEYMGMT_SELECT_PUBLIC_KEY | OSSL_KEYMGMT_SELECT_ALL_PARAMETERS)) != 0 && k->pub == NULL)
        return 0;
    return 1;
}

static int km_match(const void *a, const void *b, int selection) {
    (void)selection;
    const kf_key *x = a, *y = b;
    if (x->pub == NULL || y->pub == NULL) return 0;
    return EVP_PKEY_eq(x->pub, y->pub) == 1;
}

static int km_get_params(void *keydata, OSSL_PARAM params[]) {
    kf_key *k = keydata;
    if (k->pub == NULL) return 0;
    /* Ask the public key for each parameter it knows; the rest stay unset. */
    for (OSSL_PARAM *p = params; p->key != NULL; p++) {
        OSSL_PARAM one[2] = {*p, OSSL_PARAM_END};
        if (EVP_PKEY_get_params(k->pub, one)) *p = one[0];
    }
    ERR_clear_error();
    /* keyfence signs ECDSA with the curve's own digest (P-256 with SHA-256,
     * P-384 with SHA-384), where the default provider would say SHA-256
     * for every curve: `openssl req` and `x509 -CAkey` sign with the
     * digest this names unless told another. */
    OSSL_PARAM *d = OSSL_PARAM_locate(params, OSSL_PKEY_PARAM_DEFAULT_DIGEST);
    if (d != NULL && k->type == KF_EC) {
        char group[64] = {0};
        size_t n = 0;
        bool p384 = EVP_PKEY_get_utf8_string_param(k->pub, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof(group), &n) &&
                    strcmp(group, "secp384r1") == 0;
        if (!OSSL_PARAM_set_utf8_string(d, p384 ? "SHA384" : "SHA256")) return 0;
    }
    return 1;
}

static const OSSL_PARAM *km_gettable_params(void *provctx) {
    (void)provctx;
    static const OSSL_PARAM p[] = {
        OSSL_PARAM_int(OSSL_PKEY_PARAM_BITS, NULL),
        OSSL_PARAM_int(OSSL_PKEY_PARAM_SECURITY_BITS, NULL),
        OSSL_PARAM_int(OSSL_PKEY_PARAM_MAX_SIZE, NULL),
        OSSL_PARAM_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME, NULL, 0),
        OSSL_PARAM_utf8_string(OSSL_PKEY_PARAM_DEFAULT_DIGEST, NULL, 0),
        OSSL_PARAM_utf8_string(OSSL_PKEY_PARAM_MANDATORY_DIGEST, NULL, 0),
        OSSL_PARAM_octet_string(OSSL_PKEY_PARAM_ENCODED_PUBLIC_KEY, NULL, 0),
        OSSL_PARAM_octet_string(OSSL_PKEY_PARAM_PUB_KEY, NULL, 0),
        OSSL_PARAM_utf8_string(OSSL_PKEY_PARAM_EC_POINT_CONVERSION_FORMAT, NULL, 0),
        OSSL_PARAM_BN(OSSL_PKEY_PARAM_RSA_N, NULL, 0),
        OSSL_PARAM_BN(OSSL_PKEY_PARAM_RSA_E, NULL, 0),
        OSSL_PARAM_END,
    };
    return p;
}

/* Public parameters only: there is no private key here to give.
 *
 * There is no import: OpenSSL fetches a signature by name from any
 * provider and then imports the key into that provider's keymgmt. Were
 * ordinary keys importable here, keyfence's ECDSA and RSA would be chosen
 * for them too, and fail. Refusing the import sends OpenSSL back to the
 * key's own provider; matching a certificate against a keyfence key then
 * exports the keyfence key's public half to the default provider. */
static int km_export(void *keydata, int selection, OSSL_CALLBACK *cb, void *cbarg) {
    kf_key *k = keydata;
    /* Asked for the private key too (printing it, writing it to a file,
     * PKCS#12, or OpenSSL moving the key to another provider to sign
     * there), export nothing, and say why: a public half alone would pass
     * for the key and fail later. */
    if (k->pub != NULL && (selection & OSSL_KEYMGMT_SELECT_PRIVATE_KEY) != 0) {
        kf_raise(k->prov, KF_R_NO_EXPORT,
                 "the private half of a keyfence key never leaves where it is held (this process's engine, the key "
                 "process, the agent or the key servers): it cannot be printed, written or exported; its public half "
                 "can (openssl pkey -pubout)");
        return 0;
    }
    if (k->pub == NULL || (selection & OSSL_KEYMGMT_SELECT_PUBLIC_KEY) == 0) return 0;
    OSSL_PARAM *params = NULL;
    if (!EVP_PKEY_todata(k->pub, EVP_PKEY_PUBLIC_KEY, &params)) return 0;
    int ok = cb(params, cbarg);
    OSSL_PARAM_free(params);
    return ok;
}

static const OSSL_PARAM *km_types_ec(int selection) {
    (void)selection;
    static const OSSL_PARAM p[] = {
        OSSL_PARAM_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME, NULL, 0),
        OSSL_PARAM_octet_string(OSSL_PKEY_PARAM_PUB_KEY, NULL, 0),
        OSSL_PARAM_END,
    };
    return p;
}

static const OSSL_PARAM *km_types_rsa(int selection) {
    (void)selection;
    static const OSSL_PARAM p[] = {
        OSSL_PARAM_BN(OSSL_PKEY_PARAM_RSA_N, NULL, 0),
        OSSL_PARAM_BN(OSSL_PKEY_PARAM_RSA_E, NULL, 0),
        OSSL_PARAM_END,
    };
    return p;
}

static const OSSL_PARAM *km_types_ed25519(int selection) {
    (void)selection;
    static const OSSL_PARAM p[] = {
        OSSL_PARAM_octet_string(OSSL_PKEY_PARAM_PUB_KEY, NULL, 0),
        OSSL_PARAM_END,
    };
    return p;
}

static const char *query_ec(int op) { return op == OSSL_OP_SIGNATURE ? "ECDSA" : NULL; }
static const char *query_rsa(int op) { return op == OSSL_OP_SIGNATURE ? "RSA" : NULL; }
static const char *query_ed25519(int op) { return op == OSSL_OP_SIGNATURE ? "ED25519" : NULL; }

#define KEYMGMT(name, newfn, types, queryfn)                                                     \
    const OSSL_DISPATCH name[] = {                                                              \
        {OSSL_FUNC_KEYMGMT_NEW, (void (*)(void))newfn},                                          \
        {OSSL_FUNC_KEYMGMT_FREE, (void (*)(void))km_free},                                       \
        {OSSL_FUNC_KEYMGMT_LOAD, (void (*)(void))km_load},                                       \
        {OSSL_FUNC_KEYMGMT_HAS, (void (*)(void))km_has},                                         \
        {OSSL_FUNC_KEYMGMT_MATCH, (void (*)(void))km_match},                                     \
        {OSSL_FUNC_KEYMGMT_GET_PARAMS, (void (*)(void))km_get_params},                           \
        {OSSL_FUNC_KEYMGMT_GETTABLE_PARAMS, (void (*)(void))km_gettable_params},                 \
        {OSSL_FUNC_KEYMGMT_EXPORT, (void (*)(void))km_export},                                   \
        {OSSL_FUNC_KEYMGMT_EXPORT_TYPES, (void (*)(void))types},                                 \
        {OSSL_FUNC_KEYMGMT_QUERY_OPERATION_NAME, (void (*)(void))queryfn},                       \
        {0, NULL},                                                                              \
    }

KEYMGMT(kf_keymgmt_ec, new_ec, km_types_ec, query_ec);
KEYMGMT(kf_keymgmt_rsa, new_rsa, km_types_rsa, query_rsa);
KEYMGMT(kf_keymgmt_ed25519, new_ed25519, km_types_ed25519, query_ed25519);
