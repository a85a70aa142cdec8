/* Signatures: OpenSSL's digest-sign calls gather the message; the
 * signature itself is made by keyfence's engine, which is given the
 * message and the algorithm's name (docs/signing.md). TLS signs with
 * EVP_DigestSign, so only the digest-sign entry points are offered:
 * keyfence signs messages, never a digest computed elsewhere. */
#include "provider.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/core_names.h>
#include <openssl/params.h>
#include <openssl/rsa.h>

#include "sign_wait.h"

typedef struct {
    kf_prov *prov;
    int type;
    kf_key *key;
    char md[32];    /* "" when the caller named none */
    char mgf1[32];  /* "" follows md */
    int pad;        /* RSA_PKCS1_PADDING or RSA_PKCS1_PSS_PADDING */
    int saltlen;    /* RSA_PSS_SALTLEN_DIGEST (-1) or a byte count */
    unsigned char *buf;
    size_t len, cap;
} sig_ctx;

static void *newctx(void *provctx, int type) {
    sig_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL) return NULL;
    c->prov = provctx;
    c->type = type;
    c->pad = RSA_PKCS1_PADDING;
    c->saltlen = RSA_PSS_SALTLEN_DIGEST;
    return c;
}
static void *newctx_ec(void *provctx, const char *propq) { (void)propq; return newctx(provctx, KF_EC); }
static void *newctx_rsa(void *provctx, const char *propq) { (void)propq; return newctx(provctx, KF_RSA); }
static void *newctx_ed(void *provctx, const char *propq) { (void)propq; return newctx(provctx, KF_ED25519); }

static void freectx(void *vc) {
    sig_ctx *c = vc;
    if (c == NULL) return;
    if (c->buf != NULL) OPENSSL_cleanse(c->buf, c->cap);
    free(c->buf);
    free(c);
}

static void *dupctx(void *vc) {
    sig_ctx *c = vc, *d = malloc(sizeof(*d));
    if (d == NULL) return NULL;
    *d = *c;
    d->buf = NULL;
    d->len = d->cap = 0;
    if (c->len > 0) {
        d->buf = malloc(c->len);
        if (d->buf == NULL) {
            free(d);
            return NULL;
        }
        memcpy(d->buf, c->buf, c->len);
        d->len = d->cap = c->len;
    }
    return d;
}

/* OpenSSL names digests several ways (SHA256, SHA2-256, sha256). */
static int md_bits(const char *md) {
    if (md[0] == 0) return 0;
    if (strcasecmp(md, "SHA256") == 0 || strcasecmp(md, "SHA2-256") == 0 || strcasecmp(md, "SHA-256") == 0)
        return 256;
    if (strcasecmp(md, "SHA384") == 0 || strcasecmp(md, "SHA2-384") == 0 || strcasecmp(md, "SHA-384") == 0)
        return 384;
    if (strcasecmp(md, "SHA512") == 0 || strcasecmp(md, "SHA2-512") == 0 || strcasecmp(md, "SHA-512") == 0)
        return 512;
    return -1;
}

static int set_text(char *dst, size_t cap, const OSSL_PARAM *p) {
    const char *s = NULL;
    if (!OSSL_PARAM_get_utf8_string_ptr(p, &s) || strlen(s) >= cap) return 0;
    strcpy(dst, s);
    return 1;
}

