/* The keyfence key file (docs/openssl.md, "The key file"): a PEM block
 * labelled KEYFENCE KEY whose body says where the private key is and
 * carries its public half. keyfence's core reads it (keyfence_key_file_parse);
 * this is the provider's copy of what it read. Nothing here touches a key. */
#ifndef KF_KEYFILE_H
#define KF_KEYFILE_H

#include <stddef.h>
#include <stdint.h>

#define KF_PEM_LABEL "KEYFENCE KEY"
#define KF_MAX_PEERS 16

enum kf_mode { KF_MODE_LOCAL = 0, KF_MODE_REMOTE = 1, KF_MODE_AGENT = 2, KF_MODE_PKCS11 = 3 };

typedef struct {
    char *name, *addr, *attrs, *server_name; /* server_name may be NULL */
} kf_peer;

typedef struct {
    int mode;
    uint8_t *spki;
    size_t spki_len;
    uint8_t *envelope;
    size_t envelope_len;
    char *store, *machine_key;                 /* local (either may be NULL: the provider's config fills in) */
    char *tls_cert, *tls_key, *tls_ca;         /* remote */
    char *agent_socket;                        /* agent (or a token key's agent, may be NULL) */
    char *pkcs11_uri;                          /* a token key's RFC 7512 URI (no envelope) */
    kf_peer peers[KF_MAX_PEERS];
    size_t n_peers;
} kf_keyfile;

/* Reads the PEM body's bytes (after base64). Returns 0 and fills *out,
 * or -1 with keyfence's reason (naming the field at fault) in err[0..errcap]. */
int kf_keyfile_parse(const uint8_t *der, size_t len, kf_keyfile *out, char *err, size_t errcap);

void kf_keyfile_clear(kf_keyfile *f);

#endif
