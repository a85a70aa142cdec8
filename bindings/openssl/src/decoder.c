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

static int decode(void *ctx, OSSL_CORE_BIO *cin, int selection, OSSL_CALLBACK *object_cb, void *object_cbarg,
                  int type) {
    kf_prov *prov = ctx;
    if (selection != 0 && (selection & OSSL_KEYMGMT_SELECT_PRIVATE_KEY) == 0) return 1;
    unsigned char *data = NULL;
    long len = 0;
    /* Not a key file: another decoder's business. */
    if (!read_body(prov, cin, &data, &len)) return 1;
    int ret = 1;
    kf_keyfile file;
    char err[256];
    if (kf_keyfile_parse(data, (size_t)len, &file, err, sizeof(err)) != 0) {
        kf_raise(prov, KF_R_BAD_KEY_FILE, "%s", err);
        ret = 0;
        goto out;
    }
    /* The type is in the public key: look before opening anything. */
    const unsigned char *p = file.spki;
    EVP_PKEY *pub = d2i_PUBKEY(NULL, &p, (long)file.spki_len);
    int file_type = pub == NULL ? -1
                    : EVP_PKEY_is_a(pub, "EC") ? KF_EC
                    : EVP_PKEY_is_a(pub, "RSA") ? KF_RSA
                    : EVP_PKEY_is_a(pub, "ED25519") ? KF_ED25519
                                                    : -2;
    EVP_PKEY_free(pub);
    if (file_type == -1) ERR_clear_error();
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
    kf_key *key = kf_key_from_file(prov, &file);
    if (key == NULL) {
        ret = 0;
        goto out;
    }
    ret = kf_key_pass(key, object_cb, object_cbarg);
out:
    OPENSSL_free(data);
    return ret;
}

#define DECODE_FN(fname, type)                                                                      \
    static int fname(void *ctx, OSSL_CORE_BIO *cin, int selection, OSSL_CALLBACK *cb, void *cbarg,         \
                     OSSL_PASSPHRASE_CALLBACK *pw_cb, void *pw_cbarg) {                                     \
        (void)pw_cb;                                                                                        \
        (void)pw_cbarg;                                                                                     \
        return decode(ctx, cin, selection, cb, cbarg, type);                                         \
    }

DECODE_FN(decode_ec_pem, KF_EC)
DECODE_FN(decode_rsa_pem, KF_RSA)
DECODE_FN(decode_ed25519_pem, KF_ED25519)

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