static int set_ctx_params(void *vc, const OSSL_PARAM params[]) {
    sig_ctx *c = vc;
    const OSSL_PARAM *p;
    if (params == NULL) return 1;
    if ((p = OSSL_PARAM_locate_const(params, OSSL_SIGNATURE_PARAM_DIGEST)) != NULL &&
        !set_text(c->md, sizeof(c->md), p))
        return 0;
    if ((p = OSSL_PARAM_locate_const(params, OSSL_SIGNATURE_PARAM_MGF1_DIGEST)) != NULL &&
        !set_text(c->mgf1, sizeof(c->mgf1), p))
        return 0;
    if ((p = OSSL_PARAM_locate_const(params, OSSL_SIGNATURE_PARAM_PAD_MODE)) != NULL) {
        if (p->data_type == OSSL_PARAM_UTF8_STRING) {
            const char *s = NULL;
            if (!OSSL_PARAM_get_utf8_string_ptr(p, &s)) return 0;
            if (strcmp(s, OSSL_PKEY_RSA_PAD_MODE_PKCSV15) == 0) c->pad = RSA_PKCS1_PADDING;
            else if (strcmp(s, OSSL_PKEY_RSA_PAD_MODE_PSS) == 0) c->pad = RSA_PKCS1_PSS_PADDING;
            else c->pad = -1;
        } else if (!OSSL_PARAM_get_int(p, &c->pad)) {
            return 0;
        }
        if (c->pad != RSA_PKCS1_PADDING && c->pad != RSA_PKCS1_PSS_PADDING) {
            kf_raise(c->prov, KF_R_UNSUPPORTED, "RSA padding %d (keyfence signs with PKCS#1 v1.5 or PSS)", c->pad);
            return 0;
        }
    }
    if ((p = OSSL_PARAM_locate_const(params, OSSL_SIGNATURE_PARAM_PSS_SALTLEN)) != NULL) {
        if (p->data_type == OSSL_PARAM_UTF8_STRING) {
            const char *s = NULL;
            if (!OSSL_PARAM_get_utf8_string_ptr(p, &s)) return 0;
            if (strcmp(s, OSSL_PKEY_RSA_PSS_SALT_LEN_DIGEST) == 0) c->saltlen = RSA_PSS_SALTLEN_DIGEST;
            else if (strcmp(s, OSSL_PKEY_RSA_PSS_SALT_LEN_MAX) == 0) c->saltlen = RSA_PSS_SALTLEN_MAX;
            else if (strcmp(s, OSSL_PKEY_RSA_PSS_SALT_LEN_AUTO) == 0) c->saltlen = RSA_PSS_SALTLEN_AUTO;
            else c->saltlen = atoi(s);
        } else if (!OSSL_PARAM_get_int(p, &c->saltlen)) {
            return 0;
        }
    }
    return 1;
}

static const OSSL_PARAM *settable_ctx_params(void *vc, void *provctx) {
    (void)vc;
    (void)provctx;
    static const OSSL_PARAM p[] = {
        OSSL_PARAM_utf8_string(OSSL_SIGNATURE_PARAM_DIGEST, NULL, 0),
        OSSL_PARAM_utf8_string(OSSL_SIGNATURE_PARAM_PAD_MODE, NULL, 0),
        OSSL_PARAM_utf8_string(OSSL_SIGNATURE_PARAM_MGF1_DIGEST, NULL, 0),
        OSSL_PARAM_utf8_string(OSSL_SIGNATURE_PARAM_PSS_SALTLEN, NULL, 0),
        OSSL_PARAM_END,
    };
    return p;
}

static const char *alg_name(sig_ctx *c);

/* The DER AlgorithmIdentifier of each algorithm keyfence signs with, as
 * a certificate, a request or a CRL names it (RFC 5758, RFC 4055, RFC
 * 8410). OpenSSL's ASN1_item_sign_ctx copies it into what it signs; a
 * provider key has no ASN.1 method to make it from. */
static const unsigned char aid_ecdsa_sha256[] = {0x30, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02};
static const unsigned char aid_ecdsa_sha384[] = {0x30, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03};
static const unsigned char aid_ed25519[] = {0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70};
/* sha{256,384,512}WithRSAEncryption: 1.2.840.113549.1.1.{11,12,13}, NULL
 * parameters. The byte at [12] is the last arc. */
static const unsigned char aid_rsa_pkcs1[] = {0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86,
                                              0xf7, 0x0d, 0x01, 0x01, 0x0b, 0x05, 0x00};
/* id-RSASSA-PSS with RSASSA-PSS-params {hash, MGF1 with the same hash,
 * salt the hash's length, trailer 1 (the default, left out)}. The last
 * arcs of both hash OIDs (2.16.840.1.101.3.4.2.{1,2,3}) and the salt are
 * filled in at the offsets below; the tests compare the result with the
 * AlgorithmIdentifier OpenSSL writes for a PEM key. */
