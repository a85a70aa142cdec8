/* The provider's entry point, its settings from openssl.cnf, its errors,
 * and the engine every key of the process signs through. */
#include "provider.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/params.h>

#define PROPS "provider=keyfence"

static const OSSL_ALGORITHM keymgmts[] = {
    {"EC:id-ecPublicKey:1.2.840.10045.2.1", PROPS, kf_keymgmt_ec, "keyfence EC keys (P-256, P-384)"},
    {"RSA:rsaEncryption:1.2.840.113549.1.1.1", PROPS, kf_keymgmt_rsa, "keyfence RSA keys"},
    {"ED25519:1.3.101.112", PROPS, kf_keymgmt_ed25519, "keyfence Ed25519 keys"},
    {NULL, NULL, NULL, NULL},
};

static const OSSL_ALGORITHM signatures[] = {
    {"ECDSA", PROPS, kf_signature_ecdsa, "ECDSA by keyfence's engine"},
    {"RSA:rsaEncryption:1.2.840.113549.1.1.1", PROPS, kf_signature_rsa, "RSA PKCS#1 v1.5 and PSS by keyfence's engine"},
    {"ED25519:1.3.101.112", PROPS, kf_signature_ed25519, "Ed25519 by keyfence's engine"},
    {NULL, NULL, NULL, NULL},
};

static const OSSL_ALGORITHM decoders[] = {
    {"EC:id-ecPublicKey:1.2.840.10045.2.1", PROPS ",input=pem", kf_decoder_ec, "KEYFENCE KEY files"},
    {"RSA:rsaEncryption:1.2.840.113549.1.1.1", PROPS ",input=pem", kf_decoder_rsa, "KEYFENCE KEY files"},
    {"ED25519:1.3.101.112", PROPS ",input=pem", kf_decoder_ed25519, "KEYFENCE KEY files"},
    /* The body as DER, after OpenSSL's own PEM decoding: a key file read
     * by its plain path through OSSL_STORE (`openssl pkey -in x.kfk`). */
    {"EC:id-ecPublicKey:1.2.840.10045.2.1", PROPS ",input=der", kf_decoder_ec_der, "KEYFENCE KEY bodies"},
    {"RSA:rsaEncryption:1.2.840.113549.1.1.1", PROPS ",input=der", kf_decoder_rsa_der, "KEYFENCE KEY bodies"},
    {"ED25519:1.3.101.112", PROPS ",input=der", kf_decoder_ed25519_der, "KEYFENCE KEY bodies"},
    {"DER", PROPS ",input=pem", kf_decoder_pem_to_der, "KEYFENCE KEY blocks to their bodies"},
    {NULL, NULL, NULL, NULL},
};

/* keyfence:PATH, for programs that load keys through OSSL_STORE (the
 * openssl command line's -key). */
static const OSSL_ALGORITHM stores[] = {
    {"keyfence", PROPS, kf_store, "keyfence:PATH names a KEYFENCE KEY file"},
    {NULL, NULL, NULL, NULL},
};

static const OSSL_ITEM reasons[] = {
    {KF_R_BAD_KEY_FILE, "bad keyfence key file"},
    {KF_R_KEY_UNAVAILABLE, "keyfence key unavailable"},
    {KF_R_SIGN_FAILED, "keyfence signature failed"},
    {KF_R_UNSUPPORTED, "not supported by keyfence"},
    {KF_R_ENGINE, "keyfence engine failed"},
    {KF_R_PUBLIC_ONLY, "keyfence key has no private half"},
    {KF_R_NO_EXPORT, "keyfence key cannot be exported"},
    {0, NULL},
};

/* The detail of the last error this thread raised (kf_log_last). */
static __thread char last_message[768];

void kf_raise_at(kf_prov *prov, const char *file, int line, int reason, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof(last_message), fmt, ap);
    va_end(ap);
    if (prov != NULL && prov->new_error != NULL && prov->vset_error != NULL) {
        prov->new_error(prov->handle);
        if (prov->set_error_debug != NULL) prov->set_error_debug(prov->handle, file, line, "keyfence");
        va_start(ap, fmt);
        prov->vset_error(prov->handle, (uint32_t)reason, fmt, ap);
        va_end(ap);
    }
}

