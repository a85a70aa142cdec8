/* keyfence's OpenSSL 3 provider: what its parts share. */
#ifndef KF_PROVIDER_H
#define KF_PROVIDER_H

#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>

#include <openssl/core.h>
#include <openssl/core_dispatch.h>
#include <openssl/evp.h>

#include <keyfence.h>

#include "keyfile.h"

/* Reasons of the provider's OpenSSL errors (`openssl errstr` shows their
 * text when the provider is loaded). */
enum {
    KF_R_BAD_KEY_FILE = 1,
    KF_R_KEY_UNAVAILABLE = 2,
    KF_R_SIGN_FAILED = 3,
    KF_R_UNSUPPORTED = 4,
    KF_R_ENGINE = 5,
    KF_R_PUBLIC_ONLY = 6,
    KF_R_NO_EXPORT = 7,
};

/* Key agents one process reaches at most (key files name their socket). */
#define KF_MAX_AGENTS 8

typedef struct kf_prov {
    const OSSL_CORE_HANDLE *handle;
    OSSL_FUNC_core_new_error_fn *new_error;
    OSSL_FUNC_core_set_error_debug_fn *set_error_debug;
    OSSL_FUNC_core_vset_error_fn *vset_error;
    OSSL_FUNC_BIO_read_ex_fn *bio_read_ex; /* the decoder's input */
    /* From the provider's section of openssl.cnf. */
    bool isolated;
    char *key_process; /* NULL: the one beside libkeyfence */
    unsigned timeout_ms;
    int log_mode; /* enum kf_log_mode */
    char *store, *machine_key; /* defaults for key files that name none */
    /* The engine of the process that made it: a forked child (nginx's
     * workers) has none of its threads, so it starts its own. */
    pthread_mutex_t lock;
    pid_t engine_pid;
    keyfence_engine *engine;
    /* Engines whose keys are in a key agent, one per socket the key files
     * name (agent mode), made by the process that uses them (a forked
     * worker makes its own, as for `engine`). */
    struct kf_agent_engine {
        char *socket;
        pid_t pid;
        keyfence_engine *engine;
    } agents[KF_MAX_AGENTS];
    size_t n_agents;
} kf_prov;

enum kf_type { KF_EC = 0, KF_RSA = 1, KF_ED25519 = 2 };

/* A key as OpenSSL holds it: the public half (an ordinary public key of
 * the default provider) and, unless it was imported from public
 * parameters, where the private half is. Never the private key itself. */
typedef struct kf_key {
    int refs; /* the decoder's and the keymgmt's (see km_load) */
    kf_prov *prov;
    int type;
    EVP_PKEY *pub;
    kf_keyfile file;
    bool has_file;
    pthread_mutex_t lock;
    pid_t pid;
    keyfence_private_key *handle;
    keyfence_remote *remote;
} kf_key;

/* Raises an OpenSSL error with `reason` and a formatted detail, placed at
 * the caller's file and line (kf_raise is a macro). The detail is also
 * kept as this thread's last message, for kf_log_last. */
void kf_raise_at(kf_prov *prov, const char *file, int line, int reason, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
#define kf_raise(prov, ...) kf_raise_at((prov), __FILE__, __LINE__, __VA_ARGS__)
/* Raises `reason` with keyfence's last error (its code name and message). */
#define kf_raise_keyfence(prov, reason, r, what) kf_raise_keyfence_at((prov), __FILE__, __LINE__, (reason), (r), (what))
void kf_raise_keyfence_at(kf_prov *prov, const char *file, int line, int reason, keyfence_result r, const char *what);

/* Where the provider writes the reasons some programs never show (Apache
 * drops a key's load error from its queue, logs failed handshakes only at
 * LogLevel info; stunnel 5.68 prints no error detail): `log` in the
 * provider's section of openssl.cnf. */
enum kf_log_mode {
    KF_LOG_AUTO = 0,   /* standard error, or syslog when it is /dev/null or closed */
    KF_LOG_STDERR = 1,
    KF_LOG_SYSLOG = 2,
    KF_LOG_OFF = 3,
};
/* Writes `what` and this thread's last raised message as one line, where
 * the configuration says; the same line is written at most once a minute
 * per process, so a failing key cannot flood a log. */
void kf_log_last(kf_prov *prov, const char *what);

/* This process's engine, started on first use. NULL after raising. */
keyfence_engine *kf_engine(kf_prov *prov);
/* This process's engine for the key agent on `socket`, connected on first
 * use. NULL after raising (no agent answers, or it refuses this user). */
keyfence_engine *kf_agent_engine(kf_prov *prov, const char *socket);

const char *kf_type_name(int type);
kf_key *kf_key_new(kf_prov *prov, int type);
/* Drops one reference; the last frees the key. */
void kf_key_free(kf_key *key);
/* A key from a parsed key file (taken over): the public key decoded, the
 * private key opened or reached once to prove the file usable. */
kf_key *kf_key_from_file(kf_prov *prov, kf_keyfile *file);
/* Hands `key` (of `type`) to OpenSSL as a key object by reference (the
 * decoder's and the store's answer), then drops this reference: the
 * keymgmt holds its own if it took the key. A NULL key is a reference the
 * keymgmt refuses to load (a key file whose key cannot be used). Returns
 * the callback's result. */
int kf_key_pass(kf_key *key, int type, OSSL_CALLBACK *cb, void *cbarg);
/* The key's handle for this process (reopened after a fork). */
keyfence_private_key *kf_key_handle(kf_key *key, keyfence_engine **engine);

/* The body of the first KEYFENCE KEY PEM block in buf[0..n] (free it with
 * OPENSSL_free); 0 when there is none. */
int kf_find_body(const char *buf, size_t n, unsigned char **data, long *len);

extern const OSSL_DISPATCH kf_store[];
extern const OSSL_DISPATCH kf_keymgmt_ec[], kf_keymgmt_rsa[], kf_keymgmt_ed25519[];
extern const OSSL_DISPATCH kf_signature_ecdsa[], kf_signature_rsa[], kf_signature_ed25519[];
extern const OSSL_DISPATCH kf_decoder_ec[], kf_decoder_rsa[], kf_decoder_ed25519[];
extern const OSSL_DISPATCH kf_decoder_ec_der[], kf_decoder_rsa_der[], kf_decoder_ed25519_der[];
extern const OSSL_DISPATCH kf_decoder_pem_to_der[];

#endif
