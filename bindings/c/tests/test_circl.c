/* CIRCL interop from C. Given a directory holding CIRCL's public key
 * (pk), an attribute key CIRCL issued (key), a ciphertext CIRCL made (ct)
 * and its plaintext (msg): the C API loads CIRCL's bytes, decrypts CIRCL's
 * ciphertext, and writes c.ct, a ciphertext of msg under the same policy
 * for CIRCL to decrypt (circl.cmake checks that side). */
#include "check.h"

static keyfence_bytes slurp(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    static unsigned char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    keyfence_bytes b = {buf, n};
    return b;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    const char *dir = argv[1];

    keyfence_bytes b = slurp(dir, "pk");
    keyfence_abe_public_key *pk = NULL;
    OK(keyfence_abe_public_key_from_bytes(b.data, b.len, &pk));
    b = slurp(dir, "key");
    keyfence_abe_attribute_key *key = NULL;
    OK(keyfence_abe_attribute_key_from_bytes(b.data, b.len, &key));

    b = slurp(dir, "msg");
    size_t msg_len = b.len;
    unsigned char msg[4096];
    CHECK(msg_len < sizeof msg);
    memcpy(msg, b.data, msg_len);

    b = slurp(dir, "ct");
    keyfence_bytes pt = {0}, policy = {0};
    OK(keyfence_abe_decrypt(key, b.data, b.len, &pt));
    CHECK(pt.len == msg_len && memcmp(pt.data, msg, msg_len) == 0);
    OK(keyfence_abe_policy_of(b.data, b.len, &policy));

    keyfence_bytes ct = {0};
    OK(keyfence_abe_encrypt(pk, (const char *)policy.data, msg, msg_len, &ct));
    char path[4096];
    snprintf(path, sizeof path, "%s/c.ct", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL && fwrite(ct.data, 1, ct.len, f) == ct.len);
    fclose(f);

    printf("test_circl: decrypted CIRCL's ciphertext under `%s`\n", (const char *)policy.data);
    keyfence_bytes_free(&ct);
    keyfence_bytes_free(&pt);
    keyfence_bytes_free(&policy);
    keyfence_abe_attribute_key_free(key);
    keyfence_abe_public_key_free(pk);
    return 0;
}
