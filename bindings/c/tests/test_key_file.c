/* The key file reader of the C ABI (keyfence_key_file_*), which the
 * OpenSSL provider uses: both modes read back field by field, and every
 * malformed body refused with KEYFENCE_INVALID_PRIVATE_KEY and the field
 * at fault in the message. */
#include <stdint.h>

#include "check.h"

/* A body of version 1 built by hand: tag, big-endian length, value. */
static size_t field(uint8_t *out, size_t at, uint8_t tag, const void *value, size_t n) {
    out[at] = tag;
    out[at + 1] = (uint8_t)(n >> 24);
    out[at + 2] = (uint8_t)(n >> 16);
    out[at + 3] = (uint8_t)(n >> 8);
    out[at + 4] = (uint8_t)n;
    memcpy(out + at + 5, value, n);
    return at + 5 + n;
}

static size_t header(uint8_t *out) {
    memcpy(out, "KFKEY\x01", 6);
    return 6;
}

static void expect_text(const keyfence_key_file *f, uint32_t which, const char *want) {
    const char *got = (const char *)1;
    OK(keyfence_key_file_text(f, which, &got));
    if ((want == NULL) != (got == NULL) || (want != NULL && strcmp(want, got) != 0)) {
        fprintf(stderr, "field %u: got %s, expected %s\n", which, got ? got : "NULL", want ? want : "NULL");
        exit(1);
    }
}

/* A version 2 file in `b`: a key held by the agent on
 * /run/keyfence/agent.sock, with `spki` and `env`. Its length. */
static size_t agent_file(uint8_t *b, const uint8_t *spki, size_t spki_len, const uint8_t *env, size_t env_len) {
    size_t n = header(b);
    b[5] = 2;
    n = field(b, n, 1, "\x02", 1);
    n = field(b, n, 10, "/run/keyfence/agent.sock", 24);
    n = field(b, n, 2, spki, spki_len);
    return field(b, n, 3, env, env_len);
}

static void refused(const uint8_t *body, size_t n, const char *needle) {
    keyfence_key_file *f = NULL;
    FAILS(KEYFENCE_INVALID_PRIVATE_KEY, keyfence_key_file_parse(body, n, &f));
    CHECK(f == NULL);
    const char *msg = kf_last_message();
    if (strstr(msg, needle) == NULL) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", msg, needle);
        exit(1);
    }
}

