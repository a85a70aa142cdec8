/* Signing through the C API, every path: blocking, callback, completion
 * queue, the key process; and the errors a server must handle:
 * bad keys, bad algorithms, an overloaded queue, a deadline. Signatures
 * are verified by OpenSSL. argv[1] is the keyfence-key-process program. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "openssl_keys.h"

static EVP_PKEY *ec_ossl, *rsa_ossl;
static keyfence_private_key *ec_key, *rsa_key;
static const char MSG[] = "a TLS 1.3 CertificateVerify input";

/* `key` signs MSG with ECDSA P-256 through `e`, within `timeout_ms` (0:
 * none), and openssl verifies the signature with `ossl`. */
static void signs_p256(keyfence_engine *e, const keyfence_private_key *key, EVP_PKEY *ossl, uint32_t timeout_ms) {
    keyfence_bytes sig = {0};
    OK(keyfence_engine_sign(e, key, "ecdsa-p256-sha256", (const uint8_t *)MSG, sizeof MSG, timeout_ms, &sig));
    CHECK(kf_openssl_verify(ossl, MSG, sizeof MSG, sig.data, sig.len));
    keyfence_bytes_free(&sig);
}

static void keys(void) {
    char *pem;
    size_t n;
    ec_ossl = kf_openssl_key("P-256", &pem, &n);
    OK(keyfence_key_from_pem(NULL, (const uint8_t *)pem, n, &ec_key));
    free(pem);
    rsa_ossl = kf_openssl_key("RSA-2048", &pem, &n);
    OK(keyfence_key_from_pem(NULL, (const uint8_t *)pem, n, &rsa_key));
    free(pem);

    keyfence_private_key *bad = NULL;
    FAILS(KEYFENCE_INVALID_PRIVATE_KEY, keyfence_key_from_pem(NULL, (const uint8_t *)"-----BEGIN nothing", 18, &bad));
    CHECK(bad == NULL);
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_key_from_pem(NULL, NULL, 10, &bad));

    keyfence_bytes der = {0};
    OK(keyfence_key_public_der(ec_key, &der));
    const unsigned char *p = der.data;
    EVP_PKEY *pub = d2i_PUBKEY(NULL, &p, (long)der.len);
    CHECK(pub != NULL && EVP_PKEY_eq(pub, ec_ossl) == 1);
    EVP_PKEY_free(pub);
    keyfence_bytes_free(&der);
}

static void blocking(keyfence_engine *e) {
    keyfence_bytes sig = {0};
    signs_p256(e, ec_key, ec_ossl, 0);
    OK(keyfence_engine_sign(e, rsa_key, "rsa-pkcs1-sha256", (const uint8_t *)MSG, sizeof MSG, 0, &sig));
    CHECK(sig.len == 256 && kf_openssl_verify(rsa_ossl, MSG, sizeof MSG, sig.data, sig.len));
    keyfence_bytes_free(&sig);

    FAILS(KEYFENCE_INVALID_REQUEST, keyfence_engine_sign(e, ec_key, "bogus", (const uint8_t *)MSG, 3, 0, &sig));
    MESSAGE_HAS("bogus");
    FAILS(KEYFENCE_INVALID_REQUEST, keyfence_engine_sign(e, ec_key, "rsa-pss-sha256", (const uint8_t *)MSG, 3, 0, &sig));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_engine_sign(NULL, ec_key, "ed25519", (const uint8_t *)MSG, 3, 0, &sig));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_engine_sign(e, NULL, "ed25519", (const uint8_t *)MSG, 3, 0, &sig));
    CHECK(sig.data == NULL);
}

struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    keyfence_result result;
    uint8_t sig[512];
    size_t len;
};

static void on_done(void *ud, keyfence_result r, const uint8_t *sig, size_t len, const char *message) {
    struct waiter *w = ud;
    pthread_mutex_lock(&w->mu);
    w->result = r;
    if (r == KEYFENCE_OK && len <= sizeof w->sig) {
        memcpy(w->sig, sig, len);
        w->len = len;
    } else if (r != KEYFENCE_OK) {
        CHECK(message != NULL && strlen(message) > 0);
    }
    w->done++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void callback(keyfence_engine *e) {
    struct waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, KEYFENCE_OK, {0}, 0};
    keyfence_operation *op = NULL;
    OK(keyfence_engine_submit(e, ec_key, "ecdsa-p256-sha256", (const uint8_t *)MSG, sizeof MSG, 0, on_done, &w, &op));
    CHECK(keyfence_operation_id(op) != 0);
    pthread_mutex_lock(&w.mu);
    while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    CHECK(w.done == 1 && w.result == KEYFENCE_OK);
    CHECK(kf_openssl_verify(ec_ossl, MSG, sizeof MSG, w.sig, w.len));
    bool cancelled = true;
    OK(keyfence_operation_cancel(op, &cancelled));
    CHECK(!cancelled); /* it had already ended */
    keyfence_operation_free(op);
    keyfence_operation_free(NULL);
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_engine_submit(e, ec_key, "ed25519", (const uint8_t *)MSG, 1, 0, NULL, &w, NULL));
}

