/* The decoder: a KEYFENCE KEY PEM block becomes a keyfence key, so a
 * program that loads private keys with PEM_read_bio_PrivateKey or
 * SSL_CTX_use_PrivateKey_file loads keyfence keys unchanged. One decoder
 * per key type, as OpenSSL asks for; each answers only for its own type
 * and lets any other PEM block pass to the next decoder. */
#include "provider.h"

#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/core_object.h>
#include <openssl/err.h>
#include <openssl/params.h>
#include <openssl/pem.h>

static void *newctx(void *provctx) { return provctx; }
static void freectx(void *ctx) { (void)ctx; }

/* A key file is small; anything longer is not one. */
#define KF_MAX_INPUT (1 << 20)

/* Reads the input (through the core's BIO functions) into memory. */
static char *read_all(kf_prov *prov, OSSL_CORE_BIO *cin, size_t *out_n) {
    if (prov->bio_read_ex == NULL) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL) return 0;
    for (;;) {
        if (n == cap) {
            if (cap >= KF_MAX_INPUT) break;
            char *b = realloc(buf, cap * 2);
            if (b == NULL) break;
            buf = b;
            cap *= 2;
        }
        size_t got = 0;
        if (!prov->bio_read_ex(cin, buf + n, cap - n, &got) || got == 0) break;
        n += got;
    }
    *out_n = n;
    return buf;
}

/* The key file body: the input's KEYFENCE KEY block, which need not be
 * its first (HAProxy's crt files put the certificate before the key).
 * 0 when the input holds none. */
static int read_body(kf_prov *prov, OSSL_CORE_BIO *cin, unsigned char **data, long *len) {
    size_t n = 0;
    char *buf = read_all(prov, cin, &n);
    if (buf == NULL) return 0;
    int ok = kf_find_body(buf, n, data, len);
    free(buf);
    return ok;
}

int kf_find_body(const char *buf, size_t n, unsigned char **data, long *len) {
    BIO *mem = BIO_new_mem_buf(buf, (int)n);
    int ok = 0;
    /* Input that is no PEM at all is not an error of ours to report. */
    ERR_set_mark();
    while (mem != NULL && !ok) {
        char *name = NULL, *header = NULL;
        if (!PEM_read_bio(mem, &name, &header, data, len)) break;
        ok = strcmp(name, KF_PEM_LABEL) == 0;
        if (!ok) {
            OPENSSL_free(*data);
            *data = NULL;
        }
        OPENSSL_free(name);
        OPENSSL_free(header);
    }
    ERR_pop_to_mark();
    BIO_free(mem);
    return ok;
}

/* The body itself, as DER: what OpenSSL's own PEM decoder (pem2der)
 * passes on when a program reads a key file by its path through
 * OSSL_STORE (`openssl pkey -in file.kfk`, whose file: store decodes the
 * PEM block first). 0 unless it is a key file's body. */
static int read_der_body(kf_prov *prov, OSSL_CORE_BIO *cin, unsigned char **data, long *len) {
    size_t n = 0;
    char *buf = read_all(prov, cin, &n);
    if (buf == NULL) return 0;
    int ok = n > 5 && n < KF_MAX_INPUT && memcmp(buf, "KFKEY", 5) == 0;
    if (ok) {
        *data = OPENSSL_malloc(n);
        ok = *data != NULL;
        if (ok) memcpy(*data, buf, n);
        *len = (long)n;
    }
    free(buf);
    return ok;
}

static int decode(void *ctx, OSSL_CORE_BIO *cin, int selection, OSSL_CALLBACK *object_cb, void *object_cbarg,
                  int type, int der) {
    kf_prov *prov = ctx;
    if (selection != 0 && (selection & OSSL_KEYMGMT_SELECT_PRIVATE_KEY) == 0) return 1;
    unsigned char *data = NULL;
    long len = 0;
    /* Not a key file: another decoder's business. */
    if (!(der ? read_der_body(prov, cin, &data, &len) : read_body(prov, cin, &data, &len))) return 1;
    int ret = 1;
    kf_keyfile file;
    char err[256];
    if (kf_keyfile_parse(data, (size_t)len, &file, err, sizeof(err)) != 0) {
        kf_raise(prov, KF_R_BAD_KEY_FILE, "%s", err);
        /* From a PEM block it is a key file, damaged. (DER input may be
         * another program's guess: mod_ssl decodes a key file's text as
         * base64 after its PEM read failed; the block, checked in
         * decode_pem_to_der, said what was wrong.) */
        if (!der) kf_log_last(prov, "bad keyfence key file");
        ret = 0;
        goto out;
    }
    /* The type is in the public key: look before opening anything. */
    const unsigned char *p = file.spki;
    /* A public key that does not decode is reported by kf_key_from_file;
     * what d2i says about it, and only that, is dropped here (never the
     * caller's errors). */
    ERR_set_mark();
    EVP_PKEY *pub = d2i_PUBKEY(NULL, &p, (long)file.spki_len);
    int file_type = pub == NULL ? -1
                    : EVP_PKEY_is_a(pub, "EC") ? KF_EC
                    : EVP_PKEY_is_a(pub, "RSA") ? KF_RSA
                    : EVP_PKEY_is_a(pub, "ED25519") ? KF_ED25519
                                                    : -2;
    EVP_PKEY_free(pub);
    ERR_pop_to_mark();
    if (file_type >= 0 && file_type != type) {
        kf_keyfile_clear(&file);
        goto out; /* the decoder of its own type answers */
    }
    /* Wrong public keys are refused by kf_key_from_file with a reason;
     * the EC decoder speaks for them, so they are refused once. */
    if (file_type < 0 && type != KF_EC) {
        kf_keyfile_clear(&file);
        goto out;
    }
    /* A key file that reads but whose key cannot be used (an agent down, a
     * policy not satisfied) is passed on as a reference to no key, which
     * the keymgmt refuses to load: OpenSSL then keeps the reason raised
     * here as a hard error, where a plain decode failure would be dropped
     * on the way through OSSL_STORE (a key file read by its path). */
    kf_key *key = kf_key_from_file(prov, &file);
    /* Some programs drop or never show the reason (Apache, stunnel 5.68):
     * it is written where the provider logs, too. */
    if (key == NULL) kf_log_last(prov, "a keyfence key cannot be used");
    ret = kf_key_pass(key, type, object_cb, object_cbarg);
out:
    OPENSSL_free(data);
    return ret;
}