void kf_raise_keyfence_at(kf_prov *prov, const char *file, int line, int reason, keyfence_result r, const char *what) {
    char msg[512] = {0};
    keyfence_error_message(msg, sizeof(msg), NULL);
    kf_raise_at(prov, file, line, reason, "%s: %s: %s", what, keyfence_result_name(r), msg);
}

/* Whether standard error goes somewhere: open, and not /dev/null (where
 * Apache puts it with `ErrorLog syslog:`, and daemons after detaching). */
static bool stderr_is_read(void) {
    struct stat st;
    if (fstat(STDERR_FILENO, &st) != 0) return false;
    return !(S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3));
}

void kf_log_last(kf_prov *prov, const char *what) {
    if (prov == NULL || prov->log_mode == KF_LOG_OFF) return;
    char line[1024];
    snprintf(line, sizeof(line), "keyfence provider (pid %d): %s: %s", (int)getpid(), what, last_message);
    /* The same line once a minute at most; another line at once. */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static char last_line[1024];
    static time_t last_at;
    time_t now = time(NULL);
    pthread_mutex_lock(&lock);
    bool repeat = strcmp(line, last_line) == 0 && now - last_at < 60;
    if (!repeat) {
        memcpy(last_line, line, sizeof(line));
        last_at = now;
    }
    pthread_mutex_unlock(&lock);
    if (repeat) return;
    if (prov->log_mode == KF_LOG_STDERR || (prov->log_mode == KF_LOG_AUTO && stderr_is_read())) {
        /* One write, so that lines of several processes do not mix. */
        size_t n = strlen(line);
        if (n > sizeof(line) - 2) n = sizeof(line) - 2;
        line[n++] = '\n';
        ssize_t w = write(STDERR_FILENO, line, n);
        (void)w;
    } else {
        /* No openlog: the program's own identity and facility stay. */
        syslog(LOG_ERR, "%s", line);
    }
}

keyfence_engine *kf_engine(kf_prov *prov) {
    keyfence_engine *e = NULL;
    pthread_mutex_lock(&prov->lock);
    pid_t me = getpid();
    if (prov->engine != NULL && prov->engine_pid == me) {
        e = prov->engine;
        goto out;
    }
    /* An engine made before a fork is left alone: its threads stayed in
     * the parent, and freeing it here would wait for them forever. */
    prov->engine = NULL;
    keyfence_engine_config *cfg = NULL;
    keyfence_result r = keyfence_engine_config_new(&cfg);
    if (r == KEYFENCE_OK && prov->timeout_ms != 0) r = keyfence_engine_config_set_timeout_ms(cfg, prov->timeout_ms);
    if (r == KEYFENCE_OK && prov->isolated) r = keyfence_engine_config_set_isolated(cfg, prov->key_process);
    if (r == KEYFENCE_OK) r = keyfence_engine_new(cfg, &e);
    keyfence_engine_config_free(cfg);
    if (r != KEYFENCE_OK) {
        kf_raise_keyfence(prov, KF_R_ENGINE, r, "cannot start keyfence's engine");
        e = NULL;
        goto out;
    }
    prov->engine = e;
    prov->engine_pid = me;
out:
    pthread_mutex_unlock(&prov->lock);
    return e;
}

keyfence_engine *kf_agent_engine(kf_prov *prov, const char *socket) {
    keyfence_engine *e = NULL;
    pthread_mutex_lock(&prov->lock);
    pid_t me = getpid();
    size_t free_slot = prov->n_agents;
    for (size_t i = 0; i < prov->n_agents; i++) {
        struct kf_agent_engine *a = &prov->agents[i];
        if (a->pid == me && strcmp(a->socket, socket) == 0) {
            e = a->engine;
            goto out;
        }
        /* A parent's entry is left alone (see kf_engine): its slot is
         * reused, its engine never freed here. */
        if (a->pid != me && free_slot == prov->n_agents) free_slot = i;
    }
    if (free_slot == KF_MAX_AGENTS) {
        kf_raise(prov, KF_R_ENGINE, "key files name more than %d key agents", KF_MAX_AGENTS);
        goto out;
    }
    char *name = strdup(socket);
    keyfence_engine_config *cfg = NULL;
    keyfence_result r = name == NULL ? KEYFENCE_IO : keyfence_engine_config_new(&cfg);
    if (r == KEYFENCE_OK && prov->timeout_ms != 0) r = keyfence_engine_config_set_timeout_ms(cfg, prov->timeout_ms);
    if (r == KEYFENCE_OK) r = keyfence_engine_config_set_agent(cfg, socket);
    if (r == KEYFENCE_OK) r = keyfence_engine_new(cfg, &e);
    keyfence_engine_config_free(cfg);
    if (r != KEYFENCE_OK) {
        kf_raise_keyfence(prov, KF_R_KEY_UNAVAILABLE, r, "cannot use the key agent");
        free(name);
        e = NULL;
        goto out;
    }
    struct kf_agent_engine *slot = &prov->agents[free_slot];
    if (free_slot == prov->n_agents) prov->n_agents++;
    else free(slot->socket);
    slot->socket = name;
    slot->pid = me;
    slot->engine = e;
out:
    pthread_mutex_unlock(&prov->lock);
    return e;
}