int main(void) {
    static uint8_t b[4096];
    const uint8_t spki[] = {0x30, 0x59, 0x30, 0x13};
    const uint8_t env[] = {1, 2, 3, 4, 5};

    /* A local key naming its store only: the machine key is left to the
     * provider's configuration. */
    size_t n = header(b);
    n = field(b, n, 1, "\x00", 1);
    n = field(b, n, 4, "/var/lib/keyfence", 17);
    n = field(b, n, 2, spki, sizeof spki);
    n = field(b, n, 3, env, sizeof env);
    keyfence_key_file *f = NULL;
    OK(keyfence_key_file_parse(b, n, &f));
    CHECK(!keyfence_key_file_is_remote(f));
    const uint8_t *p = NULL;
    size_t len = 0;
    OK(keyfence_key_file_public_key(f, &p, &len));
    CHECK(len == sizeof spki && memcmp(p, spki, len) == 0);
    OK(keyfence_key_file_envelope(f, &p, &len));
    CHECK(len == sizeof env && memcmp(p, env, len) == 0);
    expect_text(f, KEYFENCE_KEY_FILE_STORE, "/var/lib/keyfence");
    expect_text(f, KEYFENCE_KEY_FILE_MACHINE_KEY, NULL);
    expect_text(f, KEYFENCE_KEY_FILE_TLS_CA, NULL);
    CHECK(keyfence_key_file_peer_count(f) == 0);
    const char *name, *addr, *attrs, *sn;
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_key_file_peer(f, 0, &name, &addr, &attrs, &sn));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_key_file_text(f, KEYFENCE_KEY_FILE_PKCS11_URI + 1, &name));
    expect_text(f, KEYFENCE_KEY_FILE_AGENT_SOCKET, NULL);
    expect_text(f, KEYFENCE_KEY_FILE_PKCS11_URI, NULL);
    CHECK(!keyfence_key_file_is_agent(f) && !keyfence_key_file_is_pkcs11(f));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_key_file_envelope(f, NULL, &len));
    keyfence_key_file_free(f);

    /* A remote key with two key servers, the second with a server name. */
    n = header(b);
    n = field(b, n, 1, "\x01", 1);
    n = field(b, n, 6, "/c.crt", 6);
    n = field(b, n, 7, "/c.key", 6);
    n = field(b, n, 8, "/ca.crt", 7);
    n = field(b, n, 9, "ks1\0" "127.0.0.1:9000\0" "role=ks", 26);
    n = field(b, n, 9, "ks2\0" "[::1]:9001\0" "role=ks\0" "ks.example", 33);
    n = field(b, n, 2, spki, sizeof spki);
    n = field(b, n, 3, env, sizeof env);
    OK(keyfence_key_file_parse(b, n, &f));
    CHECK(keyfence_key_file_is_remote(f));
    expect_text(f, KEYFENCE_KEY_FILE_TLS_KEY, "/c.key");
    expect_text(f, KEYFENCE_KEY_FILE_STORE, NULL);
    CHECK(keyfence_key_file_peer_count(f) == 2);
    OK(keyfence_key_file_peer(f, 0, &name, &addr, &attrs, &sn));
    CHECK(strcmp(name, "ks1") == 0 && strcmp(addr, "127.0.0.1:9000") == 0 && strcmp(attrs, "role=ks") == 0 && sn == NULL);
    OK(keyfence_key_file_peer(f, 1, &name, &addr, &attrs, &sn));
    CHECK(strcmp(addr, "[::1]:9001") == 0 && sn != NULL && strcmp(sn, "ks.example") == 0);
    keyfence_key_file_free(f);

    /* Version 2: a key held by an agent, named by its socket alone. */
    n = agent_file(b, spki, sizeof spki, env, sizeof env);
    OK(keyfence_key_file_parse(b, n, &f));
    CHECK(keyfence_key_file_is_agent(f) && !keyfence_key_file_is_remote(f));
    expect_text(f, KEYFENCE_KEY_FILE_AGENT_SOCKET, "/run/keyfence/agent.sock");
    expect_text(f, KEYFENCE_KEY_FILE_STORE, NULL);
    keyfence_key_file_free(f);

    /* Version 3: a key in a PKCS#11 token, named by its URI, with no
     * envelope; loaded here, or by an agent when the file names one. */
    static const char uri[] = "pkcs11:token=edge;object=tls-p256;type=private";
    size_t v3 = header(b);
    b[5] = 3;
    v3 = field(b, v3, 1, "\x03", 1);
    v3 = field(b, v3, 11, uri, sizeof uri - 1);
    v3 = field(b, v3, 2, spki, sizeof spki);
    OK(keyfence_key_file_parse(b, v3, &f));
    CHECK(keyfence_key_file_is_pkcs11(f) && !keyfence_key_file_is_agent(f) && !keyfence_key_file_is_remote(f));
    expect_text(f, KEYFENCE_KEY_FILE_PKCS11_URI, uri);
    expect_text(f, KEYFENCE_KEY_FILE_AGENT_SOCKET, NULL);
    expect_text(f, KEYFENCE_KEY_FILE_STORE, NULL);
    OK(keyfence_key_file_public_key(f, &p, &len));
    CHECK(len == sizeof spki && memcmp(p, spki, len) == 0);
    keyfence_key_file_free(f);
    v3 = field(b, v3, 10, "/run/keyfence/agent.sock", 24);
    OK(keyfence_key_file_parse(b, v3, &f));
    CHECK(keyfence_key_file_is_pkcs11(f));
    expect_text(f, KEYFENCE_KEY_FILE_PKCS11_URI, uri);
    expect_text(f, KEYFENCE_KEY_FILE_AGENT_SOCKET, "/run/keyfence/agent.sock");
    keyfence_key_file_free(f);
    /* The token mode and its URI are version 3's, not version 2's. */
    b[5] = 2;
    refused(b, v3, "field 1 (mode)");
    CHECK(!keyfence_key_file_is_pkcs11(NULL));

    /* Malformed bodies, each refused with the field at fault. */
    n = agent_file(b, spki, sizeof spki, env, sizeof env);
    refused(b, n - 2, "field 3 (envelope) at byte");
    refused(b, 9, "truncated inside the header of field 1 (mode)");
    refused((const uint8_t *)"KFKEY\x04", 6, "version 4 is not supported");
    refused((const uint8_t *)"-----BEGIN", 10, "bad magic");
    size_t m = field(b, n, 99, "x", 1);
    refused(b, m, "holds 99, which is no field's tag");
    m = header(b);
    m = field(b, m, 1, "\x01", 1);
    m = field(b, m, 2, spki, sizeof spki);
    m = field(b, m, 3, env, sizeof env);
    refused(b, m, "lacks its TLS files");
    m = header(b);
    m = field(b, m, 1, "\x00", 1);
    m = field(b, m, 1, "\x00", 1);
    refused(b, m, "field 1 (mode) is malformed or repeated");

    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_key_file_parse(NULL, 4, &f));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_key_file_parse(b, m, NULL));
    CHECK(!keyfence_key_file_is_remote(NULL) && !keyfence_key_file_is_agent(NULL) && keyfence_key_file_peer_count(NULL) == 0);
    keyfence_key_file_free(NULL);
    puts("test_key_file: ok");
    return 0;
}
