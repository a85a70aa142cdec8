/* keyfence's OpenSSL provider inside one program, against OpenSSL's own
 * code: key files loaded with PEM_read_bio_PrivateKey and
 * SSL_CTX_use_PrivateKey_file; signatures of every supported kind made
 * through EVP_DigestSign and checked by the default provider with the
 * plain key's public half; certificate and key matched (and a wrong
 * certificate refused); TLS 1.2 and 1.3 handshakes over a memory BIO pair
 * verified by an ordinary client; bad key files refused with the
 * provider's reason and message; the private key never an OpenSSL object.
 *
 * argv: module directory, key directory (make_keys.sh) and, optionally, an
 * openssl.cnf (`keyfence provider-config`) that loads the providers
 * instead (with --isolated, the keys live in the key process). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/provider.h>
#include <openssl/rsa.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

static const char *dir;
static int failures;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                 \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, "\n");                                               \
            ERR_print_errors_fp(stderr);                                         \
            failures++;                                                          \
        }                                                                        \
    } while (0)

static char *path(const char *name) {
    static char buf[4][4096];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof(buf[i]), "%s/%s", dir, name);
    return buf[i];
}

static EVP_PKEY *load_key(const char *name) {
    BIO *b = BIO_new_file(path(name), "r");
    if (b == NULL) return NULL;
    EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
    BIO_free(b);
    return k;
}

/* The plain key's public half, by the default provider alone. */
static EVP_PKEY *plain_public(const char *name) {
    EVP_PKEY *k = load_key(name);
    if (k == NULL) return NULL;
    unsigned char *der = NULL;
    int n = i2d_PUBKEY(k, &der);
    EVP_PKEY_free(k);
    const unsigned char *p = der;
    EVP_PKEY *pub = n > 0 ? d2i_PUBKEY_ex(NULL, &p, n, NULL, "provider=default") : NULL;
    OPENSSL_free(der);
    return pub;
}

/* Signs with `key` through EVP_DigestSign (PSS when pss) and verifies
 * with `pub`; returns 1 when the signature verifies. */
static int sign_verify(EVP_PKEY *key, EVP_PKEY *pub, const char *md, int pss) {
    static const unsigned char msg[] = "keyfence provider test message";
    unsigned char sig[1024];
    size_t siglen = 0;
    EVP_MD_CTX *s = EVP_MD_CTX_new(), *v = EVP_MD_CTX_new();
    EVP_PKEY_CTX *pctx = NULL;
    int ok = EVP_DigestSignInit_ex(s, &pctx, md, NULL, NULL, key, NULL) > 0;
    if (ok && pss)
        ok = EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) > 0 &&
             EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) > 0;
    ok = ok && EVP_DigestSign(s, NULL, &siglen, msg, sizeof(msg)) > 0 && siglen <= sizeof(sig);
    ok = ok && EVP_DigestSign(s, sig, &siglen, msg, sizeof(msg)) > 0;
    pctx = NULL;
    int verified = ok && EVP_DigestVerifyInit_ex(v, &pctx, md, NULL, "provider=default", pub, NULL) > 0 &&
                   (!pss || (EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) > 0 &&
                             EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) > 0)) &&
                   EVP_DigestVerify(v, sig, siglen, msg, sizeof(msg)) == 1;
    /* The same check must refuse another message: the verification is real. */
    if (verified) {
        EVP_MD_CTX_reset(v);
        pctx = NULL;
        static const unsigned char other[] = "keyfence provider test messagE";
        int bad = EVP_DigestVerifyInit_ex(v, &pctx, md, NULL, "provider=default", pub, NULL) > 0 &&
                  (!pss || (EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) > 0 &&
                            EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) > 0)) &&
                  EVP_DigestVerify(v, sig, siglen, other, sizeof(other)) == 1;
        if (bad) verified = 0;
    }
    ERR_clear_error();
    EVP_MD_CTX_free(s);
    EVP_MD_CTX_free(v);
    return verified;
}