static const OSSL_ALGORITHM *query(void *provctx, int op, int *no_cache) {
    (void)provctx;
    *no_cache = 0;
    switch (op) {
    case OSSL_OP_KEYMGMT: return keymgmts;
    case OSSL_OP_SIGNATURE: return signatures;
    case OSSL_OP_DECODER: return decoders;
    case OSSL_OP_STORE: return stores;
    default: return NULL;
    }
}

static const OSSL_PARAM *gettable(void *provctx) {
    (void)provctx;
    static const OSSL_PARAM p[] = {
        OSSL_PARAM_DEFN(OSSL_PROV_PARAM_NAME, OSSL_PARAM_UTF8_PTR, NULL, 0),
        OSSL_PARAM_DEFN(OSSL_PROV_PARAM_VERSION, OSSL_PARAM_UTF8_PTR, NULL, 0),
        OSSL_PARAM_DEFN(OSSL_PROV_PARAM_STATUS, OSSL_PARAM_INTEGER, NULL, 0),
        OSSL_PARAM_END,
    };
    return p;
}

static int get_params(void *provctx, OSSL_PARAM params[]) {
    (void)provctx;
    OSSL_PARAM *p;
    if ((p = OSSL_PARAM_locate(params, OSSL_PROV_PARAM_NAME)) != NULL &&
        !OSSL_PARAM_set_utf8_ptr(p, "keyfence provider"))
        return 0;
    if ((p = OSSL_PARAM_locate(params, OSSL_PROV_PARAM_VERSION)) != NULL &&
        !OSSL_PARAM_set_utf8_ptr(p, keyfence_version()))
        return 0;
    if ((p = OSSL_PARAM_locate(params, OSSL_PROV_PARAM_STATUS)) != NULL && !OSSL_PARAM_set_int(p, 1)) return 0;
    return 1;
}

static const OSSL_ITEM *reason_strings(void *provctx) {
    (void)provctx;
    return reasons;
}

static void teardown(void *provctx) {
    kf_prov *prov = provctx;
    /* Only this process's own engine is freed (see kf_engine). */
    if (prov->engine != NULL && prov->engine_pid == getpid()) keyfence_engine_free(prov->engine);
    for (size_t i = 0; i < prov->n_agents; i++) {
        if (prov->agents[i].pid == getpid()) keyfence_engine_free(prov->agents[i].engine);
        free(prov->agents[i].socket);
    }
    free(prov->key_process);
    free(prov->store);
    free(prov->machine_key);
    pthread_mutex_destroy(&prov->lock);
    free(prov);
}

static const OSSL_DISPATCH provider_functions[] = {
    {OSSL_FUNC_PROVIDER_TEARDOWN, (void (*)(void))teardown},
    {OSSL_FUNC_PROVIDER_GETTABLE_PARAMS, (void (*)(void))gettable},
    {OSSL_FUNC_PROVIDER_GET_PARAMS, (void (*)(void))get_params},
    {OSSL_FUNC_PROVIDER_QUERY_OPERATION, (void (*)(void))query},
    {OSSL_FUNC_PROVIDER_GET_REASON_STRINGS, (void (*)(void))reason_strings},
    {0, NULL},
};

