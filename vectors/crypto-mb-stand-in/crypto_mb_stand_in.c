/*
 * A stand-in for Intel's crypto_mb (libcrypto_mb.so.13) for keyfence's
 * tests: the same exported names and ABI as the entry points keyfence
 * calls, each lane computed in software with OpenSSL, so that the
 * multi-buffer device runs on every machine. Written from crypto_mb's
 * public headers (cpu_features.h, rsa.h, ec_nistp256.h, ec_nistp384.h,
 * version.h, status.h) and its documented formats: arrays of eight
 * pointers, one a lane, a NULL pointer leaving its lane out; integers as
 * big-endian bytes (int8u*: inputs, results, r and s) or little-endian
 * 64-bit words (int64u*: a key's parts, the nonce); four status bits a
 * lane. kat.c checks it against crypto_mb's own known answers, and runs
 * the same check against Intel's library where the CPU has AVX-512 IFMA.
 *
 * Behaviour the tests choose, read from the environment at each call:
 *   KF_MB_MODE      all (default): every algorithm runs; unsupported:
 *                   mbx_is_crypto_mb_applicable and mbx_get_algo_info say
 *                   no (a CPU without AVX-512 IFMA); l9: RSA and P-256
 *                   only (a CPU with AVX-IFMA but not AVX-512)
 *   KF_MB_FAIL_LANE N: lane N's status is an error, its result unset
 *   KF_MB_WRONG_LANE N: lane N's result has a byte flipped, status 0 (a
 *                   wrong answer only the public-key check catches)
 *   KF_MB_SLOW_US N: each call sleeps N microseconds first
 *   KF_MB_LOG PATH: each call appends "rsa BITS LANES" or "ecdsa BITS
 *                   LANES" to PATH (how a test sees the device was used)
 */
#define _GNU_SOURCE
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/obj_mac.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef unsigned char int8u;
typedef unsigned long long int64u;
typedef unsigned int mbx_status;

#define STS_OK 0u
#define STS_MISMATCH 1u
#define STS_NULL 2u
#define STS_SIGNATURE 8u
#define SET_STS(status, lane, err) ((status) | ((mbx_status)(err) << (4 * (lane))))

typedef struct {
    int major, minor, patch;
    char targetCpu[4];
    const char *name, *buildDate, *strVersion;
} mbxVersion;

static const mbxVersion version = {2, 3, 0, "sw", "crypto_mb stand-in", "keyfence tests",
                                   "crypto_mb stand-in for keyfence's tests (OpenSSL in software)"};

const mbxVersion *mbx_getversion(void) { return &version; }

static const char *mode(void) {
    const char *m = getenv("KF_MB_MODE");
    return m ? m : "all";
}

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

/* Whether lane `i` does no work, as crypto_mb answers: a NULL among its
 * buffers (`missing`: STS_NULL), or the lane a test asked to fail
 * (KF_MB_FAIL_LANE: STS_MISMATCH). Counts the lanes that had buffers. */
static int skip_lane(int i, int missing, int fail, mbx_status *status, int *lanes) {
    if (missing) {
        *status = SET_STS(*status, i, STS_NULL);
        return 1;
    }
    (*lanes)++;
    if (i == fail) {
        *status = SET_STS(*status, i, STS_MISMATCH);
        return 1;
    }
    return 0;
}

static void delay(void) {
    int us = env_int("KF_MB_SLOW_US");
    if (us > 0) usleep((useconds_t)us);
}

static void log_call(const char *what, int bits, int lanes) {
    const char *path = getenv("KF_MB_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %d %d\n", what, bits, lanes);
    fclose(f);
}

int mbx_is_crypto_mb_applicable(int64u cpu_features) {
    (void)cpu_features;
    return strcmp(mode(), "unsupported") != 0;
}

/* enum MBX_ALGO: RSA 1K-4K 0-3, X25519 4, P-256 5, P-384 6, P-521 7, ...
 * ED25519 14. 8 lanes where the algorithm runs, 0 where not. */
