#include "sign_wait.h"

#include <string.h>

#include <openssl/async.h>

/* The key under which the provider's fd is registered in a job's wait
 * context: its address is unique to this module. */
static const char wait_key;

static void cleanup(ASYNC_WAIT_CTX *ctx, const void *key, OSSL_ASYNC_FD fd, void *custom) {
    (void)ctx;
    (void)key;
    (void)fd;
    /* The wait context is freed (its connection ended): so is the queue,
     * which discards a result still to come. */
    keyfence_completion_queue_free(custom);
}

static int blocking(kf_prov *prov, keyfence_engine *engine, const keyfence_private_key *key, const char *alg,
                    const unsigned char *msg, size_t len, keyfence_bytes *out) {
    keyfence_result r = keyfence_engine_sign(engine, key, alg, msg, len, 0, out);
    if (r != KEYFENCE_OK) {
        kf_raise_keyfence(prov, KF_R_SIGN_FAILED, r, "keyfence could not sign");
        return 0;
    }
    return 1;
}

int kf_sign_wait(kf_prov *prov, keyfence_engine *engine, const keyfence_private_key *key, const char *alg,
                 const unsigned char *msg, size_t len, keyfence_bytes *out) {
    ASYNC_JOB *job = ASYNC_get_current_job();
    ASYNC_WAIT_CTX *wctx = job != NULL ? ASYNC_get_wait_ctx(job) : NULL;
    if (wctx == NULL) return blocking(prov, engine, key, alg, msg, len, out);

    /* One completion queue per wait context, registered once and closed
     * only when the context is freed (cleanup): a server such as HAProxy
     * puts the descriptor in its own poller and takes it out when the
     * connection ends, so it must not be closed (and its number reused)
     * under it after each signature. */
    keyfence_completion_queue *q = NULL;
    OSSL_ASYNC_FD fd = -1;
    void *custom = NULL;
    if (ASYNC_WAIT_CTX_get_fd(wctx, &wait_key, &fd, &custom) && custom != NULL) {
        q = custom;
    } else {
        keyfence_result nr = keyfence_completion_queue_new(&q);
        if (nr != KEYFENCE_OK) {
            kf_raise_keyfence(prov, KF_R_ENGINE, nr, "no completion queue");
            return 0;
        }
        if (!ASYNC_WAIT_CTX_set_wait_fd(wctx, &wait_key, keyfence_completion_queue_fd(q), q, cleanup)) {
            /* No way to pause: wait here. The engine's deadline bounds it. */
            keyfence_completion_queue_free(q);
            return blocking(prov, engine, key, alg, msg, len, out);
        }
    }
    keyfence_result r = keyfence_engine_submit_to_queue(engine, key, alg, msg, len, 0, q, NULL, NULL);
    if (r != KEYFENCE_OK) {
        kf_raise_keyfence(prov, KF_R_SIGN_FAILED, r, "keyfence could not sign");
        return 0;
    }
    keyfence_completion done;
    size_t n = 0;
    for (;;) {
        /* Paused before the first look, even if the signature is already
         * done: the server learns of the descriptor only from a paused job
         * (SSL_ERROR_WANT_ASYNC), and HAProxy, which later removes every
         * descriptor of the connection from its poller, requires it to have
         * been added. Resumed when the descriptor is readable (or by a
         * spurious wake-up, after which the queue is looked at again). */
        if (!ASYNC_pause_job()) {
            r = KEYFENCE_INTERNAL;
            break;
        }
        memset(&done, 0, sizeof(done));
        r = keyfence_completion_queue_drain(q, &done, 1, &n);
        if (r != KEYFENCE_OK || n == 1) break;
    }
    if (r != KEYFENCE_OK) {
        kf_raise_keyfence(prov, KF_R_ENGINE, r, "completion queue failed");
        return 0;
    }
    if (done.result != KEYFENCE_OK) {
        kf_raise(prov, KF_R_SIGN_FAILED, "keyfence could not sign: %s: %.*s", keyfence_result_name(done.result),
                 (int)done.message.len, done.message.data != NULL ? (const char *)done.message.data : "");
        keyfence_bytes_free(&done.message);
        keyfence_bytes_free(&done.signature);
        return 0;
    }
    keyfence_bytes_free(&done.message);
    *out = done.signature;
    return 1;
}