enum { PSS_HASH_ARC = 29, PSS_MGF1_HASH_ARC = 59, PSS_SALT = 66 };
static const unsigned char aid_rsa_pss[] = {
    0x30, 0x41, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a, /* id-RSASSA-PSS */
    0x30, 0x34,                                                                   /* params */
    0xa0, 0x0f, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00,
    0xa1, 0x1c, 0x30, 0x1a, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x08, /* MGF1 */
    0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00,
    0xa2, 0x03, 0x02, 0x01, 0x20,
};

/* Sets `p` to the AlgorithmIdentifier of `alg` (keyfence's name). */
static int set_algorithm_id(sig_ctx *c, OSSL_PARAM *p, const char *alg) {
    unsigned char der[sizeof(aid_rsa_pss)];
    size_t n;
    int bits = strstr(alg, "sha384") != NULL ? 384 : strstr(alg, "sha512") != NULL ? 512 : 256;
    if (strcmp(alg, "ed25519") == 0) {
        memcpy(der, aid_ed25519, n = sizeof(aid_ed25519));
    } else if (strncmp(alg, "ecdsa-", 6) == 0) {
        memcpy(der, bits == 384 ? aid_ecdsa_sha384 : aid_ecdsa_sha256, n = sizeof(aid_ecdsa_sha256));
    } else if (strncmp(alg, "rsa-pkcs1-", 10) == 0) {
        memcpy(der, aid_rsa_pkcs1, n = sizeof(aid_rsa_pkcs1));
        der[12] = bits == 256 ? 0x0b : bits == 384 ? 0x0c : 0x0d;
    } else if (strncmp(alg, "rsa-pss-", 8) == 0) {
        memcpy(der, aid_rsa_pss, n = sizeof(aid_rsa_pss));
        der[PSS_HASH_ARC] = der[PSS_MGF1_HASH_ARC] = bits == 256 ? 0x01 : bits == 384 ? 0x02 : 0x03;
        der[PSS_SALT] = (unsigned char)(bits / 8);
    } else {
        kf_raise(c->prov, KF_R_UNSUPPORTED, "no AlgorithmIdentifier for %s", alg);
        return 0;
    }
    return OSSL_PARAM_set_octet_string(p, der, n);
}

static int get_ctx_params(void *vc, OSSL_PARAM params[]) {
    sig_ctx *c = vc;
    OSSL_PARAM *p;
    if ((p = OSSL_PARAM_locate(params, OSSL_SIGNATURE_PARAM_ALGORITHM_ID)) != NULL) {
        /* Only a context with a key knows its algorithm; unset, the
         * caller sees the parameter unanswered (return_size untouched)
         * and refuses, as OpenSSL does for a key without one. */
        const char *alg = c->key != NULL ? alg_name(c) : NULL;
        if (c->key != NULL && (alg == NULL || !set_algorithm_id(c, p, alg))) return 0;
    }
    if ((p = OSSL_PARAM_locate(params, OSSL_SIGNATURE_PARAM_DIGEST)) != NULL && !OSSL_PARAM_set_utf8_string(p, c->md))
        return 0;
    if ((p = OSSL_PARAM_locate(params, OSSL_SIGNATURE_PARAM_PAD_MODE)) != NULL) {
        if (p->data_type == OSSL_PARAM_UTF8_STRING) {
            if (!OSSL_PARAM_set_utf8_string(p, c->pad == RSA_PKCS1_PSS_PADDING ? OSSL_PKEY_RSA_PAD_MODE_PSS
                                                                                : OSSL_PKEY_RSA_PAD_MODE_PKCSV15))
                return 0;
        } else if (!OSSL_PARAM_set_int(p, c->pad)) {
            return 0;
        }
    }
    if ((p = OSSL_PARAM_locate(params, OSSL_SIGNATURE_PARAM_PSS_SALTLEN)) != NULL) {
        if (p->data_type == OSSL_PARAM_UTF8_STRING) {
            if (!OSSL_PARAM_set_utf8_string(p, OSSL_PKEY_RSA_PSS_SALT_LEN_DIGEST)) return 0;
        } else if (!OSSL_PARAM_set_int(p, c->saltlen)) {
            return 0;
        }
    }
    return 1;
}

