/* Remote signing from C against a real `keyfence serve` on loopback, set up
 * by vectors/remote-fixture.sh in the directory given as argv[1]: a Tokyo
 * machine that may not open a US-only key signs with it through the US
 * server, OpenSSL verifies the signature, and the failure modes (no
 * capable peer, a certificate from another CA, bad settings, the server
 * killed) are typed errors in bounded time. */
#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>
#include <time.h>

#include <openssl/pem.h>

#include "openssl_keys.h"

static const char *dir;

static char *path(const char *name) {
    static char buf[8][1024];
    static int i;
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

static uint8_t *slurp(const char *name, size_t *len) {
    FILE *f = fopen(path(name), "rb");
    CHECK(f != NULL);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n >= 0);
    rewind(f);
    uint8_t *b = malloc((size_t)n + 1);
    CHECK(b != NULL && fread(b, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

static keyfence_remote *remote_as(const char *client, const char *attrs) {
    keyfence_remote_config *c = NULL;
    keyfence_remote *r = NULL;
    size_t n;
    char *addr = (char *)slurp("server.addr", &n);
    addr[strcspn(addr, "\n")] = 0;
    OK(keyfence_remote_config_new(path(client), path(client[0] == 'c' ? "client.key" : "stranger.key"), path("ca.pem"), &c));
    OK(keyfence_remote_config_add_peer(c, "sfo1", addr, attrs, NULL));
    OK(keyfence_remote_config_set_limits(c, 1000, 1000, 2));
    OK(keyfence_remote_config_set_tenant(c, 7));
    OK(keyfence_remote_new(c, &r));
    keyfence_remote_config_free(c);
    free(addr);
    return r;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    dir = argv[1];
    size_t env_len, nrt_len, sfo_len, pub_len;
    uint8_t *env = slurp("key.env", &env_len);
    uint8_t *nrt_key = slurp("nrt1.machine", &nrt_len);
    uint8_t *sfo_key = slurp("sfo1.machine", &sfo_len);
    uint8_t *pub_pem = slurp("key.pub.pem", &pub_len);
    BIO *bio = BIO_new_mem_buf(pub_pem, (int)pub_len);
    EVP_PKEY *pub = PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
    CHECK(pub != NULL);
    BIO_free(bio);

    keyfence_engine_config *ec = NULL;
    keyfence_engine *engine = NULL;
    OK(keyfence_engine_config_new(&ec));
    OK(keyfence_engine_config_set_timeout_ms(ec, 3000));
    OK(keyfence_engine_new(ec, &engine));
    keyfence_engine_config_free(ec);

    /* Tokyo may not open the US-only key: open_or_forward gives a handle
     * on the US server's copy, and the signature verifies with OpenSSL. */
    keyfence_machine *tokyo = NULL, *sfo = NULL;
    OK(keyfence_machine_new(nrt_key, nrt_len, path("store"), &tokyo));
    OK(keyfence_machine_new(sfo_key, sfo_len, path("store"), &sfo));
    keyfence_remote *remote = remote_as("client.pem", "country=US,region=NA");
    OK(keyfence_engine_attach_remote(engine, remote));
    keyfence_private_key *key = NULL;
    bool local = true;
    OK(keyfence_remote_open_or_forward(remote, tokyo, env, env_len, &key));
    OK(keyfence_key_is_local(key, &local));
    CHECK(!local);
    const char msg[] = "a TLS handshake from Tokyo";
    keyfence_bytes sig = {0};
    OK(keyfence_engine_sign(engine, key, "ecdsa-p256-sha256", (const uint8_t *)msg, sizeof msg - 1, 0, &sig));
    CHECK(kf_openssl_verify(pub, msg, sizeof msg - 1, sig.data, sig.len));
    CHECK(!kf_openssl_verify(pub, msg, sizeof msg - 2, sig.data, sig.len));
    keyfence_bytes_free(&sig);
    /* The same public key as the envelope's, through the server. */
    keyfence_bytes der = {0};
    OK(keyfence_key_public_der(key, &der));
    CHECK(der.len > 0);
    keyfence_bytes_free(&der);
    keyfence_key_free(key);

    /* The US machine opens it here, without the network. */
    OK(keyfence_remote_open_or_forward(remote, sfo, env, env_len, &key));
    OK(keyfence_key_is_local(key, &local));
    CHECK(local);
    OK(keyfence_engine_sign(engine, key, "ecdsa-p256-sha256", (const uint8_t *)msg, sizeof msg - 1, 0, &sig));
    CHECK(kf_openssl_verify(pub, msg, sizeof msg - 1, sig.data, sig.len));
    keyfence_bytes_free(&sig);
    keyfence_key_free(key);

    /* Metrics: the peer in the signer's own text and in the engine's. */
    keyfence_bytes text = {0};
    OK(keyfence_remote_metrics_prometheus(remote, &text));
    CHECK(strstr((const char *)text.data, "peer=\"sfo1\"") != NULL);
    keyfence_bytes_free(&text);
    OK(keyfence_engine_metrics_prometheus(engine, &text));
    CHECK(strstr((const char *)text.data, "keyfence_engine_") != NULL);
    CHECK(strstr((const char *)text.data, "keyfence_remote_client_operations_total") != NULL);
    keyfence_bytes_free(&text);

    /* No configured peer may hold the key: refused before any connection. */
    keyfence_remote *eu_only = remote_as("client.pem", "country=DE,region=EU");
    FAILS(KEYFENCE_BACKEND_FAILED, keyfence_remote_key(eu_only, env, env_len, &key));
    CHECK(strstr(kf_last_message(), "no configured peer") != NULL);
    FAILS(KEYFENCE_INVALID_ENVELOPE, keyfence_remote_key(eu_only, env, env_len - 1, &key));
    keyfence_remote_free(eu_only);

    /* A client certificate from another CA gets nothing. */
    keyfence_remote *stranger = remote_as("stranger.pem", "country=US,region=NA");
    FAILS(KEYFENCE_BACKEND_FAILED, keyfence_remote_key(stranger, env, env_len, &key));
    keyfence_remote_free(stranger);

    /* Settings are checked where they are given. */
    keyfence_remote_config *c = NULL;
    keyfence_remote *r = NULL;
    OK(keyfence_remote_config_new(path("client.pem"), path("client.key"), path("ca.pem"), &c));
    FAILS(KEYFENCE_INVALID_CONFIG, keyfence_remote_new(c, &r)); /* no peers */
    FAILS(KEYFENCE_INVALID_CONFIG, keyfence_remote_config_add_peer(c, "x", "not an address", "a=b", NULL));
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_remote_config_add_peer(c, "x", "127.0.0.1:1", "a", NULL));
    FAILS(KEYFENCE_INVALID_CONFIG, keyfence_remote_config_add_peer(c, "", "127.0.0.1:1", "a=b", NULL));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_remote_config_add_peer(c, "x", NULL, "a=b", NULL));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_remote_config_set_limits(c, 0, 1000, 1));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_remote_config_set_limits(c, 1000, 1000, 0));
    keyfence_remote_config_free(c);
    OK(keyfence_remote_config_new(path("missing.pem"), path("client.key"), path("ca.pem"), &c));
    OK(keyfence_remote_config_add_peer(c, "sfo1", "127.0.0.1:1", "country=US", NULL));
    FAILS(KEYFENCE_INVALID_CONFIG, keyfence_remote_new(c, &r));
    keyfence_remote_config_free(c);
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_remote_key(NULL, env, env_len, &key));

    /* The server killed: a signature on its key fails, typed, in bounded
     * time (the engine's 3 s deadline at most), and never hangs. */
    OK(keyfence_remote_key(remote, env, env_len, &key));
    size_t pid_len;
    char *pid = (char *)slurp("server.pid", &pid_len);
    CHECK(kill((pid_t)atoi(pid), SIGKILL) == 0);
    free(pid);
    double t0 = now();
    keyfence_result res = keyfence_engine_sign(engine, key, "ecdsa-p256-sha256", (const uint8_t *)msg, sizeof msg - 1, 0, &sig);
    CHECK(res == KEYFENCE_BACKEND_FAILED || res == KEYFENCE_TIMED_OUT);
    CHECK(now() - t0 < 5.0);
    keyfence_key_free(key);

    keyfence_remote_free(remote);
    keyfence_machine_free(tokyo);
    keyfence_machine_free(sfo);
    keyfence_engine_free(engine);
    EVP_PKEY_free(pub);
    free(env);
    free(nrt_key);
    free(sfo_key);
    free(pub_pem);
    printf("remote signing from C: ok\n");
    return 0;
}
