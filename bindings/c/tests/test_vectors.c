/* The vector file every language runs (vectors/shared.kfv, format in
 * vectors/README.md) through the C API: the same answers and error codes
 * as the Rust core, Python and Node. The file's path is the argument. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "check.h"

#include <stdbool.h>

#define MAX_FIELDS 32
#define MAX_LINE (1 << 20)

struct field {
    char *name;
    char *value;
};

struct vector {
    struct field f[MAX_FIELDS];
    size_t n;
};

static const char *get(const struct vector *v, const char *name) {
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->f[i].name, name) == 0) return v->f[i].value;
    return NULL;
}

static const char *need(const struct vector *v, const char *name) {
    const char *s = get(v, name);
    if (!s) {
        fprintf(stderr, "vector %s lacks %s\n", get(v, "name"), name);
        exit(1);
    }
    return s;
}

static uint8_t *unhex(const char *s, size_t *len) {
    size_t n = strlen(s);
    CHECK(n % 2 == 0);
    uint8_t *out = malloc(n / 2 + 1);
    CHECK(out != NULL);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned int b;
        CHECK(sscanf(s + 2 * i, "%2x", &b) == 1);
        out[i] = (uint8_t)b;
    }
    *len = n / 2;
    return out;
}

/* Appends `s` as a quoted word of the attribute syntax. */
static void quote(char *out, size_t cap, const char *s) {
    size_t n = strlen(out);
    CHECK(n + 2 * strlen(s) + 3 < cap);
    out[n++] = '"';
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') out[n++] = '\\';
        out[n++] = *s;
    }
    out[n++] = '"';
    out[n] = 0;
}

/* The vector's `attribute: label=value` lines as `"label"="value",...`. */
static void attributes(const struct vector *v, char *out, size_t cap) {
    out[0] = 0;
    for (size_t i = 0; i < v->n; i++) {
        if (strcmp(v->f[i].name, "attribute") != 0) continue;
        char *eq = strchr(v->f[i].value, '=');
        CHECK(eq != NULL);
        if (out[0]) strcat(out, ",");
        *eq = 0;
        quote(out, cap, v->f[i].value);
        *eq = '=';
        strcat(out, "=");
        quote(out, cap, eq + 1);
    }
}

/* What a call gave, in the file's terms. */
static void outcome(keyfence_result r, const char *ok, char *out, size_t cap) {
    if (r == KEYFENCE_OK)
        snprintf(out, cap, "%s", ok);
    else
        snprintf(out, cap, "error %s", keyfence_result_name((uint32_t)r));
}

static void expect(const struct vector *v, const char *got) {
    if (strcmp(got, need(v, "expect")) != 0) {
        fprintf(stderr, "vector %s: got `%s`, expected `%s` (%s)\n", need(v, "name"), got, need(v, "expect"),
                kf_last_message());
        exit(1);
    }
}