static void test_load_and_sign(void) {
    struct {
        const char *name, *type, *md;
        int pss, bits;
    } cases[] = {
        {"ec256", "EC", "SHA256", 0, 256},   {"ec384", "EC", "SHA384", 0, 384},
        {"rsa2048", "RSA", "SHA256", 0, 2048}, {"rsa2048", "RSA", "SHA384", 0, 2048},
        {"rsa2048", "RSA", "SHA512", 0, 2048}, {"rsa2048", "RSA", "SHA256", 1, 2048},
        {"rsa2048", "RSA", "SHA384", 1, 2048}, {"ed25519", "ED25519", NULL, 0, 256},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char kfk[64], pem[64];
        snprintf(kfk, sizeof(kfk), "%s.kfk", cases[i].name);
        snprintf(pem, sizeof(pem), "%s.pem", cases[i].name);
        EVP_PKEY *key = load_key(kfk);
        EVP_PKEY *pub = plain_public(pem);
        CHECK(key != NULL, "%s does not load", kfk);
        CHECK(pub != NULL, "%s does not load", pem);
        if (key == NULL || pub == NULL) continue;
        CHECK(strcmp(OSSL_PROVIDER_get0_name(EVP_PKEY_get0_provider(key)), "keyfence") == 0,
              "%s is not the keyfence provider's", kfk);
        CHECK(EVP_PKEY_is_a(key, cases[i].type), "%s is not %s", kfk, cases[i].type);
        CHECK(EVP_PKEY_get_bits(key) == cases[i].bits, "%s has %d bits", kfk, EVP_PKEY_get_bits(key));
        CHECK(EVP_PKEY_eq(key, pub) == 1, "%s does not match its public key", kfk);
        /* The private half cannot be taken out. */
        BIGNUM *d = NULL;
        CHECK(!EVP_PKEY_get_bn_param(key, "priv", &d) && !EVP_PKEY_get_bn_param(key, "d", &d),
              "%s gave a private parameter", kfk);
        BN_free(d);
        OSSL_PARAM *params = NULL;
        CHECK(EVP_PKEY_todata(key, EVP_PKEY_KEYPAIR, &params) != 1 || OSSL_PARAM_locate(params, "priv") == NULL,
              "%s exported a private key", kfk);
        OSSL_PARAM_free(params);
        ERR_clear_error();
        CHECK(sign_verify(key, pub, cases[i].md, cases[i].pss), "%s %s%s: no valid signature", kfk,
              cases[i].md ? cases[i].md : "", cases[i].pss ? " PSS" : "");
        EVP_PKEY_free(key);
        EVP_PKEY_free(pub);
    }
}

/* With the provider loaded, ordinary keys still sign with the default
 * provider: keyfence's algorithms never take them over. */
static void test_plain_keys_unaffected(void) {
    const char *names[] = {"ec256.pem", "rsa2048.pem", "ed25519.pem"};
    const char *mds[] = {"SHA256", "SHA256", NULL};
    for (int i = 0; i < 3; i++) {
        EVP_PKEY *key = load_key(names[i]);
        EVP_PKEY *pub = plain_public(names[i]);
        CHECK(key != NULL && pub != NULL, "%s does not load", names[i]);
        if (key != NULL) {
            CHECK(strcmp(OSSL_PROVIDER_get0_name(EVP_PKEY_get0_provider(key)), "default") == 0,
                  "%s was not loaded by the default provider", names[i]);
            CHECK(sign_verify(key, pub, mds[i], 0), "%s no longer signs", names[i]);
        }
        EVP_PKEY_free(key);
        EVP_PKEY_free(pub);
    }
    EVP_PKEY *fresh = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    CHECK(fresh != NULL, "no new EC key");
    EVP_PKEY_free(fresh);
}

/* Pairings keyfence does not sign are refused with its reason, not signed wrongly. */
static void test_refusals(void) {
    EVP_PKEY *key = load_key("ec256.kfk");
    EVP_PKEY *pub = plain_public("ec256.pem");
    if (key == NULL || pub == NULL) {
        CHECK(0, "ec256 keys do not load");
        return;
    }
    CHECK(!sign_verify(key, pub, "SHA384", 0), "P-256 with SHA-384 was signed");
    EVP_MD_CTX *s = EVP_MD_CTX_new();
    unsigned char sig[128];
    size_t n = sizeof(sig);
    int ok = EVP_DigestSignInit_ex(s, NULL, "SHA384", NULL, NULL, key, NULL) > 0 &&
             EVP_DigestSign(s, sig, &n, (const unsigned char *)"x", 1) > 0;
    unsigned long e = ERR_peek_last_error();
    char text[256];
    ERR_error_string_n(e, text, sizeof(text));
    CHECK(!ok && strstr(text, "not supported by keyfence") != NULL, "refusal reason: %s", text);
    ERR_clear_error();
    EVP_MD_CTX_free(s);
    EVP_PKEY_free(key);
    EVP_PKEY_free(pub);
}