int64u mbx_get_algo_info(int algo) {
    if (strcmp(mode(), "unsupported") == 0) return 0;
    if (strcmp(mode(), "l9") == 0) return (algo >= 0 && algo <= 3) || algo == 5 ? 8 : 0;
    return (algo >= 0 && algo <= 3) || algo == 5 || algo == 6 ? 8 : 0;
}

/* An RSA method: the operation and size it is for. */
typedef struct {
    int bits;
} mbx_RSA_Method;

static const mbx_RSA_Method crt1k = {1024}, crt2k = {2048}, crt3k = {3072}, crt4k = {4096};

const mbx_RSA_Method *mbx_RSA_private_crt_Method(int bits) {
    switch (bits) {
    case 1024: return &crt1k;
    case 2048: return &crt2k;
    case 3072: return &crt3k;
    case 4096: return &crt4k;
    default: return NULL;
    }
}

int mbx_RSA_Method_BufSize(const mbx_RSA_Method *m) { return m ? 4096 : 0; }

/* A little-endian integer of `bytes` bytes (64-bit words, native order on
 * x86-64) as a BIGNUM. */
static BIGNUM *le(const int64u *words, int bytes) { return BN_lebin2bn((const unsigned char *)words, bytes, NULL); }

mbx_status mbx_rsa_private_crt_mb8(const int8u *const from_pa[8], int8u *const to_pa[8], const int64u *const p_pa[8],
                                   const int64u *const q_pa[8], const int64u *const dp_pa[8], const int64u *const dq_pa[8],
                                   const int64u *const iq_pa[8], int bits, const mbx_RSA_Method *m, int8u *buffer) {
    (void)buffer;
    if (!from_pa || !to_pa || !p_pa || !q_pa || !dp_pa || !dq_pa || !iq_pa) return 0x22222222u;
    if (bits != 1024 && bits != 2048 && bits != 3072 && bits != 4096) return 0x11111111u;
    if (m && m->bits != bits) return 0x11111111u;
    delay();
    int fail = env_int("KF_MB_FAIL_LANE"), wrong = env_int("KF_MB_WRONG_LANE");
    int half = bits / 16, bytes = bits / 8, lanes = 0;
    mbx_status status = 0;
    BN_CTX *ctx = BN_CTX_new();
    for (int i = 0; i < 8; i++) {
        int missing = !from_pa[i] || !to_pa[i] || !p_pa[i] || !q_pa[i] || !dp_pa[i] || !dq_pa[i] || !iq_pa[i];
        if (skip_lane(i, missing, fail, &status, &lanes)) continue;
        BIGNUM *c = BN_bin2bn(from_pa[i], bytes, NULL), *p = le(p_pa[i], half), *q = le(q_pa[i], half);
        BIGNUM *dp = le(dp_pa[i], half), *dq = le(dq_pa[i], half), *iq = le(iq_pa[i], half);
        BIGNUM *m1 = BN_new(), *m2 = BN_new(), *h = BN_new(), *r = BN_new();
        /* m1 = c^dp mod p, m2 = c^dq mod q, h = iq (m1 - m2) mod p, r = m2 + h q */
        int ok = BN_mod_exp(m1, c, dp, p, ctx) && BN_mod_exp(m2, c, dq, q, ctx) && BN_mod_sub(h, m1, m2, p, ctx) &&
                 BN_mod_mul(h, h, iq, p, ctx) && BN_mul(r, h, q, ctx) && BN_add(r, r, m2) &&
                 BN_bn2binpad(r, to_pa[i], bytes) == bytes;
        if (!ok) status = SET_STS(status, i, STS_MISMATCH);
        else if (i == wrong) to_pa[i][bytes / 2] ^= 0x5a;
        BN_clear_free(c), BN_clear_free(p), BN_clear_free(q), BN_clear_free(dp), BN_clear_free(dq), BN_clear_free(iq);
        BN_clear_free(m1), BN_clear_free(m2), BN_clear_free(h), BN_clear_free(r);
    }
    BN_CTX_free(ctx);
    log_call("rsa", bits, lanes);
    return status;
}

