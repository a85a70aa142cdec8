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
    /* The job was abandoned while paused: the queue discards the result. */
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

    keyfence_completion_queue *q = NULL;
    keyfence_result r = keyfence_completion_queue_new(&q);
    if (r != KEYFENCE_OK) {
        kf_raise_keyfence(prov, KF_R_ENGINE, r, "no completion queue");
        return 0;
    }
    r = keyfence_engine_submit_to_queue(engine, key, alg, msg, len, 0, q, NULL, NULL);
    if (r != KEYFENCE_OK) {
        keyfence_completion_queue_free(q);
        kf_raise_keyfence(prov, KF_R_SIGN_FAILED, r, "keyfence could not sign");
        return 0;
    }
    if (!ASYNC_WAIT_CTX_set_wait_fd(wctx, &wait_key, keyfence_completion_queue_fd(q), q, cleanup)) {
        /* No way to pause: wait here. The engine's deadline bounds it. */
        keyfence_completion_queue_free(q);
        return blocking(prov, engine, key, alg, msg, len, out);
    }
    keyfence_completion done;
    size_t n = 0;
    for (;;) {
        memset(&done, 0, sizeof(done));
        r = keyfence_completion_queue_drain(q, &done, 1, &n);
        if (r != KEYFENCE_OK || n == 1) break;
        /* Resumed when the descriptor is readable (or by a spurious
         * wake-up, after which the queue is simply looked at again). */
        if (!ASYNC_pause_job()) {
            r = KEYFENCE_INTERNAL;
            break;
        }
    }
    ASYNC_WAIT_CTX_clear_fd(wctx, &wait_key);
    keyfence_completion_queue_free(q);
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
