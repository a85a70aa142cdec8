/* The smallest program a user writes: encrypt under a policy, decrypt. */
#include <stdio.h>
#include <string.h>

#include <keyfence.h>

int main(void) {
    keyfence_abe_public_key *pk = NULL;
    keyfence_abe_master_key *msk = NULL;
    keyfence_abe_attribute_key *key = NULL;
    keyfence_bytes ct = {0}, pt = {0};
    int ok = keyfence_abe_setup(&pk, &msk) == KEYFENCE_OK
          && keyfence_abe_keygen(msk, "region=EU", &key) == KEYFENCE_OK
          && keyfence_abe_encrypt(pk, "region: EU", (const uint8_t *)"hi", 2, &ct) == KEYFENCE_OK
          && keyfence_abe_decrypt(key, ct.data, ct.len, &pt) == KEYFENCE_OK
          && pt.len == 2 && memcmp(pt.data, "hi", 2) == 0;
    keyfence_bytes_free(&ct);
    keyfence_bytes_free(&pt);
    keyfence_abe_attribute_key_free(key);
    keyfence_abe_master_key_free(msk);
    keyfence_abe_public_key_free(pk);
    printf("keyfence %s: %s\n", keyfence_version(), ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
