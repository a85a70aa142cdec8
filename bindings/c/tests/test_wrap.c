/* Policy-key wrapping through the C API: an authority and two machines on
 * one file store, with the errors a server meets. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    char dir[] = "/tmp/keyfence-c-wrap-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);

    keyfence_authority *auth = NULL, *again = NULL;
    /* Opening never creates a store: a directory without one, or a typo,
     * is STORE_IO saying so, and nothing is made. */
    FAILS(KEYFENCE_STORE_IO, keyfence_authority_open(dir, &again));
    MESSAGE_HAS("is not a keyfence store");
    char typo[sizeof dir + 16];
    snprintf(typo, sizeof typo, "%s/typo/deep", dir);
    FAILS(KEYFENCE_STORE_IO, keyfence_authority_open(typo, &again));
    CHECK(access(typo, F_OK) != 0);
    OK(keyfence_authority_init(dir, &auth));
    /* A store inside another is refused, with nothing made. */
    char inner[sizeof dir + 16];
    snprintf(inner, sizeof inner, "%s/sealed/in", dir);
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_authority_init(inner, &again));
    MESSAGE_HAS("lies inside the keyfence store");
    CHECK(access(inner, F_OK) != 0);
    FAILS(KEYFENCE_AUTHORITY_EXISTS, keyfence_authority_init(dir, &again));
    CHECK(again == NULL);
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_authority_init(NULL, &again));

    keyfence_bytes fra = {0}, nyc = {0};
    OK(keyfence_authority_issue(auth, "region=EU,country=DE", &fra));
    OK(keyfence_authority_issue(auth, "region=NA,country=US", &nyc));
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_authority_issue(auth, "region", &nyc));

    const char *secret = "-----BEGIN PRIVATE KEY-----\n...";
    keyfence_bytes env = {0};
    OK(keyfence_authority_wrap(auth, "region: EU", (const uint8_t *)secret, strlen(secret), &env));
    FAILS(KEYFENCE_POLICY_SYNTAX, keyfence_authority_wrap(auth, "region: (EU", (const uint8_t *)"x", 1, &env));
    MESSAGE_HAS("^");

    keyfence_machine *m_fra = NULL, *m_nyc = NULL;
    OK(keyfence_machine_new(fra.data, fra.len, dir, &m_fra));
    OK(keyfence_machine_new(nyc.data, nyc.len, dir, &m_nyc));
    FAILS(KEYFENCE_INVALID_KEY, keyfence_machine_new((const uint8_t *)"nope", 4, dir, &m_nyc));

    bool could = false;
    OK(keyfence_machine_could_open(m_fra, env.data, env.len, &could));
    CHECK(could);
    OK(keyfence_machine_could_open(m_nyc, env.data, env.len, &could));
    CHECK(!could);

    keyfence_bytes out = {0};
    OK(keyfence_machine_open(m_fra, env.data, env.len, &out));
    CHECK(out.len == strlen(secret) && memcmp(out.data, secret, out.len) == 0);
    keyfence_bytes_free(&out);
    FAILS(KEYFENCE_POLICY_NOT_SATISFIED, keyfence_machine_open(m_nyc, env.data, env.len, &out));
    MESSAGE_HAS("region: EU");

    env.data[env.len - 3] ^= 0x40;
    FAILS(KEYFENCE_INVALID_ENVELOPE, keyfence_machine_open(m_fra, env.data, env.len, &out));
    env.data[env.len - 3] ^= 0x40;
    FAILS(KEYFENCE_INVALID_ENVELOPE, keyfence_machine_could_open(m_fra, env.data, 10, &could));

    /* A master rotation re-seals the one policy key and leaves the
     * envelope as it was: the machine (after its cache) still opens it. */
    size_t resealed = 0;
    OK(keyfence_authority_rotate_master(auth, &resealed));
    CHECK(resealed == 1);
    keyfence_machine_free(m_fra);
    OK(keyfence_machine_new(fra.data, fra.len, dir, &m_fra));
    OK(keyfence_machine_open(m_fra, env.data, env.len, &out));
    keyfence_bytes_free(&out);

    /* Revocation: each machine has its own id; revoking fra re-wraps the
     * store's envelope to a new policy key fra cannot open, a second
     * machine in the EU opens the store's copy, and the id cannot be
     * issued again. */
    keyfence_bytes fra2 = {0}, id = {0}, id2 = {0};
    OK(keyfence_authority_issue(auth, "region=EU,country=DE", &fra2));
    keyfence_machine *m_fra2 = NULL;
    OK(keyfence_machine_new(fra2.data, fra2.len, dir, &m_fra2));
    OK(keyfence_machine_id(m_fra, &id));
    OK(keyfence_machine_id(m_fra2, &id2));
    CHECK(id.len == 32 && id2.len == 32 && memcmp(id.data, id2.data, 32) != 0);
    char id_text[40] = {0}, attrs[80];
    memcpy(id_text, id.data, id.len);
    size_t rewrapped = 0;
    OK(keyfence_authority_revoke(auth, id_text, &rewrapped));
    CHECK(rewrapped == 1);
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_authority_revoke(auth, "not an id", &rewrapped));
    /* The whole report, as JSON: again for the same id, nothing is done. */
    {
        keyfence_bytes report = {0};
        OK(keyfence_authority_revoke_report(auth, id_text, &report));
        char text[1024] = {0};
        CHECK(report.len > 0 && report.len < sizeof text);
        memcpy(text, report.data, report.len);
        CHECK(strstr(text, "\"already\":true") != NULL && strstr(text, "\"rewrapped\":0") != NULL);
        CHECK(strstr(text, id_text) != NULL && strstr(text, "\"skipped\":[]") != NULL);
        keyfence_bytes_free(&report);
        FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_authority_revoke_report(auth, "not an id", &report));
        CHECK(report.data == NULL);
    }
    snprintf(attrs, sizeof attrs, "region=EU,machine=%s", id_text);
    keyfence_bytes refused = {0};
    FAILS(KEYFENCE_MACHINE_REVOKED, keyfence_authority_issue(auth, attrs, &refused));
    char served_path[512];
    {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "ls '%s/envelopes'", dir);
        FILE *ls = popen(cmd, "r");
        CHECK(ls != NULL);
        char name[128] = {0};
        CHECK(fgets(name, sizeof name, ls) != NULL);
        pclose(ls);
        name[strcspn(name, "\n")] = 0;
        snprintf(served_path, sizeof served_path, "%s/envelopes/%s", dir, name);
    }
    FILE *f = fopen(served_path, "rb");
    CHECK(f != NULL);
    uint8_t served[4096];
    size_t served_len = fread(served, 1, sizeof served, f);
    fclose(f);
    /* fra keeps its cache, as a thief would; the store's copy is sealed to
     * a key version it never held, and it cannot open that one. */
    FAILS(KEYFENCE_MACHINE_REVOKED, keyfence_machine_open(m_fra, served, served_len, &out));
    OK(keyfence_machine_open(m_fra2, served, served_len, &out));
    CHECK(out.len == strlen(secret) && memcmp(out.data, secret, out.len) == 0);
    keyfence_bytes_free(&out);
    keyfence_bytes_free(&id);
    keyfence_bytes_free(&id2);
    keyfence_bytes_free(&fra2);
    keyfence_machine_free(m_fra2);

    /* Where a key can be used (issue 61): fra is revoked, fra2 (DE) and
     * nyc (US) are live; US's handshakes go to DE, the one group that can
     * open an EU key. */
    {
        keyfence_group_rate traffic[] = {{"DE", 100.0}, {"US", 900.0}};
        keyfence_group_latency latency[] = {{"US", "DE", 80.0}};
        keyfence_bytes json = {0};
        OK(keyfence_authority_where(auth, "region: EU", "country", NULL, traffic, 2, latency, 1, 0.0, false, &json));
        const char *j = (const char *)json.data;
        CHECK(strstr(j, "\"total\":2,\"matching\":1,\"revoked\":1") != NULL);
        CHECK(strstr(j, "{\"value\":\"DE\",\"total\":1,\"matching\":1,") != NULL);
        CHECK(strstr(j, "\"own_rps\":100,\"received_rps\":900,") != NULL);
        keyfence_bytes_free(&json);
        FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_authority_where(auth, "region: EU", NULL, NULL, traffic, 2, NULL, 0, 0.0, false, &json));
        MESSAGE_HAS("say which label groups the fleet");
        FAILS(KEYFENCE_POLICY_SYNTAX, keyfence_authority_where(auth, "region: EU)", NULL, NULL, NULL, 0, NULL, 0, 0.0, false, &json));
        FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_authority_where(auth, "region: EU", NULL, NULL, NULL, 0, NULL, 0, 0.0, false, NULL));
        size_t added = 0;
        OK(keyfence_authority_import_inventory(auth, "000000000000000000000000000000aa\tregion=APAC\n", "fleet.tsv", &added));
        CHECK(added == 1);
        FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_authority_import_inventory(auth, "x-y\tregion=APAC\n", NULL, NULL));
        MESSAGE_HAS("inventory, line 1, field id");
        OK(keyfence_authority_where(auth, "region: APAC", NULL, NULL, NULL, 0, NULL, 0, 0.0, true, &json));
        CHECK(strstr((const char *)json.data, "\"machines\":[\"000000000000000000000000000000aa\"]") != NULL);
        keyfence_bytes_free(&json);
    }

    /* The state is on disk: a second handle opens it. */
    OK(keyfence_authority_open(dir, &again));
    keyfence_authority_free(again);

    keyfence_bytes_free(&env);
    keyfence_bytes_free(&fra);
    keyfence_bytes_free(&nyc);
    keyfence_machine_free(m_fra);
    keyfence_machine_free(m_nyc);
    keyfence_machine_free(NULL);
    keyfence_authority_free(auth);
    keyfence_authority_free(NULL);

    kf_remove_tree(dir);
    printf("test_wrap: ok\n");
    return 0;
}