static bool truthy(const char *v) {
    return v != NULL && (strcmp(v, "1") == 0 || strcasecmp(v, "yes") == 0 || strcasecmp(v, "true") == 0 ||
                         strcasecmp(v, "on") == 0);
}

static char *dup_or_null(const char *s) {
    return s != NULL && s[0] != 0 ? strdup(s) : NULL;
}

/* The one symbol the module exports (everything else is hidden). */
__attribute__((visibility("default"))) int OSSL_provider_init(const OSSL_CORE_HANDLE *handle,
                                                              const OSSL_DISPATCH *in, const OSSL_DISPATCH **out,
                                                              void **provctx);

__attribute__((visibility("default"))) int OSSL_provider_init(const OSSL_CORE_HANDLE *handle, const OSSL_DISPATCH *in, const OSSL_DISPATCH **out,
                       void **provctx) {
    kf_prov *prov = calloc(1, sizeof(*prov));
    if (prov == NULL) return 0;
    OSSL_FUNC_core_get_params_fn *core_get_params = NULL;
    for (; in->function_id != 0; in++) {
        switch (in->function_id) {
        case OSSL_FUNC_CORE_GET_PARAMS: core_get_params = OSSL_FUNC_core_get_params(in); break;
        case OSSL_FUNC_CORE_NEW_ERROR: prov->new_error = OSSL_FUNC_core_new_error(in); break;
        case OSSL_FUNC_CORE_SET_ERROR_DEBUG: prov->set_error_debug = OSSL_FUNC_core_set_error_debug(in); break;
        case OSSL_FUNC_CORE_VSET_ERROR: prov->vset_error = OSSL_FUNC_core_vset_error(in); break;
        case OSSL_FUNC_BIO_READ_EX: prov->bio_read_ex = OSSL_FUNC_BIO_read_ex(in); break;
        default: break;
        }
    }
    prov->handle = handle;
    pthread_mutex_init(&prov->lock, NULL);
    if (core_get_params != NULL) {
        /* Settings in the provider's section of openssl.cnf. */
        char *isolated = NULL, *key_process = NULL, *timeout = NULL, *store = NULL, *machine_key = NULL, *log = NULL;
        OSSL_PARAM p[] = {
            OSSL_PARAM_utf8_ptr("log", &log, 0),
            OSSL_PARAM_utf8_ptr("isolated", &isolated, 0),
            OSSL_PARAM_utf8_ptr("key-process", &key_process, 0),
            OSSL_PARAM_utf8_ptr("timeout-ms", &timeout, 0),
            OSSL_PARAM_utf8_ptr("store", &store, 0),
            OSSL_PARAM_utf8_ptr("machine-key", &machine_key, 0),
            OSSL_PARAM_END,
        };
        if (core_get_params(handle, p)) {
            prov->isolated = truthy(isolated);
            if (log != NULL) {
                if (strcmp(log, "auto") == 0) prov->log_mode = KF_LOG_AUTO;
                else if (strcmp(log, "stderr") == 0) prov->log_mode = KF_LOG_STDERR;
                else if (strcmp(log, "syslog") == 0) prov->log_mode = KF_LOG_SYSLOG;
                else if (strcmp(log, "off") == 0) prov->log_mode = KF_LOG_OFF;
                else {
                    ERR_raise_data(ERR_LIB_PROV, ERR_R_PASSED_INVALID_ARGUMENT,
                                   "keyfence: log must be auto, stderr, syslog or off, not %s", log);
                    teardown(prov);
                    return 0;
                }
            }
            prov->key_process = dup_or_null(key_process);
            prov->store = dup_or_null(store);
            prov->machine_key = dup_or_null(machine_key);
            if (timeout != NULL) {
                char *end = NULL;
                unsigned long t = strtoul(timeout, &end, 10);
                if (end == timeout || *end != 0 || t == 0 || t > 600000) {
                    ERR_raise_data(ERR_LIB_PROV, ERR_R_PASSED_INVALID_ARGUMENT,
                                   "keyfence: timeout-ms must be a number of milliseconds in 1..600000, not %s",
                                   timeout);
                    teardown(prov);
                    return 0;
                }
                prov->timeout_ms = (unsigned)t;
            }
        }
    }
    *out = provider_functions;
    *provctx = prov;
    return 1;
}