static SSL_CTX *server_ctx(const char *name, int version) {
    char crt[64], kfk[64];
    snprintf(crt, sizeof(crt), "%s.crt", name);
    snprintf(kfk, sizeof(kfk), "%s.kfk", name);
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_set_min_proto_version(ctx, version);
    SSL_CTX_set_max_proto_version(ctx, version);
    if (SSL_CTX_use_certificate_file(ctx, path(crt), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, path(kfk), SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* A full handshake over a BIO pair; the client verifies the chain. */
static int handshake(SSL_CTX *sctx, int version, int *out_version) {
    SSL_CTX *cctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(cctx, version);
    SSL_CTX_set_max_proto_version(cctx, version);
    SSL_CTX_load_verify_locations(cctx, path("ca.pem"), NULL);
    SSL_CTX_set_verify(cctx, SSL_VERIFY_PEER, NULL);
    SSL *c = SSL_new(cctx), *s = SSL_new(sctx);
    SSL_set1_host(c, "localhost");
    BIO *cb = NULL, *sb = NULL;
    BIO_new_bio_pair(&cb, 0, &sb, 0);
    SSL_set_bio(c, cb, cb);
    SSL_set_bio(s, sb, sb);
    SSL_set_connect_state(c);
    SSL_set_accept_state(s);
    int cdone = 0, sdone = 0;
    for (int i = 0; i < 200 && !(cdone && sdone); i++) {
        if (!cdone) {
            int r = SSL_do_handshake(c);
            if (r == 1) cdone = 1;
            else if (SSL_get_error(c, r) != SSL_ERROR_WANT_READ) break;
        }
        if (!sdone) {
            int r = SSL_do_handshake(s);
            if (r == 1) sdone = 1;
            else if (SSL_get_error(s, r) != SSL_ERROR_WANT_READ) break;
        }
    }
    int ok = cdone && sdone && SSL_get_verify_result(c) == X509_V_OK;
    *out_version = SSL_version(c);
    SSL_free(c);
    SSL_free(s);
    SSL_CTX_free(cctx);
    return ok;
}

static void test_tls(void) {
    const char *names[] = {"ec256", "ec384", "rsa2048", "ed25519"};
    int versions[] = {TLS1_2_VERSION, TLS1_3_VERSION};
    for (size_t i = 0; i < 4; i++) {
        for (size_t j = 0; j < 2; j++) {
            SSL_CTX *sctx = server_ctx(names[i], versions[j]);
            CHECK(sctx != NULL, "%s: the server does not take the key file", names[i]);
            if (sctx == NULL) continue;
            int got = 0;
            CHECK(handshake(sctx, versions[j], &got) && got == versions[j], "%s: no TLS %s handshake", names[i],
                  versions[j] == TLS1_3_VERSION ? "1.3" : "1.2");
            SSL_CTX_free(sctx);
        }
    }
    /* The certificate and the key file in one file, certificate first
     * (HAProxy's crt files): the key is found after the certificate. */
    {
        FILE *out = fopen(path("combined.pem"), "wb");
        const char *parts[] = {"ec256.crt", "ec256.kfk"};
        for (int i = 0; out != NULL && i < 2; i++) {
            FILE *in = fopen(path(parts[i]), "rb");
            char buf[4096];
            size_t n;
            while (in != NULL && (n = fread(buf, 1, sizeof(buf), in)) > 0) fwrite(buf, 1, n, out);
            if (in != NULL) fclose(in);
        }
        if (out != NULL) fclose(out);
        EVP_PKEY *k = load_key("combined.pem");
        CHECK(k != NULL && EVP_PKEY_is_a(k, "EC"), "the key file after a certificate does not load");
        EVP_PKEY_free(k);
    }
    /* A key file with another key's certificate is refused. */
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    int ok = SSL_CTX_use_certificate_file(ctx, path("ec384.crt"), SSL_FILETYPE_PEM) == 1 &&
             SSL_CTX_use_PrivateKey_file(ctx, path("ec256.kfk"), SSL_FILETYPE_PEM) == 1;
    CHECK(!ok, "a key file was accepted with another key's certificate");
    ERR_clear_error();
    SSL_CTX_free(ctx);
}

static void write_file(const char *name, const void *data, size_t n) {
    FILE *f = fopen(path(name), "wb");
    if (f == NULL) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

/* The body of ec256.kfk, decoded. */
static unsigned char *good_body(long *len) {
    BIO *b = BIO_new_file(path("ec256.kfk"), "r");
    char *name = NULL, *header = NULL;
    unsigned char *data = NULL;
    if (b == NULL || !PEM_read_bio(b, &name, &header, &data, len)) data = NULL;
    OPENSSL_free(name);
    OPENSSL_free(header);
    BIO_free(b);
    return data;
}

static void write_body(const char *name, const unsigned char *body, long len) {
    BIO *b = BIO_new_file(path(name), "w");
    PEM_write_bio(b, "KEYFENCE KEY", "", body, len);
    BIO_free(b);
}

/* Loads a bad file; it must fail with the provider's reason and a message
 * containing `expect`. */
static void refused(const char *name, const char *reason, const char *expect) {
    ERR_clear_error();
    EVP_PKEY *k = load_key(name);
    CHECK(k == NULL, "%s was loaded", name);
    EVP_PKEY_free(k);
    int found = 0;
    const char *data = NULL;
    int flags = 0;
    unsigned long e;
    char text[256];
    while ((e = ERR_get_error_all(NULL, NULL, NULL, &data, &flags)) != 0) {
        ERR_error_string_n(e, text, sizeof(text));
        if (strstr(text, reason) != NULL && data != NULL && strstr(data, expect) != NULL) found = 1;
    }
    CHECK(found, "%s: no error \"%s\" saying \"%s\"", name, reason, expect);
}

static void test_bad_files(void) {
    long len = 0;
    unsigned char *body = good_body(&len);
    CHECK(body != NULL && len > 40, "ec256.kfk has no body");
    if (body == NULL) return;
    write_body("truncated.kfk", body, len - 20);
    refused("truncated.kfk", "bad keyfence key file", "truncated");
    unsigned char *v2 = malloc((size_t)len);
    memcpy(v2, body, (size_t)len);
    v2[5] = 4; /* version 3 is the token mode's: 4 is no version yet */
    write_body("version4.kfk", v2, len);
    refused("version4.kfk", "bad keyfence key file", "version 4 is not supported");
    memcpy(v2, body, (size_t)len);
    v2[0] = 'X';
    write_body("magic.kfk", v2, len);
    refused("magic.kfk", "bad keyfence key file", "bad magic");
    free(v2);
    /* An unknown field appended. */
    unsigned char *more = malloc((size_t)len + 6);
    memcpy(more, body, (size_t)len);
    memcpy(more + len, "\x63\x00\x00\x00\x01\x00", 6);
    write_body("unknown.kfk", more, len + 6);
    refused("unknown.kfk", "bad keyfence key file", "holds 99, which is no field's tag");
    free(more);
    OPENSSL_free(body);
    /* Garbage between the PEM lines. */
    const char garbage[] = "-----BEGIN KEYFENCE KEY-----\n!!!!\n-----END KEYFENCE KEY-----\n";
    write_file("garbage.kfk", garbage, sizeof(garbage) - 1);
    EVP_PKEY *k = load_key("garbage.kfk");
    CHECK(k == NULL, "garbage.kfk was loaded");
    EVP_PKEY_free(k);
    ERR_clear_error();
    /* A machine that may not open the envelope. */
    refused("fr.kfk", "keyfence key unavailable", "POLICY_NOT_SATISFIED");
}

/* Whether a child of this process is the key process (its name in
 * /proc/PID/comm, cut to 15 characters by the kernel). */
static int has_key_process_child(void) {
    char path_buf[64], line[4096];
    snprintf(path_buf, sizeof(path_buf), "/proc/%d/task/%d/children", (int)getpid(), (int)getpid());
    FILE *f = fopen(path_buf, "r");
    if (f == NULL) return 0;
    int found = 0;
    int pid;
    while (fscanf(f, "%d", &pid) == 1) {
        snprintf(path_buf, sizeof(path_buf), "/proc/%d/comm", pid);
        FILE *c = fopen(path_buf, "r");
        if (c != NULL && fgets(line, sizeof(line), c) != NULL && strncmp(line, "keyfence-key-pr", 15) == 0) found = 1;
        if (c != NULL) fclose(c);
    }
    fclose(f);
    return found;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: test_provider MODULE_DIR KEY_DIR [OPENSSL_CNF]\n");
        return 2;
    }
    dir = argv[2];
    OSSL_PROVIDER *def = NULL, *kf = NULL;
    if (argc == 4) {
        if (!OSSL_LIB_CTX_load_config(NULL, argv[3]) || !OSSL_PROVIDER_available(NULL, "keyfence")) {
            fprintf(stderr, "%s does not load the keyfence provider\n", argv[3]);
            ERR_print_errors_fp(stderr);
            return 1;
        }
    } else {
        OSSL_PROVIDER_set_default_search_path(NULL, argv[1]);
        /* The default provider first, as `keyfence provider-config` writes
         * it: OpenSSL fetches by name from the first provider that has it. */
        def = OSSL_PROVIDER_load(NULL, "default");
        kf = OSSL_PROVIDER_load(NULL, "keyfence");
        if (kf == NULL || def == NULL) {
            ERR_print_errors_fp(stderr);
            return 1;
        }
    }
    test_load_and_sign();
    /* The configuration's mode is the one used: a key process exactly
     * when the configuration says isolated. */
    int isolated = argc == 4 && strstr(argv[3], "isolated") != NULL;
    CHECK(has_key_process_child() == isolated, "key process running: %d, expected %d", has_key_process_child(),
          isolated);
    test_plain_keys_unaffected();
    test_refusals();
    test_tls();
    test_bad_files();
    if (kf != NULL) OSSL_PROVIDER_unload(kf);
    if (def != NULL) OSSL_PROVIDER_unload(def);
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
