/* An epoll event loop, as nginx or h2o would run one, submits thousands of
 * ECDSA and RSA signatures through a completion queue and keeps running
 * while they are computed: a 1 ms timer on the same loop keeps firing, and
 * every signature is verified with OpenSSL's libcrypto, linked into the
 * same program beside libkeyfence. */
#define _GNU_SOURCE
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "openssl_keys.h"

#define N_EC 4000
#define N_RSA 400
#define WINDOW 512

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int main(void) {
    char *pem;
    size_t n;
    EVP_PKEY *ec_ossl = kf_openssl_key("P-256", &pem, &n);
    keyfence_private_key *ec = NULL, *rsa = NULL;
    OK(keyfence_key_from_pem(NULL, (const uint8_t *)pem, n, &ec));
    free(pem);
    EVP_PKEY *rsa_ossl = kf_openssl_key("RSA-2048", &pem, &n);
    OK(keyfence_key_from_pem(NULL, (const uint8_t *)pem, n, &rsa));
    free(pem);

    keyfence_engine *engine = NULL;
    OK(keyfence_engine_new(NULL, &engine));
    keyfence_completion_queue *q = NULL;
    OK(keyfence_completion_queue_new(&q));

    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 1};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, keyfence_completion_queue_fd(q), &ev) == 0);
    int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    CHECK(timer >= 0);
    struct itimerspec every_ms = {{0, 1000000}, {0, 1000000}};
    CHECK(timerfd_settime(timer, 0, &every_ms, NULL) == 0);
    ev.data.u32 = 2;
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, timer, &ev) == 0);

    const int total = N_EC + N_RSA;
    int submitted = 0, verified = 0, in_flight = 0, overloaded = 0;
    uint64_t ticks = 0;
    double start = now_ms(), last_wake = start, worst_gap = 0;
    char msg[64];
    while (verified < total) {
        /* Keep a window of operations in flight, as connections would. */
        while (submitted < total && in_flight < WINDOW) {
            int i = submitted;
            int is_rsa = i % 11 == 0 && i / 11 < N_RSA;
            int len = snprintf(msg, sizeof msg, "handshake %d", i);
            keyfence_result r = keyfence_engine_submit_to_queue(
                engine, is_rsa ? rsa : ec, is_rsa ? "rsa-pkcs1-sha256" : "ecdsa-p256-sha256", (const uint8_t *)msg,
                (size_t)len, 0, q, (void *)(uintptr_t)(i + 1), NULL);
            if (r == KEYFENCE_OVERLOADED) {
                overloaded++;
                break; /* shed: try again on the next turn of the loop */
            }
            OK(r);
            submitted++;
            in_flight++;
        }
        struct epoll_event events[4];
        int k = epoll_wait(ep, events, 4, 5000);
        CHECK(k > 0);
        double t = now_ms();
        if (t - last_wake > worst_gap) worst_gap = t - last_wake;
        last_wake = t;
        for (int e = 0; e < k; e++) {
            if (events[e].data.u32 == 2) {
                uint64_t fired;
                if (read(timer, &fired, sizeof fired) == (ssize_t)sizeof fired) ticks += fired;
                continue;
            }
            keyfence_completion c[64];
            size_t got;
            do {
                OK(keyfence_completion_queue_drain(q, c, 64, &got));
                for (size_t j = 0; j < got; j++) {
                    int i = (int)(uintptr_t)c[j].user_data - 1;
                    CHECK(c[j].result == KEYFENCE_OK);
                    int is_rsa = i % 11 == 0 && i / 11 < N_RSA;
                    int len = snprintf(msg, sizeof msg, "handshake %d", i);
                    CHECK(kf_openssl_verify(is_rsa ? rsa_ossl : ec_ossl, msg, (size_t)len, c[j].signature.data, c[j].signature.len));
                    keyfence_bytes_free(&c[j].signature);
                    keyfence_bytes_free(&c[j].message);
                    verified++;
                    in_flight--;
                }
            } while (got == 64);
        }
    }
    double elapsed = now_ms() - start;
    printf("test_event_loop: %d signatures (%d RSA) verified by OpenSSL in %.0f ms; timer fired %llu times; "
           "longest loop stall %.1f ms; %d submissions shed as overloaded\n",
           total, N_RSA, elapsed, (unsigned long long)ticks, worst_gap, overloaded);
    /* The loop never waited on a signature: it woke up at least every few
     * milliseconds for the timer the whole time (loose bounds: shared CI
     * machines and sanitizers). */
    CHECK(ticks >= (uint64_t)(elapsed / 20));
    CHECK(worst_gap < 1000);

    close(timer);
    close(ep);
    keyfence_completion_queue_free(q);
    keyfence_engine_free(engine);
    keyfence_key_free(ec);
    keyfence_key_free(rsa);
    EVP_PKEY_free(ec_ossl);
    EVP_PKEY_free(rsa_ossl);
    return 0;
}
