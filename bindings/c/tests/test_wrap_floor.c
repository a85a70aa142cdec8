/* A machine's floor kept across processes (issue 55.9): a machine made
 * with keyfence_machine_new_with_state keeps the newest generation list it
 * accepted in a state file, and a NEW process whose machine names the same
 * file refuses a store rolled back to an older list (REPLAYED_OBJECT); a
 * machine without the file takes the old list (the control). And
 * keyfence_machine_newest_lists / keyfence_machine_require hand the floor
 * from one machine to another.
 *
 * Run without arguments it is the test; it runs itself again (fork and
 * exec, a fresh process) as
 *   test_wrap_floor open STORE KEY_FILE ENVELOPE_FILE STATE|- EXPECTED_CODE
 * which opens the envelope once and exits 0 if the result is the one
 * expected. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static size_t read_file(const char *path, uint8_t *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    size_t n = fread(buf, 1, cap, f);
    CHECK(n < cap);
    fclose(f);
    return n;
}

static void write_file(const char *path, const uint8_t *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    CHECK(fwrite(data, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

/* The child: one open in a process that has accepted nothing yet. */
static int child(char **argv) {
    const char *store = argv[2], *key_path = argv[3], *env_path = argv[4], *state = argv[5], *want = argv[6];
    static uint8_t key[1 << 16], env[1 << 16];
    size_t key_len = read_file(key_path, key, sizeof key), env_len = read_file(env_path, env, sizeof env);
    keyfence_machine *m = NULL;
    if (strcmp(state, "-") == 0) {
        OK(keyfence_machine_new(key, key_len, store, &m));
    } else {
        OK(keyfence_machine_new_with_state(key, key_len, store, state, &m));
    }
    keyfence_bytes out = {0};
    keyfence_result r = keyfence_machine_open(m, env, env_len, &out);
    const char *got = keyfence_result_name((uint32_t)r);
    printf("child (state %s): %s%s%s\n", state, got, r == KEYFENCE_OK ? "" : ": ", r == KEYFENCE_OK ? "" : kf_last_message());
    keyfence_bytes_free(&out);
    keyfence_machine_free(m);
    return strcmp(got, want) == 0 ? 0 : 1;
}

/* Runs this program again as a child that opens `env_path`; true if the
 * child got `want`. */