/* What the completions of a burst came to. */
struct outcomes {
    size_t ok, timed_out, cancelled;
};

static void count(const keyfence_completion *c, void *arg) {
    struct outcomes *o = arg;
    if (c->result == KEYFENCE_OK) o->ok++;
    else if (c->result == KEYFENCE_TIMED_OUT) o->timed_out++;
    else if (c->result == KEYFENCE_CANCELLED) o->cancelled++;
    else {
        fprintf(stderr, "completion: %s: %s\n", keyfence_result_name(c->result), (const char *)c->message.data);
        exit(1);
    }
}

/* One EC worker, a queue of 4: a burst is refused at once with
 * OVERLOADED, and what was accepted still completes. */
static void overload(void) {
    keyfence_engine_config *cfg = NULL;
    OK(keyfence_engine_config_new(&cfg));
    OK(keyfence_engine_config_set_class(cfg, KEYFENCE_CLASS_EC, 1, 4));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_engine_config_set_class(cfg, 7, 1, 1));
    keyfence_engine *e = NULL;
    OK(keyfence_engine_new(cfg, &e));
    keyfence_engine_config_free(cfg);
    keyfence_completion_queue *q = NULL;
    OK(keyfence_completion_queue_new(&q));
    size_t accepted = 0, refused = 0;
    for (int i = 0; i < 2000; i++) {
        keyfence_result r = keyfence_engine_submit_to_queue(e, ec_key, "ecdsa-p256-sha256", (const uint8_t *)MSG, sizeof MSG, 0, q, NULL, NULL);
        if (r == KEYFENCE_OK) accepted++;
        else {
            CHECK(r == KEYFENCE_OVERLOADED);
            refused++;
        }
    }
    CHECK(refused > 0);
    struct outcomes o = {0};
    kf_drain(q, accepted, 10000, count, &o);
    CHECK(o.ok + o.timed_out == accepted && o.cancelled == 0);
    keyfence_class_metrics m;
    OK(keyfence_engine_metrics(e, KEYFENCE_CLASS_EC, &m));
    CHECK(m.queue_capacity == 4 && m.workers == 1 && m.overloaded == refused);
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_engine_metrics(e, 9, &m));
    keyfence_completion_queue_free(q);
    keyfence_engine_free(e);
}

/* An engine whose RSA class has one worker, so RSA work queues up. */
static keyfence_engine *single_rsa_worker(void) {
    keyfence_engine_config *cfg = NULL;
    OK(keyfence_engine_config_new(&cfg));
    OK(keyfence_engine_config_set_class(cfg, KEYFENCE_CLASS_RSA, 1, 256));
    keyfence_engine *e = NULL;
    OK(keyfence_engine_new(cfg, &e));
    keyfence_engine_config_free(cfg);
    return e;
}

/* One RSA worker and a 1 ms deadline: the signatures that wait behind
 * others end TIMED_OUT, through the queue, and none hangs. */
static void deadline(void) {
    keyfence_engine *e = single_rsa_worker();
    keyfence_completion_queue *q = NULL;
    OK(keyfence_completion_queue_new(&q));
    for (int i = 0; i < 100; i++)
        OK(keyfence_engine_submit_to_queue(e, rsa_key, "rsa-pss-sha256", (const uint8_t *)MSG, sizeof MSG, 1, q, (void *)(uintptr_t)i, NULL));
    struct outcomes o = {0};
    kf_drain(q, 100, 10000, count, &o);
    CHECK(o.timed_out > 0);
    keyfence_completion_queue_free(q);
    keyfence_engine_free(e);
}

/* One RSA worker, 40 signatures queued, the last 20 cancelled: those
 * still waiting end CANCELLED through the queue and never run. */
