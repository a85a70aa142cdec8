/* Assertions for keyfence's C tests: each failure prints the call, the
 * result's name and keyfence's message for the calling thread. */
#ifndef KEYFENCE_TEST_CHECK_H
#define KEYFENCE_TEST_CHECK_H

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keyfence.h"

static inline const char *kf_last_message(void) {
    static char buf[4096];
    size_t n = 0;
    keyfence_error_message(buf, sizeof buf, &n);
    return buf;
}

/* The call must succeed. */
#define OK(call)                                                                        \
    do {                                                                                \
        keyfence_result r_ = (call);                                                    \
        if (r_ != KEYFENCE_OK) {                                                        \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,         \
                    keyfence_result_name((uint32_t)r_), kf_last_message());              \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* The call must fail with `want`. */
#define FAILS(want, call)                                                               \
    do {                                                                                \
        keyfence_result r_ = (call);                                                    \
        if (r_ != (want)) {                                                             \
            fprintf(stderr, "%s:%d: %s -> %s, expected %s: %s\n", __FILE__, __LINE__,   \
                    #call, keyfence_result_name((uint32_t)r_),                          \
                    keyfence_result_name((uint32_t)(want)), kf_last_message());         \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);    \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* The last error message must contain `needle`. */
#define MESSAGE_HAS(needle) CHECK(strstr(kf_last_message(), (needle)) != NULL)

/* Removes a test's scratch directory `dir` (made by mkdtemp, so its name
 * holds no quote) with everything in it. */
static inline void kf_remove_tree(const char *dir) {
    char cmd[4200];
    CHECK(strchr(dir, '\'') == NULL && (size_t)snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir) < sizeof cmd);
    CHECK(system(cmd) == 0);
}

/* An engine whose keys are held by the key process at `key_process`
 * (NULL: the one installed beside the library), with the default
 * classes: how every test that signs through the sandbox starts. */
static inline keyfence_engine *kf_isolated_engine(const char *key_process) {
    keyfence_engine_config *cfg = NULL;
    keyfence_engine *e = NULL;
    OK(keyfence_engine_config_new(&cfg));
    OK(keyfence_engine_config_set_isolated(cfg, key_process));
    OK(keyfence_engine_new(cfg, &e));
    keyfence_engine_config_free(cfg);
    return e;
}

/* Called by kf_drain for each completion; the completion's buffers are
 * freed after it returns. */
typedef void (*kf_completion_fn)(const keyfence_completion *c, void *arg);

/* Drains `q` until `want` completions arrived, waiting on its descriptor
 * (at most `timeout_ms` for each batch: a completion that never comes
 * fails the test instead of hanging it), handing each to `each`. */
static inline void kf_drain(keyfence_completion_queue *q, size_t want, int timeout_ms, kf_completion_fn each, void *arg) {
    keyfence_completion c[32];
    struct pollfd p = {keyfence_completion_queue_fd(q), POLLIN, 0};
    for (size_t got = 0; got < want;) {
        CHECK(poll(&p, 1, timeout_ms) == 1);
        size_t n = 0;
        OK(keyfence_completion_queue_drain(q, c, 32, &n));
        for (size_t i = 0; i < n; i++) {
            each(&c[i], arg);
            keyfence_bytes_free(&c[i].signature);
            keyfence_bytes_free(&c[i].message);
        }
        got += n;
    }
}

#endif