static const OSSL_PARAM *gettable_ctx_params(void *vc, void *provctx) {
    (void)vc;
    (void)provctx;
    static const OSSL_PARAM p[] = {
        OSSL_PARAM_octet_string(OSSL_SIGNATURE_PARAM_ALGORITHM_ID, NULL, 0),
        OSSL_PARAM_utf8_string(OSSL_SIGNATURE_PARAM_DIGEST, NULL, 0),
        OSSL_PARAM_utf8_string(OSSL_SIGNATURE_PARAM_PAD_MODE, NULL, 0),
        OSSL_PARAM_utf8_string(OSSL_SIGNATURE_PARAM_PSS_SALTLEN, NULL, 0),
        OSSL_PARAM_END,
    };
    return p;
}

static int digest_sign_init(void *vc, const char *mdname, void *vkey, const OSSL_PARAM params[]) {
    sig_ctx *c = vc;
    kf_key *k = vkey;
    if (k != NULL) {
        if (k->type != c->type) return 0;
        c->key = k;
    }
    if (c->key == NULL) return 0;
    c->md[0] = 0;
    if (mdname != NULL && mdname[0] != 0) {
        if (strlen(mdname) >= sizeof(c->md)) return 0;
        strcpy(c->md, mdname);
    }
    c->len = 0;
    /* Refused here, a digest keyfence does not pair with the key is one
     * TLS does not choose: libssl tries EVP_DigestSignInit for each
     * signature algorithm it considers (EVP_PKEY_digestsign_supports_digest). */
    return set_ctx_params(c, params) && alg_name(c) != NULL;
}

static int digest_sign_update(void *vc, const unsigned char *data, size_t n) {
    sig_ctx *c = vc;
    if (n > c->cap - c->len) {
        size_t cap = c->cap ? c->cap : 256;
        while (cap - c->len < n) cap *= 2;
        unsigned char *b = malloc(cap);
        if (b == NULL) return 0;
        if (c->len > 0) memcpy(b, c->buf, c->len);
        if (c->buf != NULL) OPENSSL_cleanse(c->buf, c->cap);
        free(c->buf);
        c->buf = b;
        c->cap = cap;
    }
    if (n > 0) memcpy(c->buf + c->len, data, n);
    c->len += n;
    return 1;
}

/* keyfence's name for what the context asks, or NULL after raising. */
static const char *alg_name(sig_ctx *c) {
    kf_key *k = c->key;
    int bits = md_bits(c->md);
    if (bits < 0) {
        kf_raise(c->prov, KF_R_UNSUPPORTED, "digest %s (keyfence signs with SHA-256, SHA-384, SHA-512)", c->md);
        return NULL;
    }
    if (k->type == KF_ED25519) {
        if (bits != 0) {
            kf_raise(c->prov, KF_R_UNSUPPORTED, "Ed25519 takes no digest (%s asked)", c->md);
            return NULL;
        }
        return "ed25519";
    }
    if (k->type == KF_EC) {
        char group[64] = {0};
        size_t n = 0;
        if (!EVP_PKEY_get_utf8_string_param(k->pub, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof(group), &n)) group[0] = 0;
        int want = strcmp(group, "prime256v1") == 0 ? 256 : strcmp(group, "secp384r1") == 0 ? 384 : 0;
        if (want == 0) {
            kf_raise(c->prov, KF_R_UNSUPPORTED, "curve %s (keyfence signs on P-256 and P-384)", group);
            return NULL;
        }
        if (bits != 0 && bits != want) {
            kf_raise(c->prov, KF_R_UNSUPPORTED, "ECDSA on %s with %s (keyfence pairs P-256 with SHA-256, P-384 with SHA-384)",
                     group, c->md);
            return NULL;
        }
        return want == 256 ? "ecdsa-p256-sha256" : "ecdsa-p384-sha384";
    }
    if (bits == 0) bits = 256;
    if (c->pad == RSA_PKCS1_PSS_PADDING) {
        int mgf = c->mgf1[0] ? md_bits(c->mgf1) : bits;
        if (mgf != bits || (c->saltlen != RSA_PSS_SALTLEN_DIGEST && c->saltlen != bits / 8)) {
            kf_raise(c->prov, KF_R_UNSUPPORTED,
                     "RSA-PSS with MGF1 %s and salt %d (keyfence uses MGF1 with the message digest and a salt of its length)",
                     c->mgf1[0] ? c->mgf1 : c->md, c->saltlen);
            return NULL;
        }
        return bits == 256 ? "rsa-pss-sha256" : bits == 384 ? "rsa-pss-sha384" : "rsa-pss-sha512";
    }
    return bits == 256 ? "rsa-pkcs1-sha256" : bits == 384 ? "rsa-pkcs1-sha384" : "rsa-pkcs1-sha512";
}

