/* Waiting for a signature: blocked on the engine's deadline, or, inside
 * an OpenSSL async job, paused with a completion queue's descriptor as
 * the job's wait fd so the server runs other handshakes meanwhile. */
#ifndef KF_SIGN_WAIT_H
#define KF_SIGN_WAIT_H

#include "provider.h"

/* Signs msg with `alg`; on success *out holds the signature (free it with
 * keyfence_bytes_free). Returns 1, or 0 after raising an OpenSSL error. */
int kf_sign_wait(kf_prov *prov, keyfence_engine *engine, const keyfence_private_key *key, const char *alg,
                 const unsigned char *msg, size_t len, keyfence_bytes *out);

#endif
