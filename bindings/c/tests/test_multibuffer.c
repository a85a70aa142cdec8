/* Signing on the multi-buffer device through the C API
 * (keyfence_engine_config_set_offload), in this process and in the key
 * process, against the stand-in crypto_mb (vectors/crypto-mb-stand-in/):
 * its log shows the lanes it signed together, and OpenSSL verifies every
 * signature. argv[1] is the stand-in library, argv[2] the
 * keyfence-key-process program, argv[3] a fresh folder. */
#include <errno.h>
#include <poll.h>
#include <sys/stat.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "openssl_keys.h"

#define OPS 64

static const char *stand_in, *key_process;
static char log_path[4096];

/* Whether the stand-in logged a call of more than one lane of `what`
 * ("rsa 2048" or "ecdsa 256"), then empties the log. */
static bool grouped(const char *what) {
    FILE *f = fopen(log_path, "r");
    bool seen = false;
    char line[256];
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        size_t n = strlen(what);
        if (strncmp(line, what, n) == 0 && line[n] == ' ' && atoi(line + n + 1) > 1) seen = true;
    }
    if (f != NULL) fclose(f);
    f = fopen(log_path, "w");
    CHECK(f != NULL);
    fclose(f);
    return seen;
}

/* What each completion of sign_many must be: a signature with `alg` that
 * openssl verifies with `ossl` over the message in its user data. */
struct expected {
    EVP_PKEY *ossl;
    const char *alg;
};

static void verify_completion(const keyfence_completion *c, void *arg) {
    const struct expected *want = arg;
    if (c->result != KEYFENCE_OK) {
        fprintf(stderr, "%s: %s: %s\n", want->alg, keyfence_result_name(c->result), (const char *)c->message.data);
        exit(1);
    }
    const char *m = c->user_data;
    CHECK(kf_openssl_verify(want->ossl, m, strlen(m), c->signature.data, c->signature.len));
}

/* OPS signatures of `pem`'s key submitted at once, so that they form
 * groups, each checked by OpenSSL. */
static void sign_many(keyfence_engine *e, EVP_PKEY *ossl, const char *pem, size_t pem_len, const char *alg) {
    keyfence_private_key *key = NULL;
    OK(keyfence_key_from_pem(e, (const uint8_t *)pem, pem_len, &key));
    keyfence_completion_queue *q = NULL;
    OK(keyfence_completion_queue_new(&q));
    static char msgs[OPS][32];
    for (size_t i = 0; i < OPS; i++) {
        snprintf(msgs[i], sizeof msgs[i], "message %zu", i);
        OK(keyfence_engine_submit_to_queue(e, key, alg, (const uint8_t *)msgs[i], strlen(msgs[i]), 10000, q, msgs[i], NULL));
    }
    struct expected want = {ossl, alg};
    kf_drain(q, OPS, 20000, verify_completion, &want);
    keyfence_completion_queue_free(q);
    keyfence_key_free(key);
}

static keyfence_engine *engine(bool isolated, const char *mode) {
    keyfence_engine_config *cfg = NULL;
    OK(keyfence_engine_config_new(&cfg));
    if (isolated) OK(keyfence_engine_config_set_isolated(cfg, key_process));
    OK(keyfence_engine_config_set_offload(cfg, mode, stand_in));
    keyfence_engine *e = NULL;
    OK(keyfence_engine_new(cfg, &e));
    keyfence_engine_config_free(cfg);
    return e;
}

int main(int argc, char **argv) {
    CHECK(argc == 4);
    stand_in = argv[1];
    key_process = argv[2];
    CHECK(mkdir(argv[3], 0700) == 0 || errno == EEXIST);
    snprintf(log_path, sizeof log_path, "%s/calls.log", argv[3]);
    /* The stand-in reads these at each call; the key process inherits
     * them and, under its sandbox, may write only a token folder. */
    CHECK(setenv("KF_MB_LOG", log_path, 1) == 0);
    CHECK(setenv("KEYFENCE_PKCS11_TOKEN_DIRS", argv[3], 1) == 0);
    grouped("");

    char *rsa_pem, *ec_pem;
    size_t rsa_len, ec_len;
    EVP_PKEY *rsa = kf_openssl_key("RSA-2048", &rsa_pem, &rsa_len);
    EVP_PKEY *ec = kf_openssl_key("P-256", &ec_pem, &ec_len);
    for (int isolated = 0; isolated < 2; isolated++) {
        keyfence_engine *e = engine(isolated, "on");
        sign_many(e, rsa, rsa_pem, rsa_len, "rsa-pkcs1-sha256");
        CHECK(grouped("rsa 2048"));
        sign_many(e, ec, ec_pem, ec_len, "ecdsa-p256-sha256");
        CHECK(grouped("ecdsa 256"));
        keyfence_engine_free(e);
        /* Off: the library is never called. */
        e = engine(isolated, "off");
        sign_many(e, rsa, rsa_pem, rsa_len, "rsa-pkcs1-sha256");
        CHECK(!grouped("rsa 2048"));
        keyfence_engine_free(e);
    }

    /* A mode that is none of the three; a library named empty. */
    keyfence_engine_config *cfg = NULL;
    OK(keyfence_engine_config_new(&cfg));
    FAILS(KEYFENCE_INVALID_CONFIG, keyfence_engine_config_set_offload(cfg, "maybe", NULL));
    MESSAGE_HAS("off, on or auto");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_engine_config_set_offload(cfg, "on", ""));
    keyfence_engine *e = NULL;
    OK(keyfence_engine_config_set_offload(cfg, NULL, stand_in));
    FAILS(KEYFENCE_INVALID_CONFIG, keyfence_engine_new(cfg, &e));
    MESSAGE_HAS("set the offload mode too");
    /* `on` where crypto_mb says nothing runs here: the engine is refused,
     * saying why; `auto` signs in software. */
    CHECK(setenv("KF_MB_MODE", "unsupported", 1) == 0);
    OK(keyfence_engine_config_set_offload(cfg, "on", stand_in));
    FAILS(KEYFENCE_BACKEND_FAILED, keyfence_engine_new(cfg, &e));
    MESSAGE_HAS("crypto_mb");
    OK(keyfence_engine_config_set_offload(cfg, "auto", stand_in));
    OK(keyfence_engine_new(cfg, &e));
    sign_many(e, rsa, rsa_pem, rsa_len, "rsa-pkcs1-sha256");
    CHECK(!grouped("rsa 2048"));
    keyfence_engine_free(e);
    CHECK(unsetenv("KF_MB_MODE") == 0);
    /* An agent's engine: the agent chooses. */
    OK(keyfence_engine_config_set_agent(cfg, "/nonexistent/agent.sock"));
    OK(keyfence_engine_config_set_offload(cfg, "on", NULL));
    FAILS(KEYFENCE_INVALID_CONFIG, keyfence_engine_new(cfg, &e));
    MESSAGE_HAS("choose their own");
    keyfence_engine_config_free(cfg);

    EVP_PKEY_free(rsa);
    EVP_PKEY_free(ec);
    free(rsa_pem);
    free(ec_pem);
    printf("multibuffer: in process and isolated, RSA-2048 and P-256 signed in groups on the stand-in\n");
    return 0;
}
