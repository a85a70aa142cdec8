/* Attributes and policy terms given as separate strings (the _pairs
 * functions, keyfence_attributes_text, keyfence_policy_term): labels and
 * values that the attribute and policy syntaxes would need quoted go
 * through untouched, and bad input is a result code with a message. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "check.h"

/* One pair from NUL-terminated strings (the lengths are still what counts). */
static keyfence_attribute pair(const char *label, const char *value) {
    keyfence_attribute a = {label, strlen(label), value, strlen(value)};
    return a;
}

/* Labels and values each syntax would need quoted: commas, '=', quotes and
 * backslashes, outer spaces, a keyword, non-ASCII (NFC), control
 * characters (written as \u{..} escapes), and a string that is longer
 * than its stated length (no terminator is read). */
#define N 7
static keyfence_attribute tricky[N];
static const char cut[] = "siteXXXX";

static void make_tricky(void) {
    tricky[0] = pair("team", "key ops, EU");
    tricky[1] = pair("q=1,\"x\"", "a=\"b\\");
    tricky[2] = pair(" padded ", " both sides ");
    tricky[3] = pair("and", "or");
    tricky[4] = pair("city", "Z\xc3\xbcrich \xe6\x9d\xb1\xe4\xba\xac"); /* "Zürich 東京" */
    tricky[5] = pair(cut, "a");
    tricky[5].label_len = 4; /* "site" */
    tricky[6] = pair("tab\tlabel", "\n");
}

/* The policy `t0 and t1 and ...` built from terms keyfence wrote, so that
 * it names exactly the tricky attributes; `change` replaces the value of
 * pair `change` (when < N) with "other". */
static char *policy_of_tricky(size_t change) {
    static char buf[4096];
    buf[0] = 0;
    for (size_t i = 0; i < N; i++) {
        keyfence_bytes term = {0};
        const char *v = i == change ? "other" : tricky[i].value;
        size_t vlen = i == change ? 5 : tricky[i].value_len;
        OK(keyfence_policy_term(tricky[i].label, tricky[i].label_len, v, vlen, &term));
        CHECK(strlen((const char *)term.data) == term.len);
        if (i) strcat(buf, " and ");
        strcat(buf, (const char *)term.data);
        keyfence_bytes_free(&term);
    }
    return buf;
}

static void terms(void) {
    keyfence_bytes t = {0};
    OK(keyfence_policy_term("region", 6, "EU", 2, &t));
    CHECK(strcmp((const char *)t.data, "region: EU") == 0);
    keyfence_bytes_free(&t);
    OK(keyfence_policy_term("team", 4, "key ops, EU", 11, &t));
    CHECK(strcmp((const char *)t.data, "team: \"key ops, EU\"") == 0);
    keyfence_bytes_free(&t);
    OK(keyfence_policy_term("q", 1, "a\"b\\", 4, &t));
    CHECK(strcmp((const char *)t.data, "q: \"a\\\"b\\\\\"") == 0);
    keyfence_bytes_free(&t);
    /* A keyword as a value is quoted, or the term would not parse. */
    OK(keyfence_policy_term("w", 1, "not", 3, &t));
    CHECK(strcmp((const char *)t.data, "w: \"not\"") == 0);
    keyfence_bytes_free(&t);

    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_policy_term("a", 1, "", 0, &t));
    MESSAGE_HAS("empty");
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_policy_term("", 0, "b", 1, &t));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_policy_term(NULL, 3, "b", 1, &t));
    MESSAGE_HAS("label is NULL");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_policy_term("a", 1, "\xff", 1, &t));
    MESSAGE_HAS("value is not UTF-8");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_policy_term("a", 1, "b\0c", 3, &t));
    MESSAGE_HAS("NUL");
    /* "u" + U+0308: no policy could name it, so no term is written. */
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_policy_term("city", 4, "Zu\xcc\x88rich", 8, &t));
    MESSAGE_HAS("NFC");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_policy_term("a", 1, "b", 1, NULL));
    CHECK(t.data == NULL && t.len == 0); /* outputs only on success */
}

static void check_and_text(void) {
    bool sat = false;
    const char *p = policy_of_tricky(N);
    OK(keyfence_policy_check_pairs(p, tricky, N, &sat));
    CHECK(sat);
    for (size_t i = 0; i < N; i++) {
        OK(keyfence_policy_check_pairs(policy_of_tricky(i), tricky, N, &sat));
        CHECK(!sat);
    }
    p = policy_of_tricky(N);

    /* The text keyfence writes reads back to the same attributes through
     * the text functions. */
    keyfence_bytes text = {0};
    OK(keyfence_attributes_text(tricky, N, &text));
    CHECK(strlen((const char *)text.data) == text.len);
    CHECK(strstr((const char *)text.data, "team=\"key ops, EU\"") != NULL);
    OK(keyfence_policy_check(p, (const char *)text.data, &sat));
    CHECK(sat);
    keyfence_bytes_free(&text);
    OK(keyfence_attributes_text(tricky, 1, &text));
    OK(keyfence_policy_check(p, (const char *)text.data, &sat));
    CHECK(!sat);
    keyfence_bytes_free(&text);
    OK(keyfence_attributes_text(NULL, 0, &text));
    CHECK(text.len == 0 && text.data != NULL && text.data[0] == 0);
    keyfence_bytes_free(&text);

    /* No attributes at all: satisfies nothing, and is not an error. */
    OK(keyfence_policy_check_pairs("a: b", NULL, 0, &sat));
    CHECK(!sat);
    /* The policy is read first: its syntax error wins. */
    FAILS(KEYFENCE_POLICY_SYNTAX, keyfence_policy_check_pairs("a: b)", NULL, 3, &sat));
    MESSAGE_HAS("^");
}