static void cancel(void) {
    keyfence_engine *e = single_rsa_worker();
    keyfence_completion_queue *q = NULL;
    OK(keyfence_completion_queue_new(&q));
    keyfence_operation *ops[40];
    for (int i = 0; i < 40; i++)
        OK(keyfence_engine_submit_to_queue(e, rsa_key, "rsa-pss-sha256", (const uint8_t *)MSG, sizeof MSG, 0, q, NULL, &ops[i]));
    size_t ended_by_us = 0;
    for (int i = 20; i < 40; i++) {
        bool c = false;
        OK(keyfence_operation_cancel(ops[i], &c));
        ended_by_us += c;
    }
    for (int i = 0; i < 40; i++) keyfence_operation_free(ops[i]);
    struct outcomes o = {0};
    kf_drain(q, 40, 10000, count, &o);
    CHECK(ended_by_us > 0 && o.cancelled == ended_by_us && o.ok + o.cancelled == 40);
    keyfence_completion_queue_free(q);
    keyfence_engine_free(e);
}

/* The same signatures with the key held by the key process. */
static void isolated(const char *key_process) {
    for (int explicit_path = 0; explicit_path < 2; explicit_path++) {
        keyfence_engine *e = kf_isolated_engine(explicit_path ? key_process : NULL);
        char *pem;
        size_t n;
        EVP_PKEY *k = kf_openssl_key("P-256", &pem, &n);
        keyfence_private_key *held = NULL;
        OK(keyfence_key_from_pem(e, (const uint8_t *)pem, n, &held));
        free(pem);
        signs_p256(e, held, k, 0);
        keyfence_key_free(held);
        keyfence_engine_free(e);
        EVP_PKEY_free(k);
    }
    keyfence_engine_config *cfg = NULL;
    OK(keyfence_engine_config_new(&cfg));
    OK(keyfence_engine_config_set_isolated(cfg, "/nonexistent/keyfence-key-process"));
    keyfence_engine *e = NULL;
    FAILS(KEYFENCE_INVALID_CONFIG, keyfence_engine_new(cfg, &e));
    MESSAGE_HAS("does not exist");
    keyfence_engine_config_free(cfg);
}

/* An engine made before fork() (a preforking server): in the child it
 * starts its threads and its key process again on first use; keys in
 * memory keep working; a key the parent loaded into its key process fails
 * at once with SHUT_DOWN naming the fork, and loads again in the child.
 * Nothing hangs (an alarm ends a child that would), and the child ending
 * its copy of the engine leaves the parent's key process running. */
static void forked(const char *key_process) {
    keyfence_engine *e = NULL;
    OK(keyfence_engine_new(NULL, &e));
    keyfence_engine *iso = kf_isolated_engine(key_process);
    char *pem;
    size_t n;
    EVP_PKEY *k = kf_openssl_key("P-256", &pem, &n);
    keyfence_private_key *held = NULL;
    OK(keyfence_key_from_pem(iso, (const uint8_t *)pem, n, &held));
    keyfence_bytes sig = {0};
    /* Both engines' threads are running when the process forks. */
    OK(keyfence_engine_sign(e, ec_key, "ecdsa-p256-sha256", (const uint8_t *)MSG, sizeof MSG, 0, &sig));
    keyfence_bytes_free(&sig);
    OK(keyfence_engine_sign(iso, held, "ecdsa-p256-sha256", (const uint8_t *)MSG, sizeof MSG, 0, &sig));
    keyfence_bytes_free(&sig);
    fflush(NULL);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        alarm(20);
        for (int round = 0; round < 2; round++) {
            signs_p256(e, ec_key, ec_ossl, 1000);
        }
        FAILS(KEYFENCE_SHUT_DOWN,
              keyfence_engine_sign(iso, held, "ecdsa-p256-sha256", (const uint8_t *)MSG, sizeof MSG, 1000, &sig));
        MESSAGE_HAS("before this process");
        MESSAGE_HAS("load the key again");
        keyfence_private_key *again = NULL;
        OK(keyfence_key_from_pem(iso, (const uint8_t *)pem, n, &again));
        signs_p256(iso, again, k, 1000);
        keyfence_key_free(again);
        keyfence_key_free(held);
        keyfence_engine_free(iso);
        keyfence_engine_free(e);
        /* Not exit(): the parent's parts, left alone here, are no leak to
         * report. */
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent's key process lived through the child's end. */
    signs_p256(iso, held, k, 0);
    free(pem);
    EVP_PKEY_free(k);
    keyfence_key_free(held);
    keyfence_engine_free(iso);
    keyfence_engine_free(e);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    keys();
    keyfence_engine *e = NULL;
    OK(keyfence_engine_new(NULL, &e));
    blocking(e);
    callback(e);
    keyfence_engine_free(e);
    overload();
    deadline();
    cancel();
    isolated(argv[1]);
    forked(argv[1]);
    keyfence_key_free(ec_key);
    keyfence_key_free(rsa_key);
    keyfence_key_free(NULL);
    EVP_PKEY_free(ec_ossl);
    EVP_PKEY_free(rsa_ossl);
    printf("test_sign: ok\n");
    return 0;
}