/* ECDSA on `nid`'s curve: e (big-endian), k and d (little-endian words),
 * r and s out (big-endian), all of the curve's size; crypto_mb's checks
 * (k, d not 0; e not 0 and below n) and answers. */
static mbx_status ecdsa(int nid, int bytes, int8u *r_pa[8], int8u *s_pa[8], const int8u *const msg_pa[8],
                        const int64u *const k_pa[8], const int64u *const d_pa[8]) {
    if (!r_pa || !s_pa || !msg_pa || !k_pa || !d_pa) return 0x22222222u;
    delay();
    int fail = env_int("KF_MB_FAIL_LANE"), wrong = env_int("KF_MB_WRONG_LANE"), lanes = 0;
    mbx_status status = 0;
    EC_GROUP *g = EC_GROUP_new_by_curve_name(nid);
    BN_CTX *ctx = BN_CTX_new();
    const BIGNUM *n = EC_GROUP_get0_order(g);
    for (int i = 0; i < 8; i++) {
        if (skip_lane(i, !r_pa[i] || !s_pa[i] || !msg_pa[i] || !k_pa[i] || !d_pa[i], fail, &status, &lanes)) continue;
        BIGNUM *e = BN_bin2bn(msg_pa[i], bytes, NULL), *k = le(k_pa[i], bytes), *d = le(d_pa[i], bytes);
        BIGNUM *x = BN_new(), *r = BN_new(), *s = BN_new(), *kinv = BN_new();
        EC_POINT *R = EC_POINT_new(g);
        if (BN_is_zero(e) || BN_cmp(e, n) >= 0 || BN_is_zero(k) || BN_is_zero(d)) {
            status = SET_STS(status, i, STS_MISMATCH);
        } else if (!EC_POINT_mul(g, R, k, NULL, NULL, ctx) || !EC_POINT_get_affine_coordinates(g, R, x, NULL, ctx) ||
                   !BN_nnmod(r, x, n, ctx) || !BN_mod_inverse(kinv, k, n, ctx) || !BN_mod_mul(s, d, r, n, ctx) ||
                   !BN_mod_add(s, s, e, n, ctx) || !BN_mod_mul(s, s, kinv, n, ctx)) {
            status = SET_STS(status, i, STS_MISMATCH);
        } else if (BN_is_zero(r) || BN_is_zero(s)) {
            status = SET_STS(status, i, STS_SIGNATURE);
        } else {
            BN_bn2binpad(r, r_pa[i], bytes);
            BN_bn2binpad(s, s_pa[i], bytes);
            if (i == wrong) s_pa[i][bytes - 1] ^= 0x01;
        }
        BN_clear_free(e), BN_clear_free(k), BN_clear_free(d), BN_clear_free(x), BN_clear_free(r), BN_clear_free(s);
        BN_clear_free(kinv);
        EC_POINT_clear_free(R);
    }
    BN_CTX_free(ctx);
    EC_GROUP_free(g);
    log_call("ecdsa", bytes * 8, lanes);
    return status;
}

mbx_status mbx_nistp256_ecdsa_sign_mb8(int8u *r_pa[8], int8u *s_pa[8], const int8u *const msg_pa[8],
                                       const int64u *const k_pa[8], const int64u *const d_pa[8], int8u *buffer) {
    (void)buffer;
    return ecdsa(NID_X9_62_prime256v1, 32, r_pa, s_pa, msg_pa, k_pa, d_pa);
}

mbx_status mbx_nistp384_ecdsa_sign_mb8(int8u *r_pa[8], int8u *s_pa[8], const int8u *const msg_pa[8],
                                       const int64u *const k_pa[8], const int64u *const d_pa[8], int8u *buffer) {
    (void)buffer;
    return ecdsa(NID_secp384r1, 48, r_pa, s_pa, msg_pa, k_pa, d_pa);
}