/* Each bad array gives its code and a message naming what is wrong. */
static void bad_pairs(void) {
    bool sat = false;
    keyfence_bytes text = {0};
    keyfence_attribute bad[2];

    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_policy_check_pairs("a: b", NULL, 2, &sat));
    MESSAGE_HAS("attrs is NULL");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_policy_check_pairs(NULL, tricky, N, &sat));
    MESSAGE_HAS("policy is NULL");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_policy_check_pairs("a: b", tricky, N, NULL));

    bad[0] = pair("a", "b");
    bad[1] = pair("c", "d");
    bad[1].label = NULL;
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_attributes_text(bad, 2, &text));
    MESSAGE_HAS("attrs[1].label is NULL");
    bad[1] = pair("c", "\xc3\x28"); /* a broken two-byte sequence */
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_attributes_text(bad, 2, &text));
    MESSAGE_HAS("attrs[1].value is not UTF-8");
    bad[1] = pair("c", "d");
    bad[1].value_len = 3; /* "d", its NUL and one byte past: a NUL inside */
    {
        static const char with_nul[] = "d\0e";
        bad[1].value = with_nul;
    }
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_attributes_text(bad, 2, &text));
    MESSAGE_HAS("attrs[1].value contains a NUL character");
    bad[1] = pair("c", "");
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_attributes_text(bad, 2, &text));
    MESSAGE_HAS("attribute 1 has an empty label or value");
    bad[1] = pair("", "d");
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_policy_check_pairs("a: b", bad, 2, &sat));
    bad[1] = pair("a", "z");
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_attributes_text(bad, 2, &text));
    MESSAGE_HAS("more than once");
    bad[1] = pair("city", "Zu\xcc\x88rich");
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_attributes_text(bad, 2, &text));
    MESSAGE_HAS("not in Unicode NFC");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_attributes_text(tricky, N, NULL));
    CHECK(text.data == NULL);
}

static void abe(void) {
    keyfence_abe_public_key *pk = NULL;
    keyfence_abe_master_key *msk = NULL;
    OK(keyfence_abe_setup(&pk, &msk));

    keyfence_abe_attribute_key *key = NULL, *less = NULL;
    OK(keyfence_abe_keygen_pairs(msk, tricky, N, &key));
    OK(keyfence_abe_keygen_pairs(msk, tricky, N - 1, &less));

    const char *msg = "under a policy of odd words";
    keyfence_bytes ct = {0}, pt = {0};
    OK(keyfence_abe_encrypt(pk, policy_of_tricky(N), (const uint8_t *)msg, strlen(msg), &ct));
    OK(keyfence_abe_decrypt(key, ct.data, ct.len, &pt));
    CHECK(pt.len == strlen(msg) && memcmp(pt.data, msg, pt.len) == 0);
    keyfence_bytes_free(&pt);
    FAILS(KEYFENCE_POLICY_NOT_SATISFIED, keyfence_abe_decrypt(less, ct.data, ct.len, &pt));

    bool could = false;
    OK(keyfence_abe_could_decrypt_pairs(tricky, N, ct.data, ct.len, &could));
    CHECK(could);
    OK(keyfence_abe_could_decrypt_pairs(tricky, N - 1, ct.data, ct.len, &could));
    CHECK(!could);
    FAILS(KEYFENCE_INVALID_CIPHERTEXT, keyfence_abe_could_decrypt_pairs(tricky, N, ct.data, 7, &could));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_abe_could_decrypt_pairs(NULL, 1, ct.data, ct.len, &could));
    MESSAGE_HAS("attrs is NULL");

    keyfence_abe_attribute_key *bad = NULL;
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_abe_keygen_pairs(NULL, tricky, N, &bad));
    MESSAGE_HAS("msk is NULL");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_abe_keygen_pairs(msk, NULL, 1, &bad));
    keyfence_attribute empty = pair("a", "");
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_abe_keygen_pairs(msk, &empty, 1, &bad));
    CHECK(bad == NULL);

    keyfence_bytes_free(&ct);
    keyfence_abe_attribute_key_free(key);
    keyfence_abe_attribute_key_free(less);
    keyfence_abe_master_key_free(msk);
    keyfence_abe_public_key_free(pk);
}

static void wrap(void) {
    char dir[] = "/tmp/keyfence-c-attributes-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    keyfence_authority *auth = NULL;
    OK(keyfence_authority_init(dir, &auth));

    keyfence_bytes mk = {0}, env = {0}, out = {0};
    OK(keyfence_authority_issue_pairs(auth, tricky, N, &mk));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_authority_issue_pairs(auth, NULL, 1, &out));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_authority_issue_pairs(NULL, tricky, N, &out));
    keyfence_attribute twice[2] = {pair("a", "b"), pair("a", "c")};
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_authority_issue_pairs(auth, twice, 2, &out));
    CHECK(out.data == NULL);

    const char *secret = "a policy key's secret";
    OK(keyfence_authority_wrap(auth, policy_of_tricky(N), (const uint8_t *)secret, strlen(secret), &env));
    keyfence_machine *m = NULL;
    OK(keyfence_machine_new(mk.data, mk.len, dir, &m));
    OK(keyfence_machine_open(m, env.data, env.len, &out));
    CHECK(out.len == strlen(secret) && memcmp(out.data, secret, out.len) == 0);

    keyfence_bytes_free(&out);
    keyfence_bytes_free(&env);
    keyfence_bytes_free(&mk);
    keyfence_machine_free(m);
    keyfence_authority_free(auth);
    kf_remove_tree(dir);
}

int main(void) {
    make_tricky();
    terms();
    check_and_text();
    bad_pairs();
    abe();
    wrap();
    printf("test_attributes: ok\n");
    return 0;
}
