/*
 * crypto_mb's own known answers for ECDSA P-256 and P-384 (its FIPS
 * self-tests' vectors, from FIPS 186-4), run against the library named on
 * the command line: the stand-in on every machine, Intel's where its
 * algorithm info says it runs. Both must give the same bytes, which pins
 * the stand-in's formats (big-endian messages and signatures,
 * little-endian keys and nonces) to the real library's. Exit 0 when every
 * algorithm that runs matches; it prints `SKIP <algo>` for one that does
 * not run here (never called: on a CPU without AVX-512 IFMA crypto_mb's
 * code dies of an illegal instruction).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef unsigned char int8u;
typedef unsigned long long int64u;
typedef unsigned int mbx_status;
typedef mbx_status (*sign_fn)(int8u *[8], int8u *[8], const int8u *const[8], const int64u *const[8], const int64u *const[8],
                              int8u *);
typedef int64u (*info_fn)(int);
typedef int (*applicable_fn)(int64u);

static void hex(const char *s, unsigned char *out, int n) {
    for (int i = 0; i < n; i++) sscanf(s + 2 * i, "%2hhx", &out[i]);
}

static int check(void *lib, const char *fname, int algo, int bytes, const char *msg, const char *d_le, const char *k_le,
                 const char *r_be, const char *s_be) {
    info_fn info = (info_fn)dlsym(lib, "mbx_get_algo_info");
    applicable_fn applicable = (applicable_fn)dlsym(lib, "mbx_is_crypto_mb_applicable");
    sign_fn sign = (sign_fn)dlsym(lib, fname);
    if (!info || !applicable || !sign) {
        printf("FAIL %s: missing symbols\n", fname);
        return 1;
    }
    if (!applicable(0) || info(algo) != 8) {
        printf("SKIP %s: it does not run on this CPU\n", fname);
        return 0;
    }
    unsigned char m[48], want_r[48], want_s[48], r[8][48], s[8][48];
    int64u d[6], k[6];
    hex(msg, m, bytes), hex(r_be, want_r, bytes), hex(s_be, want_s, bytes);
    hex(d_le, (unsigned char *)d, bytes), hex(k_le, (unsigned char *)k, bytes);
    int8u *rp[8], *sp[8];
    const int8u *mp[8];
    const int64u *kp[8], *dp[8];
    for (int i = 0; i < 8; i++) rp[i] = r[i], sp[i] = s[i], mp[i] = m, kp[i] = k, dp[i] = d;
    mbx_status st = sign(rp, sp, mp, kp, dp, NULL);
    for (int i = 0; i < 8; i++) {
        if (((st >> (4 * i)) & 0xF) || memcmp(r[i], want_r, bytes) || memcmp(s[i], want_s, bytes)) {
            printf("FAIL %s: lane %d (status %#x)\n", fname, i, st);
            return 1;
        }
    }
    printf("OK %s\n", fname);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: kat LIBRARY\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("FAIL: %s\n", dlerror());
        return 1;
    }
    int bad = check(lib, "mbx_nistp256_ecdsa_sign_mb8", 5, 32, "44acf6b7e36c1342c2c5897204fe09504e1e2efb1a900377dbc4e7a6a133ec56",
                    "64b472da6da554caac3e4e0b13c8445b1a77f459eea84f1f588b5f713d429b51",
                    "de682a64870767b9335d4f8247624a3b7f3ce9f945f280a2616a904bb1bba194",
                    "f3ac8061b514795b8843e3d6629527ed2afd6b1f6a555a7acabb5e6f79c8c2ac",
                    "8bf77819ca05a6b2786c76262bf7371cef97b218e96f175a3ccdda2acc058903");
    bad |= check(lib, "mbx_nistp384_ecdsa_sign_mb8", 6, 48,
                 "31a452d6164d904bb5724c878280231eae705c29ce9d4bc7d58e020e1085f17eebcc1a38f0ed0bf2b344d81fbd896825",
                 "97ac80b04f9f4429bce3bcccb75d2f95c25ef4bd6c1ea40d372ed5824428a8463f4b3edb61622d182443f18d2d431b20",
                 "71c7c9251f1ec817f997bfe56ce18588db8352a2580fa076668ce25c6eed9ddf34fa4666e1c633f790e07859f8abeddc",
                 "50835a9251bad008106177ef004b091a1e4235cd0da84fff54542b0ed755c1d6f251609d14ecf18f9e1ddfe69b946e32",
                 "0475f3d30c6463b646e8d3bf2455830314611cbde404be518b14464fdb195fdcc92eb222e61f426a4a592c00a6a89721");
    return bad;
}
