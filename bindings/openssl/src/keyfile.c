/* The key file's body is read by keyfence's core (keyfence_key_file_parse,
 * the one reader of the format, which the command line's writer shares);
 * this copies what it read into the provider's own struct, which outlives
 * the handle. */
#include "keyfile.h"

#include <keyfence.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int dup_text(const char *s, char **out) {
    if (s == NULL) return 0;
    *out = strdup(s);
    return *out == NULL ? -1 : 0;
}

static int dup_bytes(const uint8_t *p, size_t n, uint8_t **out, size_t *out_len) {
    *out = malloc(n ? n : 1);
    if (*out == NULL) return -1;
    memcpy(*out, p, n);
    *out_len = n;
    return 0;
}

static int copy(const keyfence_key_file *h, kf_keyfile *f) {
    const uint8_t *p;
    size_t n;
    const char *t;
    f->mode = keyfence_key_file_is_remote(h)    ? KF_MODE_REMOTE
              : keyfence_key_file_is_agent(h)   ? KF_MODE_AGENT
              : keyfence_key_file_is_pkcs11(h)  ? KF_MODE_PKCS11
                                                : KF_MODE_LOCAL;
    if (keyfence_key_file_public_key(h, &p, &n) != KEYFENCE_OK || dup_bytes(p, n, &f->spki, &f->spki_len) != 0) return -1;
    if (keyfence_key_file_envelope(h, &p, &n) != KEYFENCE_OK || dup_bytes(p, n, &f->envelope, &f->envelope_len) != 0)
        return -1;
    const struct {
        uint32_t field;
        char **slot;
    } texts[] = {
        {KEYFENCE_KEY_FILE_STORE, &f->store},       {KEYFENCE_KEY_FILE_MACHINE_KEY, &f->machine_key},
        {KEYFENCE_KEY_FILE_TLS_CERT, &f->tls_cert}, {KEYFENCE_KEY_FILE_TLS_KEY, &f->tls_key},
        {KEYFENCE_KEY_FILE_TLS_CA, &f->tls_ca},     {KEYFENCE_KEY_FILE_AGENT_SOCKET, &f->agent_socket},
        {KEYFENCE_KEY_FILE_PKCS11_URI, &f->pkcs11_uri},
    };
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
        if (keyfence_key_file_text(h, texts[i].field, &t) != KEYFENCE_OK || dup_text(t, texts[i].slot) != 0) return -1;
    size_t peers = keyfence_key_file_peer_count(h);
    if (peers > KF_MAX_PEERS) return -1;
    for (size_t i = 0; i < peers; i++) {
        const char *name, *addr, *attrs, *server_name;
        kf_peer *q = &f->peers[i];
        f->n_peers = i + 1; /* so that kf_keyfile_clear frees what is copied */
        if (keyfence_key_file_peer(h, i, &name, &addr, &attrs, &server_name) != KEYFENCE_OK ||
            dup_text(name, &q->name) != 0 || dup_text(addr, &q->addr) != 0 || dup_text(attrs, &q->attrs) != 0 ||
            dup_text(server_name, &q->server_name) != 0)
            return -1;
    }
    return 0;
}

int kf_keyfile_parse(const uint8_t *d, size_t len, kf_keyfile *f, char *err, size_t cap) {
    memset(f, 0, sizeof(*f));
    keyfence_key_file *h = NULL;
    if (keyfence_key_file_parse(d, len, &h) != KEYFENCE_OK) {
        size_t n = 0;
        if (keyfence_error_message(err, cap, &n) != KEYFENCE_OK) snprintf(err, cap, "unreadable key file");
        return -1;
    }
    int r = copy(h, f);
    keyfence_key_file_free(h);
    if (r != 0) {
        kf_keyfile_clear(f);
        snprintf(err, cap, "out of memory reading the key file");
    }
    return r;
}

void kf_keyfile_clear(kf_keyfile *f) {
    free(f->spki);
    free(f->envelope);
    free(f->store);
    free(f->machine_key);
    free(f->tls_cert);
    free(f->tls_key);
    free(f->tls_ca);
    free(f->agent_socket);
    free(f->pkcs11_uri);
    for (size_t i = 0; i < f->n_peers; i++) {
        free(f->peers[i].name);
        free(f->peers[i].addr);
        free(f->peers[i].attrs);
        free(f->peers[i].server_name);
    }
    memset(f, 0, sizeof(*f));
}
