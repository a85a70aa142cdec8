/* bench_sign KEY SECONDS THREADS DIGEST PUBLIC: an `openssl speed`-style loop
 * through whatever providers OPENSSL_CONF loads. KEY is loaded through
 * OSSL_STORE (a `pkcs11:` URI for pkcs11-provider, `keyfence:PATH` for a
 * keyfence key file); THREADS threads each sign 32-byte messages with
 * EVP_DigestSign (DIGEST, default sha256; "none" for Ed25519) for SECONDS
 * seconds. Prints one JSON line: signatures, wall seconds, and the CPU
 * seconds this process used (getrusage: every thread, the token's module
 * included), so two providers are compared per CPU-second. Each thread's
 * last signature is checked against PUBLIC (a PEM public key made apart
 * from either provider), so a provider that does not sign cannot look
 * fast. bench_token.sh runs it. */
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/store.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static EVP_PKEY *key, *pub;
static const char *digest;
static double seconds;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

struct result {
    unsigned long n;
    int failed;
};

static void *loop(void *arg) {
    struct result *r = arg;
    unsigned char msg[32] = {0}, sig[1024];
    size_t len = 0;
    double end = now() + seconds;
    while (now() < end) {
        memcpy(msg, &r->n, sizeof(r->n));
        EVP_MD_CTX *ctx = EVP_MD_CTX_new();
        len = sizeof(sig);
        if (ctx == NULL || EVP_DigestSignInit_ex(ctx, NULL, digest, NULL, NULL, key, NULL) != 1 ||
            EVP_DigestSign(ctx, sig, &len, msg, sizeof(msg)) != 1) {
            EVP_MD_CTX_free(ctx);
            r->failed = 1;
            return NULL;
        }
        EVP_MD_CTX_free(ctx);
        r->n++;
    }
    /* The last signature verifies with OpenSSL's own code. */
    EVP_MD_CTX *v = EVP_MD_CTX_new();
    int ok = v != NULL && EVP_DigestVerifyInit_ex(v, NULL, digest, NULL, NULL, pub, NULL) == 1 &&
             EVP_DigestVerify(v, sig, len, msg, sizeof(msg)) == 1;
    EVP_MD_CTX_free(v);
    if (r->n > 0 && !ok) r->failed = 2;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: bench_sign KEY SECONDS THREADS DIGEST|none PUBLIC.pem\n");
        return 2;
    }
    seconds = atof(argv[2]);
    int threads = atoi(argv[3]);
    digest = strcmp(argv[4], "none") != 0 ? argv[4] : NULL;
    if (seconds <= 0 || threads < 1 || threads > 256) return 2;
    OSSL_STORE_CTX *s = OSSL_STORE_open(argv[1], NULL, NULL, NULL, NULL);
    for (OSSL_STORE_INFO *i; s != NULL && key == NULL && (i = OSSL_STORE_load(s)) != NULL; OSSL_STORE_INFO_free(i))
        if (OSSL_STORE_INFO_get_type(i) == OSSL_STORE_INFO_PKEY) key = OSSL_STORE_INFO_get1_PKEY(i);
    OSSL_STORE_close(s);
    if (key == NULL) {
        fprintf(stderr, "bench_sign: cannot load %s\n", argv[1]);
        ERR_print_errors_fp(stderr);
        return 1;
    }
    /* The public half, from a file and OpenSSL's default provider. */
    FILE *f = fopen(argv[5], "r");
    pub = f != NULL ? PEM_read_PUBKEY_ex(f, NULL, NULL, NULL, NULL, "provider=default") : NULL;
    if (f != NULL) fclose(f);
    if (pub == NULL) {
        fprintf(stderr, "bench_sign: cannot read the public key %s\n", argv[5]);
        ERR_print_errors_fp(stderr);
        return 1;
    }
    pthread_t t[256];
    struct result r[256];
    memset(r, 0, sizeof(r));
    double w0 = now(), c0 = cpu();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, loop, &r[i]);
    unsigned long n = 0;
    int failed = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        n += r[i].n;
        failed |= r[i].failed;
    }
    double wall = now() - w0, used = cpu() - c0;
    if (failed) {
        fprintf(stderr, "bench_sign: a signature %s\n", failed == 2 ? "did not verify" : "failed");
        ERR_print_errors_fp(stderr);
        return 1;
    }
    printf("{\"signatures\": %lu, \"wall_s\": %.3f, \"cpu_s\": %.3f, \"per_s\": %.0f, \"per_cpu_s\": %.0f}\n", n, wall, used,
           (double)n / wall, used > 0 ? (double)n / used : 0.0);
    EVP_PKEY_free(key);
    EVP_PKEY_free(pub);
    /* Skip OpenSSL's cleanup at exit: pkcs11-provider 0.5 crashes in its
     * teardown (p11prov_free_slots) after SoftHSM2 has finalized, which
     * would turn a finished measurement into a failure. */
    fflush(stdout);
    _exit(0);
}