static int sign_message(sig_ctx *c, unsigned char *sig, size_t *siglen, size_t sigsize, const unsigned char *msg,
                        size_t len) {
    size_t max = (size_t)EVP_PKEY_get_size(c->key->pub);
    if (sig == NULL) {
        *siglen = max;
        return 1;
    }
    const char *alg = alg_name(c);
    if (alg == NULL) return 0;
    keyfence_engine *engine = NULL;
    keyfence_private_key *h = kf_key_handle(c->key, &engine);
    if (h == NULL) {
        kf_log_last(c->prov, "a signature failed");
        return 0;
    }
    keyfence_bytes out = {0};
    if (!kf_sign_wait(c->prov, engine, h, alg, msg, len, &out)) {
        /* Apache logs a failed handshake only at LogLevel info. */
        kf_log_last(c->prov, "a signature failed");
        return 0;
    }
    int ok = out.len <= sigsize;
    if (ok) {
        memcpy(sig, out.data, out.len);
        *siglen = out.len;
    } else {
        kf_raise(c->prov, KF_R_SIGN_FAILED, "the signature (%zu bytes) does not fit the %zu bytes given", out.len,
                 sigsize);
    }
    keyfence_bytes_free(&out);
    return ok;
}

static int digest_sign_final(void *vc, unsigned char *sig, size_t *siglen, size_t sigsize) {
    sig_ctx *c = vc;
    if (c->key == NULL) return 0;
    return sign_message(c, sig, siglen, sigsize, c->buf, c->len);
}

static int digest_sign(void *vc, unsigned char *sig, size_t *siglen, size_t sigsize, const unsigned char *tbs,
                       size_t tbslen) {
    sig_ctx *c = vc;
    if (c->key == NULL) return 0;
    return sign_message(c, sig, siglen, sigsize, tbs, tbslen);
}

#define SIGNATURE(name, newfn)                                                                     \
    const OSSL_DISPATCH name[] = {                                                                \
        {OSSL_FUNC_SIGNATURE_NEWCTX, (void (*)(void))newfn},                                       \
        {OSSL_FUNC_SIGNATURE_FREECTX, (void (*)(void))freectx},                                    \
        {OSSL_FUNC_SIGNATURE_DUPCTX, (void (*)(void))dupctx},                                      \
        {OSSL_FUNC_SIGNATURE_DIGEST_SIGN_INIT, (void (*)(void))digest_sign_init},                  \
        {OSSL_FUNC_SIGNATURE_DIGEST_SIGN_UPDATE, (void (*)(void))digest_sign_update},              \
        {OSSL_FUNC_SIGNATURE_DIGEST_SIGN_FINAL, (void (*)(void))digest_sign_final},                \
        {OSSL_FUNC_SIGNATURE_DIGEST_SIGN, (void (*)(void))digest_sign},                            \
        {OSSL_FUNC_SIGNATURE_SET_CTX_PARAMS, (void (*)(void))set_ctx_params},                      \
        {OSSL_FUNC_SIGNATURE_SETTABLE_CTX_PARAMS, (void (*)(void))settable_ctx_params},            \
        {OSSL_FUNC_SIGNATURE_GET_CTX_PARAMS, (void (*)(void))get_ctx_params},                      \
        {OSSL_FUNC_SIGNATURE_GETTABLE_CTX_PARAMS, (void (*)(void))gettable_ctx_params},            \
        {0, NULL},                                                                                \
    }

SIGNATURE(kf_signature_ecdsa, newctx_ec);
SIGNATURE(kf_signature_rsa, newctx_rsa);
SIGNATURE(kf_signature_ed25519, newctx_ed);
