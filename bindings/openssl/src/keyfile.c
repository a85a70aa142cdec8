/* The key file's body, version 1:
 *   "KFKEY" (5 bytes), version (1 byte, = 1),
 *   then fields: tag (1 byte), length (4 bytes, big-endian), value.
 * Text values are UTF-8 without a NUL; a peer is name NUL addr NUL attrs
 * [NUL server-name]. Every limit is checked before it is used, so a
 * truncated or hostile file is refused with the field at fault. */
#include "keyfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FIELD (1u << 20)

static int fail(char *err, size_t cap, const char *msg) {
    snprintf(err, cap, "%s", msg);
    return -1;
}

static char *text(const uint8_t *p, size_t n) {
    if (memchr(p, 0, n) != NULL) return NULL;
    char *s = malloc(n + 1);
    if (s == NULL) return NULL;
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

static uint8_t *bytes(const uint8_t *p, size_t n) {
    uint8_t *b = malloc(n ? n : 1);
    if (b != NULL) memcpy(b, p, n);
    return b;
}

static int peer(const uint8_t *p, size_t n, kf_peer *out) {
    /* Split on NUL: 3 or 4 parts, none empty but server-name. */
    const char *parts[4] = {0};
    size_t lens[4] = {0}, k = 0, start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || p[i] == 0) {
            if (k == 4) return -1;
            parts[k] = (const char *)p + start;
            lens[k] = i - start;
            k++;
            start = i + 1;
        }
    }
    if (k < 3 || lens[0] == 0 || lens[1] == 0 || lens[2] == 0) return -1;
    char **dst[4] = {&out->name, &out->addr, &out->attrs, &out->server_name};
    for (size_t i = 0; i < k; i++) {
        if (i == 3 && lens[3] == 0) break;
        *dst[i] = text((const uint8_t *)parts[i], lens[i]);
        if (*dst[i] == NULL) return -1;
    }
    return 0;
}

int kf_keyfile_parse(const uint8_t *d, size_t len, kf_keyfile *f, char *err, size_t cap) {
    memset(f, 0, sizeof(*f));
    f->mode = -1;
    size_t ml = strlen(KF_FILE_MAGIC);
    if (len < ml + 1 || memcmp(d, KF_FILE_MAGIC, ml) != 0)
        return fail(err, cap, "not a keyfence key file body (bad magic)");
    if (d[ml] != KF_FILE_VERSION) {
        snprintf(err, cap, "key file version %u is not supported (this provider reads version %u)", d[ml],
                 KF_FILE_VERSION);
        return -1;
    }
    size_t i = ml + 1;
    while (i < len) {
        if (len - i < 5) {
            kf_keyfile_clear(f);
            return fail(err, cap, "key file truncated inside a field header");
        }
        unsigned tag = d[i];
        size_t n = ((size_t)d[i + 1] << 24) | ((size_t)d[i + 2] << 16) | ((size_t)d[i + 3] << 8) | d[i + 4];
        i += 5;
        if (n > MAX_FIELD || n > len - i) {
            kf_keyfile_clear(f);
            snprintf(err, cap, "key file truncated: field %u claims %zu bytes, %zu remain", tag, n, len - i);
            return -1;
        }
        const uint8_t *v = d + i;
        i += n;
        int ok = 1;
        char **slot = NULL;
        switch (tag) {
        case KF_TAG_MODE:
            if (n != 1 || v[0] > 1 || f->mode != -1) ok = 0;
            else f->mode = v[0];
            break;
        case KF_TAG_PUBLIC_KEY:
            if (f->spki != NULL || n == 0 || (f->spki = bytes(v, n)) == NULL) ok = 0;
            f->spki_len = n;
            break;
        case KF_TAG_ENVELOPE:
            if (f->envelope != NULL || n == 0 || (f->envelope = bytes(v, n)) == NULL) ok = 0;
            f->envelope_len = n;
            break;
        case KF_TAG_STORE: slot = &f->store; break;
        case KF_TAG_MACHINE_KEY: slot = &f->machine_key; break;
        case KF_TAG_TLS_CERT: slot = &f->tls_cert; break;
        case KF_TAG_TLS_KEY: slot = &f->tls_key; break;
        case KF_TAG_TLS_CA: slot = &f->tls_ca; break;
        case KF_TAG_PEER:
            if (f->n_peers == KF_MAX_PEERS || peer(v, n, &f->peers[f->n_peers]) != 0) ok = 0;
            else f->n_peers++;
            break;
        default:
            kf_keyfile_clear(f);
            snprintf(err, cap, "key file has unknown field %u", tag);
            return -1;
        }
        if (slot != NULL) {
            if (*slot != NULL || n == 0 || (*slot = text(v, n)) == NULL) ok = 0;
        }
        if (!ok) {
            kf_keyfile_clear(f);
            snprintf(err, cap, "key file field %u is malformed or repeated", tag);
            return -1;
        }
    }
    const char *missing = NULL;
    if (f->mode == -1) missing = "mode";
    else if (f->spki == NULL) missing = "public key";
    else if (f->envelope == NULL) missing = "envelope";
    else if (f->mode == KF_MODE_REMOTE && (f->tls_cert == NULL || f->tls_key == NULL || f->tls_ca == NULL))
        missing = "TLS files of a remote key";
    else if (f->mode == KF_MODE_REMOTE && f->n_peers == 0) missing = "peers of a remote key";
    if (missing != NULL) {
        kf_keyfile_clear(f);
        snprintf(err, cap, "key file lacks its %s", missing);
        return -1;
    }
    return 0;
}

void kf_keyfile_clear(kf_keyfile *f) {
    free(f->spki);
    free(f->envelope);
    free(f->store);
    free(f->machine_key);
    free(f->tls_cert);
    free(f->tls_key);
    free(f->tls_ca);
    for (size_t i = 0; i < f->n_peers; i++) {
        free(f->peers[i].name);
        free(f->peers[i].addr);
        free(f->peers[i].attrs);
        free(f->peers[i].server_name);
    }
    /* A partly parsed peer (parse failed midway) is freed here too. */
    if (f->n_peers < KF_MAX_PEERS) {
        kf_peer *p = &f->peers[f->n_peers];
        free(p->name);
        free(p->addr);
        free(p->attrs);
        free(p->server_name);
    }
    memset(f, 0, sizeof(*f));
}