#define DECODE_FN(fname, type, der)                                                                 \
    static int fname(void *ctx, OSSL_CORE_BIO *cin, int selection, OSSL_CALLBACK *cb, void *cbarg,         \
                     OSSL_PASSPHRASE_CALLBACK *pw_cb, void *pw_cbarg) {                                     \
        (void)pw_cb;                                                                                        \
        (void)pw_cbarg;                                                                                     \
        return decode(ctx, cin, selection, cb, cbarg, type, der);                                           \
    }

DECODE_FN(decode_ec_pem, KF_EC, 0)
DECODE_FN(decode_rsa_pem, KF_RSA, 0)
DECODE_FN(decode_ed25519_pem, KF_ED25519, 0)
DECODE_FN(decode_ec_der, KF_EC, 1)
DECODE_FN(decode_rsa_der, KF_RSA, 1)
DECODE_FN(decode_ed25519_der, KF_ED25519, 1)

/* A KEYFENCE KEY PEM block becomes its body, as DER: OpenSSL's own PEM
 * decoder passes no PEM label it does not know, so this is how a key
 * file read by its plain path through OSSL_STORE's file: scheme (`openssl
 * pkey -in x.kfk`, `-key x.kfk`) reaches the DER decoders above. */
static int decode_pem_to_der(void *ctx, OSSL_CORE_BIO *cin, int selection, OSSL_CALLBACK *cb, void *cbarg,
                             OSSL_PASSPHRASE_CALLBACK *pw_cb, void *pw_cbarg) {
    (void)selection;
    (void)pw_cb;
    (void)pw_cbarg;
    unsigned char *data = NULL;
    long len = 0;
    if (!read_body(ctx, cin, &data, &len)) return 1;
    /* A block whose body is no key file body is left to the PEM decoder,
     * which says so; one that is damaged is refused here, with the reason
     * (OSSL_STORE would drop the DER decoders' error). */
    if (len < 5 || memcmp(data, "KFKEY", 5) != 0) {
        OPENSSL_free(data);
        return 1;
    }
    kf_keyfile file;
    char err[256];
    if (kf_keyfile_parse(data, (size_t)len, &file, err, sizeof(err)) != 0) {
        kf_raise(ctx, KF_R_BAD_KEY_FILE, "%s", err);
        kf_log_last(ctx, "bad keyfence key file");
        OPENSSL_free(data);
        return 0;
    }
    kf_keyfile_clear(&file);
    int object_type = OSSL_OBJECT_PKEY;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_octet_string(OSSL_OBJECT_PARAM_DATA, data, (size_t)len),
        OSSL_PARAM_construct_int(OSSL_OBJECT_PARAM_TYPE, &object_type),
        OSSL_PARAM_construct_end(),
    };
    int ok = cb(params, cbarg);
    OPENSSL_free(data);
    return ok;
}

#define DECODER(name, fn)                                                  \
    const OSSL_DISPATCH name[] = {                                        \
        {OSSL_FUNC_DECODER_NEWCTX, (void (*)(void))newctx},                \
        {OSSL_FUNC_DECODER_FREECTX, (void (*)(void))freectx},              \
        {OSSL_FUNC_DECODER_DECODE, (void (*)(void))fn},                    \
        {0, NULL},                                                        \
    }

DECODER(kf_decoder_ec, decode_ec_pem);
DECODER(kf_decoder_rsa, decode_rsa_pem);
DECODER(kf_decoder_ed25519, decode_ed25519_pem);
DECODER(kf_decoder_ec_der, decode_ec_der);
DECODER(kf_decoder_rsa_der, decode_rsa_der);
DECODER(kf_decoder_ed25519_der, decode_ed25519_der);
DECODER(kf_decoder_pem_to_der, decode_pem_to_der);
