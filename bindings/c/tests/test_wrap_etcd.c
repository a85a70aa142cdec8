/* Policy-key wrapping through the C API on any store name: argv[1] is the
 * store (etcd.cmake passes an etcd://... name on a three-member cluster,
 * vectors/etcd-fixture.sh). An authority wraps, a machine opens, follows
 * the store, and sees a master rotation arrive through the watch. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "check.h"

static void pause_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Waits (up to 30 s) until the machine has received `n` generation lists. */
static keyfence_cache_stats wait_propagations(const keyfence_machine *m, uint64_t n) {
    keyfence_cache_stats s;
    for (int i = 0; i < 3000; i++) {
        OK(keyfence_machine_cache_stats(m, &s));
        if (s.propagations >= n) return s;
        pause_ms(10);
    }
    fprintf(stderr, "no rotation reached the machine in 30 s (%llu lists seen)\n", (unsigned long long)s.propagations);
    exit(1);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *store = argv[1];
    keyfence_authority *auth = NULL;
    OK(keyfence_authority_init(store, &auth));

    keyfence_bytes key = {0}, env = {0}, out = {0};
    OK(keyfence_authority_issue(auth, "region=EU", &key));
    const char *secret = "-----BEGIN PRIVATE KEY-----\n...";
    OK(keyfence_authority_wrap(auth, "region: EU", (const uint8_t *)secret, strlen(secret), &env));

    keyfence_machine *m = NULL;
    OK(keyfence_machine_new(key.data, key.len, store, &m));
    OK(keyfence_machine_open(m, env.data, env.len, &out));
    CHECK(out.len == strlen(secret) && memcmp(out.data, secret, out.len) == 0);
    keyfence_bytes_free(&out);

    OK(keyfence_machine_follow(m));
    OK(keyfence_machine_follow(m)); /* a second call changes nothing */
    keyfence_cache_stats before;
    OK(keyfence_machine_cache_stats(m, &before));
    CHECK(before.propagations == 0 && before.misses == 1 && before.entries == 1);

    size_t resealed = 0;
    OK(keyfence_authority_rotate_master(auth, &resealed));
    CHECK(resealed == 1);
    keyfence_cache_stats after = wait_propagations(m, 1);
    CHECK(after.watch_events >= 1 && after.resyncs == 0);
    CHECK(after.propagation_last_us <= after.propagation_max_us && after.propagation_max_us < 30000000);
    OK(keyfence_machine_open(m, env.data, env.len, &out));
    keyfence_bytes_free(&out);

    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_machine_follow(NULL));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_machine_cache_stats(m, NULL));

    keyfence_machine_free(m);
    keyfence_bytes_free(&env);
    keyfence_bytes_free(&key);
    keyfence_authority_free(auth);
    printf("test_wrap_etcd: ok on %s (rotation seen %llu us after its commit)\n", store,
           (unsigned long long)after.propagation_last_us);
    return 0;
}
