#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keyfence.h>

/* Prints keyfence's message for the last error and exits. */
static void check(keyfence_result r, const char *what) {
    if (r == KEYFENCE_OK) return;
    char msg[1024];
    keyfence_error_message(msg, sizeof msg, NULL);
    fprintf(stderr, "%s: %s: %s\n", what, keyfence_result_name(r), msg);
    exit(1);
}

int main(int argc, char **argv) {
    /* CP-ABE directly. */
    keyfence_abe_public_key *pk = NULL;
    keyfence_abe_master_key *msk = NULL;
    keyfence_abe_attribute_key *fra = NULL;
    check(keyfence_abe_setup(&pk, &msk), "setup");
    check(keyfence_abe_keygen(msk, "region=EU,country=DE", &fra), "keygen");

    const char *secret = "only in the EU, never in France";
    keyfence_bytes ct = {0}, pt = {0};
    check(keyfence_abe_encrypt(pk, "region: EU and not country: FR",
                               (const uint8_t *)secret, strlen(secret), &ct), "encrypt");
    check(keyfence_abe_decrypt(fra, ct.data, ct.len, &pt), "decrypt");
    printf("decrypted %zu bytes: %s\n", pt.len, (const char *)pt.data);

    /* A policy error says where. */
    keyfence_result r = keyfence_abe_encrypt(pk, "region: EU)", (const uint8_t *)"x", 1, &ct);
    char msg[512];
    keyfence_error_message(msg, sizeof msg, NULL);
    printf("%s:\n%s\n", keyfence_result_name(r), msg);

    /* Wrapping on a file store shared by the authority and the machines:
       the directory named on the command line, or one in /tmp. */
    const char *store = argc > 1 ? argv[1] : "/tmp/keyfence-example-store";
    keyfence_authority *auth = NULL;
    r = keyfence_authority_init(store, &auth);
    if (r == KEYFENCE_AUTHORITY_EXISTS) r = keyfence_authority_open(store, &auth);
    check(r, "authority");
    keyfence_bytes fra_key = {0}, nyc_key = {0}, env = {0}, opened = {0};
    check(keyfence_authority_issue(auth, "region=EU,country=DE", &fra_key), "issue");
    check(keyfence_authority_issue(auth, "region=NA,country=US", &nyc_key), "issue");
    const char *pem = "-----BEGIN PRIVATE KEY-----\n...\n-----END PRIVATE KEY-----\n";
    check(keyfence_authority_wrap(auth, "region: EU", (const uint8_t *)pem, strlen(pem), &env), "wrap");

    keyfence_machine *m_fra = NULL, *m_nyc = NULL;
    check(keyfence_machine_new(fra_key.data, fra_key.len, store, &m_fra), "machine");
    check(keyfence_machine_new(nyc_key.data, nyc_key.len, store, &m_nyc), "machine");
    bool could = false;
    check(keyfence_machine_could_open(m_nyc, env.data, env.len, &could), "could_open");
    printf("New York could open it: %s\n", could ? "yes" : "no (forward to Frankfurt)");
    check(keyfence_machine_open(m_fra, env.data, env.len, &opened), "open");
    printf("Frankfurt opened %zu bytes\n", opened.len);

    keyfence_bytes_free(&opened);
    keyfence_bytes_free(&env);
    keyfence_bytes_free(&fra_key);
    keyfence_bytes_free(&nyc_key);
    keyfence_bytes_free(&pt);
    keyfence_bytes_free(&ct);
    keyfence_machine_free(m_fra);
    keyfence_machine_free(m_nyc);
    keyfence_authority_free(auth);
    keyfence_abe_attribute_key_free(fra);
    keyfence_abe_master_key_free(msk);
    keyfence_abe_public_key_free(pk);
    return 0;
}
