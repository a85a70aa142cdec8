/* OpenSSL's libcrypto and libkeyfence (AWS-LC inside, not exported) in
 * one process: each answers with its own implementation, and OpenSSL
 * verifies a digest keyfence's user computes beside it. */
#include <openssl/evp.h>
#include <openssl/opensslv.h>

#include "check.h"

int main(void) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    CHECK(EVP_Digest("abc", 3, md, &n, EVP_sha256(), NULL) == 1);
    CHECK(n == 32 && md[0] == 0xba && md[31] == 0xad);
    /* The OpenSSL in this process is OpenSSL, not AWS-LC leaking through. */
    CHECK(OPENSSL_VERSION_NUMBER >= 0x10100000L);
    CHECK(strstr(OpenSSL_version(OPENSSL_VERSION), "OpenSSL") != NULL);

    keyfence_abe_public_key *pk = NULL;
    keyfence_abe_master_key *msk = NULL;
    keyfence_abe_attribute_key *key = NULL;
    keyfence_bytes ct = {0}, pt = {0};
    OK(keyfence_abe_setup(&pk, &msk));
    OK(keyfence_abe_keygen(msk, "region=EU", &key));
    OK(keyfence_abe_encrypt(pk, "region: EU", md, n, &ct));
    OK(keyfence_abe_decrypt(key, ct.data, ct.len, &pt));
    CHECK(pt.len == n && memcmp(pt.data, md, n) == 0);
    keyfence_bytes_free(&ct);
    keyfence_bytes_free(&pt);
    keyfence_abe_attribute_key_free(key);
    keyfence_abe_master_key_free(msk);
    keyfence_abe_public_key_free(pk);
    printf("test_openssl_together: ok\n");
    return 0;
}
