/* Issue 33: a C program whose engine keeps its keys in the isolated key
 * process loads a key from an envelope (keyfence_key_from_envelope) and
 * then holds none of the machine key's secret: its own memory
 * (/proc/self/mem, every readable mapping) is searched for the machine
 * key's secret points, as the file encodes them (big-endian coordinates)
 * and as blst holds them (little-endian 64-bit limbs in Montgomery form).
 * The same search then finds them once the program holds the machine key
 * itself (keyfence_machine_new), so the test can fail.
 *
 * The needles are kept masked (XOR 0x5a) so that the search does not find
 * its own copy; the machine key file's bytes, read here to make them, are
 * wiped at once.
 *
 * argv: keyfence-key-process, store directory, machine key file, envelope file. */
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

#define MASK 0x5a
#define MAX_NEEDLES 512
#define MAX_REGION ((uint64_t)1 << 30) /* sanitizer shadows and reservations are larger, and hold no heap */

typedef struct {
    uint8_t masked[48];
    int blst; /* 1: Montgomery limbs, 0: the file's encoding */
} needle;

static needle needles[MAX_NEEDLES];
static size_t n_needles;
/* The needles by their first (unmasked) byte, so the search looks at few
 * per position. */
static size_t by_first[256][MAX_NEEDLES];
static size_t n_by_first[256];

static void index_needles(void) {
    for (size_t k = 0; k < n_needles; k++) {
        size_t b = needles[k].masked[0] ^ MASK;
        by_first[b][n_by_first[b]++] = k;
    }
}

static void wipe(void *p, size_t n) {
    volatile uint8_t *v = p;
    while (n--) *v++ = 0;
}

/* The BLS12-381 base field modulus, little-endian 64-bit limbs. */
static const uint64_t P[6] = {
    0xb9feffffffffaaabULL, 0x1eabfffeb153ffffULL, 0x6730d2a0f6b0f624ULL,
    0x64774b84f38512bfULL, 0x4b1ba7b6434bacd7ULL, 0x1a0111ea397fe69aULL,
};

/* Adds a coordinate (48 bytes big-endian) in both forms. */
static void add_coordinate(const uint8_t *be) {
    CHECK(n_needles + 2 <= MAX_NEEDLES);
    needle *enc = &needles[n_needles++], *mont = &needles[n_needles++];
    for (int i = 0; i < 48; i++) enc->masked[i] = be[i] ^ MASK;
    enc->blst = 0;
    uint64_t v[6];
    for (int i = 0; i < 6; i++) {
        uint64_t limb = 0;
        for (int j = 0; j < 8; j++) limb = (limb << 8) | be[48 - 8 * (i + 1) + j];
        v[i] = limb;
    }
    /* x * 2^384 mod p by doubling: v < p < 2^381, so 2v fits 384 bits. */
    for (int k = 0; k < 384; k++) {
        uint64_t carry = 0;
        for (int i = 0; i < 6; i++) {
            uint64_t next = v[i] >> 63;
            v[i] = (v[i] << 1) | carry;
            carry = next;
        }
        int ge = 1;
        for (int i = 5; i >= 0; i--) {
            if (v[i] != P[i]) {
                ge = v[i] > P[i];
                break;
            }
        }
        if (ge) {
            uint64_t borrow = 0;
            for (int i = 0; i < 6; i++) {
                uint64_t d = v[i] - P[i] - borrow;
                borrow = (v[i] < P[i] || (v[i] == P[i] && borrow)) ? 1 : 0;
                v[i] = d;
            }
        }
    }
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 8; j++) mont->masked[8 * i + j] = (uint8_t)(v[i] >> (8 * j)) ^ MASK;
    mont->blst = 1;
    wipe(v, sizeof v);
}

/* A little-endian reader over the machine key (docs/wrapping.md). */
typedef struct {
    const uint8_t *p;
    size_t left;
} cursor;

static const uint8_t *take(cursor *c, size_t n) {
    CHECK(c->left >= n);
    const uint8_t *at = c->p;
    c->p += n;
    c->left -= n;
    return at;
}

static size_t u16(cursor *c) {
    const uint8_t *b = take(c, 2);
    return (size_t)b[0] | ((size_t)b[1] << 8);
}

static size_t u32(cursor *c) {
    const uint8_t *b = take(c, 4);
    return (size_t)b[0] | ((size_t)b[1] << 8) | ((size_t)b[2] << 16) | ((size_t)b[3] << 24);
}

static cursor bytes16(cursor *c) {
    size_t n = u16(c);
    cursor out = {take(c, n), n};
    return out;
}

/* A matrix (rows u16, cols u16, points of `width` bytes): every coordinate. */
static void matrix(cursor m, size_t width) {
    take(&m, 4);
    CHECK(m.left % width == 0 && m.left > 0);
    while (m.left) {
        const uint8_t *point = take(&m, width);
        for (size_t off = 0; off < width; off += 48) add_coordinate(point + off);
    }
}