static bool in_new_process(const char *self, const char *store, const char *key_path, const char *env_path,
                           const char *state, const char *want) {
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        char *args[] = {(char *)self, "open", (char *)store, (char *)key_path, (char *)env_path, (char *)state, (char *)want, NULL};
        execv(self, args);
        perror("execv");
        _exit(127);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(int argc, char **argv) {
    if (argc == 7 && strcmp(argv[1], "open") == 0) return child(argv);
    CHECK(argc == 1);

    char dir[] = "/tmp/keyfence-c-floor-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char store[128], other_store[128], generations[160], key_path[128], env_path[128], state[128], missing[160],
        bad_state[128];
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(other_store, sizeof other_store, "%s/other", dir);
    snprintf(generations, sizeof generations, "%s/public/generations", store);
    snprintf(key_path, sizeof key_path, "%s/fra.key", dir);
    snprintf(env_path, sizeof env_path, "%s/secret.env", dir);
    snprintf(state, sizeof state, "%s/fra.key.newest", dir);
    snprintf(missing, sizeof missing, "%s/no-such-folder/fra.key.newest", dir);
    snprintf(bad_state, sizeof bad_state, "%s/bad.newest", dir);

    keyfence_authority *auth = NULL;
    OK(keyfence_authority_init(store, &auth));
    keyfence_bytes key = {0}, env = {0};
    OK(keyfence_authority_issue(auth, "region=EU,country=DE", &key));
    const char *secret = "-----BEGIN PRIVATE KEY-----\n...";
    OK(keyfence_authority_wrap(auth, "region: EU", (const uint8_t *)secret, strlen(secret), &env));
    write_file(key_path, key.data, key.len);
    write_file(env_path, env.data, env.len);

    /* What a store writer will put back: the list from before the rotation
     * (generation 1 active), which the authority did sign. After the
     * rotation generation 1 is decrypt-only and 2 is active. */
    static uint8_t old_list[1 << 16];
    size_t old_len = read_file(generations, old_list, sizeof old_list);
    size_t resealed = 0;
    OK(keyfence_authority_rotate_master(auth, &resealed));
    CHECK(resealed == 1);

    /* The machine that keeps its floor accepts the new list and writes it
     * to its state file. */
    keyfence_machine *kept = NULL;
    CHECK(access(state, F_OK) != 0);
    OK(keyfence_machine_new_with_state(key.data, key.len, store, state, &kept));
    keyfence_bytes out = {0};
    OK(keyfence_machine_open(kept, env.data, env.len, &out));
    CHECK(out.len == strlen(secret) && memcmp(out.data, secret, out.len) == 0);
    keyfence_bytes_free(&out);
    struct stat st;
    CHECK(stat(state, &st) == 0 && st.st_size > 4);

    /* The store is rolled back. */
    write_file(generations, old_list, old_len);

    /* A new process with the same state file refuses it; a new process
     * without one takes it and opens (the control: the old list is the
     * authority's, and generation 1 is live in it). */
    CHECK(in_new_process(argv[0], store, key_path, env_path, state, "REPLAYED_OBJECT"));
    CHECK(in_new_process(argv[0], store, key_path, env_path, "-", "OK"));
    /* And once more: the refusal changed nothing in the file. */
    CHECK(in_new_process(argv[0], store, key_path, env_path, state, "REPLAYED_OBJECT"));

    /* newest_lists and require, between two machines of one process: a
     * machine that keeps no file, required to the kept machine's lists,
     * refuses the rolled-back store; one that was not, takes it. */
    keyfence_bytes lists = {0};
    OK(keyfence_machine_newest_lists(kept, &lists));
    CHECK(lists.len > 4 && memcmp(lists.data, "KFN2", 4) == 0);
    keyfence_machine *required = NULL, *plain = NULL;
    OK(keyfence_machine_new(key.data, key.len, store, &required));
    OK(keyfence_machine_new(key.data, key.len, store, &plain));
    keyfence_bytes empty = {0};
    OK(keyfence_machine_newest_lists(plain, &empty));   /* has accepted nothing: both lists absent */
    CHECK(empty.len == 12 && memcmp(empty.data, "KFN2", 4) == 0);
    OK(keyfence_machine_require(required, empty.data, empty.len));   /* no floor, no change */
    OK(keyfence_machine_require(required, lists.data, lists.len));
    OK(keyfence_machine_require(required, lists.data, lists.len));   /* the same floor again */
    FAILS(KEYFENCE_REPLAYED_OBJECT, keyfence_machine_open(required, env.data, env.len, &out));
    MESSAGE_HAS("generation list");
    OK(keyfence_machine_open(plain, env.data, env.len, &out));
    keyfence_bytes_free(&out);
    /* What it accepted round-trips: the required machine hands on the same
     * lists it was given. */
    keyfence_bytes again = {0};
    OK(keyfence_machine_newest_lists(required, &again));
    CHECK(again.len == lists.len && memcmp(again.data, lists.data, lists.len) == 0);
    keyfence_bytes_free(&again);

    /* Bad floors: bytes that are no lists, lists another authority signed,
     * NULLs. Nothing is required then. */
    FAILS(KEYFENCE_INVALID_ENVELOPE, keyfence_machine_require(plain, (const uint8_t *)"KFE2", 4));
    FAILS(KEYFENCE_INVALID_ENVELOPE, keyfence_machine_require(plain, lists.data, lists.len - 1));
    MESSAGE_HAS("newest lists");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_machine_require(NULL, lists.data, lists.len));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_machine_require(plain, NULL, 3));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_machine_newest_lists(plain, NULL));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_machine_newest_lists(NULL, &again));
    keyfence_authority *other = NULL;
    OK(keyfence_authority_init(other_store, &other));
    keyfence_bytes other_key = {0}, other_env = {0}, other_lists = {0};
    OK(keyfence_authority_issue(other, "region=EU", &other_key));
    OK(keyfence_authority_wrap(other, "region: EU", (const uint8_t *)"x", 1, &other_env));
    keyfence_machine *stranger = NULL;
    OK(keyfence_machine_new(other_key.data, other_key.len, other_store, &stranger));
    OK(keyfence_machine_open(stranger, other_env.data, other_env.len, &out));
    keyfence_bytes_free(&out);
    OK(keyfence_machine_newest_lists(stranger, &other_lists));
    FAILS(KEYFENCE_WRONG_AUTHORITY, keyfence_machine_require(plain, other_lists.data, other_lists.len));
    OK(keyfence_machine_open(plain, env.data, env.len, &out));   /* still no floor */
    keyfence_bytes_free(&out);

    /* A floor that cannot be kept is an error when the machine is made;
     * a file that does not decode names itself. */
    keyfence_machine *m = NULL;
    FAILS(KEYFENCE_STORE_IO, keyfence_machine_new_with_state(key.data, key.len, store, missing, &m));
    MESSAGE_HAS("no-such-folder");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_machine_new_with_state(key.data, key.len, store, NULL, &m));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_machine_new_with_state(key.data, key.len, store, state, NULL));
    FAILS(KEYFENCE_INVALID_KEY, keyfence_machine_new_with_state((const uint8_t *)"nope", 4, store, state, &m));
    write_file(bad_state, (const uint8_t *)"not lists", 9);
    FAILS(KEYFENCE_INVALID_ENVELOPE, keyfence_machine_new_with_state(key.data, key.len, store, bad_state, &m));
    MESSAGE_HAS("bad.newest");
    CHECK(m == NULL);

    keyfence_bytes_free(&lists);
    keyfence_bytes_free(&empty);
    keyfence_bytes_free(&other_lists);
    keyfence_bytes_free(&other_key);
    keyfence_bytes_free(&other_env);
    keyfence_bytes_free(&key);
    keyfence_bytes_free(&env);
    keyfence_machine_free(kept);
    keyfence_machine_free(required);
    keyfence_machine_free(plain);
    keyfence_machine_free(stranger);
    keyfence_authority_free(other);
    keyfence_authority_free(auth);

    kf_remove_tree(dir);
    printf("test_wrap_floor: ok\n");
    return 0;
}
