/* Keys made and signatures checked by OpenSSL's libcrypto, an
 * implementation no one here wrote. */
#ifndef KEYFENCE_TEST_OPENSSL_KEYS_H
#define KEYFENCE_TEST_OPENSSL_KEYS_H

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>

#include "check.h"

/* A fresh key ("P-256" or "RSA-2048") as an OpenSSL key and as PEM. */
static inline EVP_PKEY *kf_openssl_key(const char *which, char **pem, size_t *pem_len) {
    EVP_PKEY *k = strcmp(which, "P-256") == 0 ? EVP_EC_gen("P-256") : EVP_RSA_gen(2048);
    CHECK(k != NULL);
    BIO *b = BIO_new(BIO_s_mem());
    CHECK(b != NULL && PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL) == 1);
    char *data = NULL;
    long n = BIO_get_mem_data(b, &data);
    CHECK(n > 0);
    *pem = malloc((size_t)n);
    CHECK(*pem != NULL);
    memcpy(*pem, data, (size_t)n);
    *pem_len = (size_t)n;
    BIO_free(b);
    return k;
}

/* Whether OpenSSL accepts `sig` over `msg` under SHA-256 (ECDSA DER, or
 * RSA PKCS#1 v1.5). */
static inline int kf_openssl_verify(EVP_PKEY *k, const void *msg, size_t len, const uint8_t *sig, size_t sig_len) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx != NULL && EVP_DigestVerifyInit(ctx, NULL, EVP_sha256(), NULL, k) == 1
          && EVP_DigestVerify(ctx, sig, sig_len, msg, len) == 1;
    EVP_MD_CTX_free(ctx);
    return ok;
}

#endif