static void run(const struct vector *v) {
    const char *kind = need(v, "kind");
    char attrs[4096], got[256];
    attributes(v, attrs, sizeof attrs);
    if (strcmp(kind, "policy-check") == 0) {
        bool sat = false;
        keyfence_result r = keyfence_policy_check(need(v, "policy"), attrs, &sat);
        if (r != KEYFENCE_OK && get(v, "position")) {
            size_t pos = 0;
            CHECK(keyfence_error_position(&pos));
            CHECK(pos == (size_t)strtoul(get(v, "position"), NULL, 10));
        }
        outcome(r, sat ? "true" : "false", got, sizeof got);
        expect(v, got);
    } else if (strcmp(kind, "policy-canonical") == 0) {
        keyfence_bytes c = {0};
        OK(keyfence_policy_canonical(need(v, "policy"), &c));
        CHECK(strcmp((const char *)c.data, need(v, "canonical")) == 0);
        keyfence_bytes_free(&c);
        expect(v, "ok");
    } else if (strcmp(kind, "abe-key") == 0) {
        size_t n;
        uint8_t *b = unhex(need(v, "bytes"), &n);
        const char *object = need(v, "object");
        keyfence_result r;
        if (strcmp(object, "public-key") == 0) {
            keyfence_abe_public_key *k = NULL;
            r = keyfence_abe_public_key_from_bytes(b, n, &k);
            keyfence_abe_public_key_free(k);
        } else if (strcmp(object, "master-key") == 0) {
            keyfence_abe_master_key *k = NULL;
            r = keyfence_abe_master_key_from_bytes(b, n, &k);
            keyfence_abe_master_key_free(k);
        } else {
            CHECK(strcmp(object, "attribute-key") == 0);
            keyfence_abe_attribute_key *k = NULL;
            r = keyfence_abe_attribute_key_from_bytes(b, n, &k);
            keyfence_abe_attribute_key_free(k);
        }
        free(b);
        outcome(r, "ok", got, sizeof got);
        expect(v, got);
    } else if (strcmp(kind, "abe-decrypt") == 0) {
        size_t pn, kn, cn;
        uint8_t *pkb = unhex(need(v, "public_key"), &pn), *kb = unhex(need(v, "attribute_key"), &kn),
                *ct = unhex(need(v, "ciphertext"), &cn);
        keyfence_abe_public_key *pk = NULL;
        keyfence_abe_attribute_key *key = NULL;
        OK(keyfence_abe_public_key_from_bytes(pkb, pn, &pk));
        OK(keyfence_abe_attribute_key_from_bytes(kb, kn, &key));
        keyfence_bytes pt = {0};
        keyfence_result r = keyfence_abe_decrypt(key, ct, cn, &pt);
        outcome(r, "ok", got, sizeof got);
        expect(v, got);
        if (r == KEYFENCE_OK) {
            size_t wn;
            uint8_t *want = unhex(need(v, "plaintext"), &wn);
            CHECK(pt.len == wn && (wn == 0 || memcmp(pt.data, want, wn) == 0));
            free(want);
        }
        keyfence_bytes_free(&pt);
        if (get(v, "policy_of")) {
            keyfence_bytes p = {0};
            OK(keyfence_abe_policy_of(ct, cn, &p));
            CHECK(strcmp((const char *)p.data, get(v, "policy_of")) == 0);
            keyfence_bytes_free(&p);
        }
        if (get(v, "could_decrypt")) {
            bool could = false;
            OK(keyfence_abe_could_decrypt(attrs, ct, cn, &could));
            CHECK(strcmp(could ? "true" : "false", get(v, "could_decrypt")) == 0);
        }
        keyfence_abe_public_key_free(pk);
        keyfence_abe_attribute_key_free(key);
        free(pkb);
        free(kb);
        free(ct);
    } else {
        fprintf(stderr, "vector %s: unknown kind %s\n", need(v, "name"), kind);
        exit(1);
    }
}

static void clear(struct vector *v) {
    for (size_t i = 0; i < v->n; i++) {
        free(v->f[i].name);
        free(v->f[i].value);
    }
    v->n = 0;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    FILE *f = fopen(argv[1], "r");
    CHECK(f != NULL);
    char *line = malloc(MAX_LINE);
    CHECK(line != NULL);
    struct vector v = {0};
    static const char *const kinds[] = {"policy-check", "policy-canonical", "abe-key", "abe-decrypt"};
    bool seen[4] = {false, false, false, false};
    int ran = 0;
    for (;;) {
        bool eof = fgets(line, MAX_LINE, f) == NULL;
        if (!eof) {
            size_t n = strlen(line);
            CHECK(n > 0 && line[n - 1] == '\n'); /* no line longer than the buffer */
            line[n - 1] = 0;
            if (line[0] == '#') continue;
        }
        if (eof || line[0] == 0) {
            if (v.n) {
                run(&v);
                ran++;
                for (int i = 0; i < 4; i++) seen[i] |= strcmp(need(&v, "kind"), kinds[i]) == 0;
                clear(&v);
            }
            if (eof) break;
            continue;
        }
        char *sep = strstr(line, ": ");
        CHECK(sep != NULL && v.n < MAX_FIELDS);
        *sep = 0;
        v.f[v.n].name = strdup(line);
        v.f[v.n].value = strdup(sep + 2);
        v.n++;
    }
    fclose(f);
    free(line);
    CHECK(ran >= 20 && seen[0] && seen[1] && seen[2] && seen[3]);
    printf("%d shared vectors passed\n", ran);
    return 0;
}
