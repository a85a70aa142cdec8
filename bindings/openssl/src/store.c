/* A store for keyfence:PATH URIs: the openssl command line and other
 * programs that load keys through OSSL_STORE (`openssl s_server -key
 * keyfence:/etc/tls/example.kfk`) get the key file's key, as the decoder
 * gives it to PEM_read_bio_PrivateKey. */
#include "provider.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/core_object.h>
#include <openssl/crypto.h>
#include <openssl/params.h>

#define SCHEME "keyfence:"

typedef struct {
    kf_prov *prov;
    char *path;
    int eof;
} store_ctx;

static void *st_open(void *provctx, const char *uri) {
    if (uri == NULL || strncmp(uri, SCHEME, strlen(SCHEME)) != 0) return NULL;
    store_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL) return NULL;
    c->prov = provctx;
    c->path = strdup(uri + strlen(SCHEME));
    if (c->path == NULL) {
        free(c);
        return NULL;
    }
    return c;
}

static int st_load(void *vctx, OSSL_CALLBACK *cb, void *cbarg, OSSL_PASSPHRASE_CALLBACK *pw_cb, void *pw_cbarg) {
    (void)pw_cb;
    (void)pw_cbarg;
    store_ctx *c = vctx;
    c->eof = 1;
    FILE *f = fopen(c->path, "rb");
    if (f == NULL) {
        kf_raise(c->prov, KF_R_BAD_KEY_FILE, "cannot read %s", c->path);
        return 0;
    }
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    unsigned char *body = NULL;
    long len = 0;
    if (!kf_find_body(buf, n, &body, &len)) {
        kf_raise(c->prov, KF_R_BAD_KEY_FILE, "%s holds no KEYFENCE KEY block", c->path);
        return 0;
    }
    kf_keyfile file;
    char err[256];
    int ok = kf_keyfile_parse(body, (size_t)len, &file, err, sizeof(err)) == 0;
    OPENSSL_free(body);
    if (!ok) {
        kf_raise(c->prov, KF_R_BAD_KEY_FILE, "%s", err);
        return 0;
    }
    kf_key *key = kf_key_from_file(c->prov, &file);
    if (key == NULL) return 0;
    return kf_key_pass(key, key->type, cb, cbarg);
}

static int st_eof(void *vctx) { return ((store_ctx *)vctx)->eof; }

static int st_close(void *vctx) {
    store_ctx *c = vctx;
    free(c->path);
    free(c);
    return 1;
}

static int st_set_ctx_params(void *vctx, const OSSL_PARAM params[]) {
    (void)vctx;
    (void)params;
    return 1;
}

const OSSL_DISPATCH kf_store[] = {
    {OSSL_FUNC_STORE_OPEN, (void (*)(void))st_open},
    {OSSL_FUNC_STORE_LOAD, (void (*)(void))st_load},
    {OSSL_FUNC_STORE_EOF, (void (*)(void))st_eof},
    {OSSL_FUNC_STORE_CLOSE, (void (*)(void))st_close},
    {OSSL_FUNC_STORE_SET_CTX_PARAMS, (void (*)(void))st_set_ctx_params},
    {0, NULL},
};