/* Every secret coordinate of every attribute key in the machine key. */
static void parse_machine_key(const uint8_t *b, size_t len) {
    cursor r = {b, len};
    CHECK(memcmp(take(&r, 4), "KFM2", 4) == 0);
    take(&r, 32);
    for (size_t n = u16(&r); n > 0; n--) {
        bytes16(&r);
        bytes16(&r);
    }
    for (size_t keys = u16(&r); keys > 0; keys--) {
        take(&r, 4);
        size_t n = u32(&r);
        cursor k = {take(&r, n), n};
        bytes16(&k);                /* the attributes */
        matrix(bytes16(&k), 192);   /* k1, G2 */
        matrix(bytes16(&k), 96);    /* k2, G1 */
        for (int which = 0; which < 2; which++) /* k3, k3wild */
            for (size_t m = u16(&k); m > 0; m--) {
                bytes16(&k);
                matrix(bytes16(&k), 96);
            }
        CHECK(k.left == 0);
    }
    CHECK(r.left == 0);
}

/* The whole file in a buffer of its exact size (no copy left by growth). */
static uint8_t *read_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && st.st_size > 0);
    uint8_t *buf = malloc((size_t)st.st_size);
    CHECK(buf != NULL);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        CHECK(n > 0);
        got += (size_t)n;
    }
    close(fd);
    *len = got;
    return buf;
}

/* How many needles of each form are in this process's readable memory:
 * found[0] encoded, found[1] blst limbs. */
static void search_self(size_t found[2]) {
    static int hit[MAX_NEEDLES];
    memset(hit, 0, sizeof hit);
    FILE *maps = fopen("/proc/self/maps", "r");
    CHECK(maps != NULL);
    int mem = open("/proc/self/mem", O_RDONLY);
    CHECK(mem >= 0);
    /* Read the map first: reading changes the heap, and so the map. */
    static uint64_t starts[8192], ends[8192];
    size_t regions = 0;
    char line[4096];
    while (fgets(line, sizeof line, maps) && regions < 8192) {
        unsigned long long s, e;
        char perms[8];
        if (sscanf(line, "%llx-%llx %7s", &s, &e, perms) != 3 || perms[0] != 'r') continue;
        if (strstr(line, "[vvar") || strstr(line, "[vsyscall]") || e - s > MAX_REGION) continue;
        starts[regions] = s;
        ends[regions] = e;
        regions++;
    }
    fclose(maps);
    size_t total = 0;
    for (size_t r = 0; r < regions; r++) {
        size_t len = (size_t)(ends[r] - starts[r]);
        uint8_t *buf = malloc(len);
        CHECK(buf != NULL);
        ssize_t n = pread(mem, buf, len, (off_t)starts[r]);
        if (n > 0) {
            total += (size_t)n;
            for (size_t i = 0; i + 48 <= (size_t)n; i++) {
                size_t b = buf[i];
                for (size_t x = 0; x < n_by_first[b]; x++) {
                    size_t k = by_first[b][x];
                    size_t j = 1;
                    while (j < 48 && (buf[i + j] ^ MASK) == needles[k].masked[j]) j++;
                    if (j == 48) hit[k] = 1;
                }
            }
        }
        wipe(buf, len);
        free(buf);
    }
    close(mem);
    CHECK(total > (1u << 20));
    found[0] = found[1] = 0;
    for (size_t k = 0; k < n_needles; k++)
        if (hit[k]) found[needles[k].blst]++;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s KEY_PROCESS STORE MACHINE_KEY ENVELOPE\n", argv[0]);
        return 2;
    }
    const char *key_process = argv[1], *store = argv[2], *machine_key = argv[3];
    size_t len;
    uint8_t *mk = read_file(machine_key, &len);
    parse_machine_key(mk, len);
    wipe(mk, len);
    free(mk);
    CHECK(n_needles >= 2 * (3 * 4 + 4 * 2));
    index_needles();
    size_t env_len;
    uint8_t *env = read_file(argv[4], &env_len);

    keyfence_engine *engine = kf_isolated_engine(key_process);
    keyfence_private_key *key = NULL;
    OK(keyfence_key_from_envelope(engine, store, machine_key, env, env_len, &key));
    bool local = true;
    OK(keyfence_key_is_local(key, &local));
    CHECK(!local);
    keyfence_bytes sig = {0};
    OK(keyfence_engine_sign(engine, key, "ecdsa-p256-sha256", (const uint8_t *)"m", 1, 0, &sig));
    CHECK(sig.len > 0);
    keyfence_bytes_free(&sig);

    size_t found[2];
    search_self(found);
    if (found[0] || found[1]) {
        fprintf(stderr, "the isolated program holds the machine key's secret: %zu encoded, %zu blst coordinates\n",
                found[0], found[1]);
        return 1;
    }

    /* The control: with the machine key in this process, the search sees it. */
    mk = read_file(machine_key, &len);
    keyfence_machine *machine = NULL;
    OK(keyfence_machine_new(mk, len, store, &machine));
    wipe(mk, len);
    free(mk);
    search_self(found);
    CHECK(found[1] > 0);
    keyfence_machine_free(machine);

    keyfence_key_free(key);
    keyfence_engine_free(engine);
    free(env);
    printf("isolated: none of %zu secret coordinates in memory; with the machine key here: %zu found\n", n_needles / 2,
           found[1]);
    return 0;
}
