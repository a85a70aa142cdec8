/* The unpacked C tarball, used as a user would: CP-ABE on CIRCL's bytes,
 * wrap and open, and a signature from the key process that the openssl
 * command line then verifies.
 *
 *   smoke PREFIX VECTORS_DIR WORK_DIR KEY_PEM SIG_OUT
 *
 * Prints the library's version. PREFIX is where the tarball was unpacked:
 * the libkeyfence this program runs with must come from there. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyfence.h>

static void fail(const char *what, keyfence_result rc) {
    char msg[512] = "";
    size_t n = 0;
    keyfence_error_message(msg, sizeof msg, &n);
    fprintf(stderr, "smoke: %s: %s %s\n", what, keyfence_result_name(rc), msg);
    exit(1);
}

/* The bytes of the file `name` in `dir` (NULL: `name` is the path). */
static unsigned char *slurp(const char *dir, const char *name, size_t *len) {
    char path[4096];
    snprintf(path, sizeof path, "%s%s%s", dir ? dir : "", dir ? "/" : "", name);
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    unsigned char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len == cap) {
            cap = cap ? cap * 2 : 4096;
            buf = realloc(buf, cap);
            if (!buf) exit(1);
        }
        size_t got = fread(buf + *len, 1, cap - *len, f);
        if (got == 0) break;
        *len += got;
    }
    fclose(f);
    return buf;
}

static void spill(const char *path, const uint8_t *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) { perror(path); exit(1); }
}

/* libkeyfence must be mapped from under `prefix`, found through the
 * program's RUNPATH, with no LD_LIBRARY_PATH. */
static void loaded_from(const char *prefix) {
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[8192];
    int seen = 0;
    char *real_prefix = realpath(prefix, NULL);
    if (!maps || !real_prefix) { perror("maps"); exit(1); }
    while (fgets(line, sizeof line, maps)) {
        char *path = strchr(line, '/');
        if (!path || !strstr(path, "libkeyfence")) continue;
        path[strcspn(path, "\n")] = 0;
        if (strncmp(path, real_prefix, strlen(real_prefix)) != 0) {
            fprintf(stderr, "smoke: libkeyfence loaded from %s, not under %s\n", path, real_prefix);
            exit(1);
        }
        seen = 1;
    }
    fclose(maps);
    free(real_prefix);
    if (!seen) { fprintf(stderr, "smoke: libkeyfence is not mapped\n"); exit(1); }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: smoke PREFIX VECTORS_DIR WORK_DIR KEY_PEM SIG_OUT\n");
        return 2;
    }
    const char *prefix = argv[1], *vectors = argv[2], *work = argv[3];
    loaded_from(prefix);
    char ok[4096], refused[4096], store[4096], machine_file[4096];
    snprintf(ok, sizeof ok, "%s/ok", vectors);
    snprintf(refused, sizeof refused, "%s/refused", vectors);
    snprintf(store, sizeof store, "%s/store", work);
    snprintf(machine_file, sizeof machine_file, "%s/fra1.machine", work);
    keyfence_result rc;

    /* CP-ABE: CIRCL's key and ciphertext. */
    size_t key_len, ct_len, plain_len;
    unsigned char *key_bytes = slurp(ok, "attribute_key.bin", &key_len);
    unsigned char *ct = slurp(ok, "ciphertext.bin", &ct_len);
    unsigned char *plain = slurp(ok, "plaintext.bin", &plain_len);
    struct keyfence_abe_attribute_key *key = NULL;
    if ((rc = keyfence_abe_attribute_key_from_bytes(key_bytes, key_len, &key))) fail("attribute key", rc);
    struct keyfence_bytes out = {0};
    if ((rc = keyfence_abe_decrypt(key, ct, ct_len, &out))) fail("decrypt", rc);
    if (out.len != plain_len || memcmp(out.data, plain, plain_len) != 0) {
        fprintf(stderr, "smoke: CIRCL ciphertext decrypted to other bytes\n");
        return 1;
    }
    keyfence_bytes_free(&out);
    keyfence_abe_attribute_key_free(key);
    free(key_bytes); free(ct); free(plain);
    key_bytes = slurp(refused, "attribute_key.bin", &key_len);
    ct = slurp(refused, "ciphertext.bin", &ct_len);
    if ((rc = keyfence_abe_attribute_key_from_bytes(key_bytes, key_len, &key))) fail("attribute key", rc);
    rc = keyfence_abe_decrypt(key, ct, ct_len, &out);
    if (rc != KEYFENCE_POLICY_NOT_SATISFIED) fail("a key outside the policy", rc);
    keyfence_abe_attribute_key_free(key);
    free(key_bytes); free(ct);

    /* Wrap a private key, open it on a machine. */
    size_t pem_len;
    unsigned char *pem = slurp(NULL, argv[4], &pem_len);
    struct keyfence_authority *auth = NULL;
    if ((rc = keyfence_authority_init(store, &auth))) fail("authority", rc);
    struct keyfence_bytes envelope = {0}, machine_key = {0}, opened = {0};
    if ((rc = keyfence_authority_wrap(auth, "region: EU and not country: DE", pem, pem_len, &envelope))) fail("wrap", rc);
    if ((rc = keyfence_authority_issue(auth, "region=EU,country=FR", &machine_key))) fail("issue", rc);
    spill(machine_file, machine_key.data, machine_key.len);
    struct keyfence_machine *machine = NULL;
    if ((rc = keyfence_machine_new(machine_key.data, machine_key.len, store, &machine))) fail("machine", rc);
    if ((rc = keyfence_machine_open(machine, envelope.data, envelope.len, &opened))) fail("open", rc);
    if (opened.len != pem_len || memcmp(opened.data, pem, pem_len) != 0) {
        fprintf(stderr, "smoke: the envelope opened to other bytes\n");
        return 1;
    }
    keyfence_bytes_free(&opened);

    /* Sign in the key process, installed beside the library. */
    struct keyfence_engine_config *config = NULL;
    struct keyfence_engine *engine = NULL;
    if ((rc = keyfence_engine_config_new(&config))) fail("config", rc);
    if ((rc = keyfence_engine_config_set_isolated(config, NULL))) fail("isolated", rc);
    if ((rc = keyfence_engine_new(config, &engine))) fail("engine", rc);
    struct keyfence_private_key *sk = NULL;
    if ((rc = keyfence_key_from_envelope(engine, store, machine_file, envelope.data, envelope.len, &sk))) fail("key", rc);
    bool local = true;
    if ((rc = keyfence_key_is_local(sk, &local)) || local) fail("the key is not in the key process", rc);
    static const char data[] = "release smoke test";
    struct keyfence_bytes sig = {0};
    if ((rc = keyfence_engine_sign(engine, sk, "ecdsa-p256-sha256", (const uint8_t *)data, strlen(data), 0, &sig))) fail("sign", rc);
    spill(argv[5], sig.data, sig.len);
    keyfence_bytes_free(&sig);
    keyfence_key_free(sk);
    keyfence_engine_free(engine);
    keyfence_engine_config_free(config);
    keyfence_machine_free(machine);
    keyfence_bytes_free(&envelope); keyfence_bytes_free(&machine_key);
    keyfence_authority_free(auth);
    free(pem);
    printf("%s\n", keyfence_version());
    return 0;
}
