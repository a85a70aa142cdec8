/* Assertions for keyfence's C tests: each failure prints the call, the
 * result's name and keyfence's message for the calling thread. */
#ifndef KEYFENCE_TEST_CHECK_H
#define KEYFENCE_TEST_CHECK_H

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

#endif
