/* CP-ABE and the policy language through the C API, with their error
 * paths: NULL arguments, a malformed policy (the message has the
 * position), a tampered ciphertext, a key that does not satisfy. */
#include "check.h"

static void policies(void) {
    bool sat = false;
    OK(keyfence_policy_check("country: US or (not region: EU)", "country=FR,region=APAC", &sat));
    CHECK(sat);
    OK(keyfence_policy_check("country: US or (not region: EU)", "country=FR,region=EU", &sat));
    CHECK(!sat);
    /* Quoted labels and values carry commas, '=' and quotes unchanged. */
    OK(keyfence_policy_check("team: \"key ops, EU\" and q: \"a=\\\"b\"", "\"team\"=\"key ops, EU\",\"q\"=\"a=\\\"b\"", &sat));
    CHECK(sat);

    FAILS(KEYFENCE_POLICY_SYNTAX, keyfence_policy_check("country: US) and region: EU", "a=b", &sat));
    MESSAGE_HAS("at byte 11");
    MESSAGE_HAS("^");
    size_t pos = 0;
    CHECK(keyfence_error_position(&pos) && pos == 11);
    CHECK(keyfence_error_position(NULL));
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_policy_check("a: b", "a", &sat));
    pos = 99;
    CHECK(!keyfence_error_position(&pos) && pos == 99);
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_policy_check(NULL, "a=b", &sat));
    MESSAGE_HAS("policy is NULL");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_policy_check("a: b", "a=b", NULL));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_policy_check("\xff: b", "a=b", &sat));

    keyfence_bytes canon = {0};
    OK(keyfence_policy_canonical("(a: x)   and not b: y", &canon));
    CHECK(strcmp((const char *)canon.data, "a: x and not b: y") == 0);
    CHECK(canon.len == strlen("a: x and not b: y"));
    keyfence_bytes_free(&canon);
    CHECK(canon.data == NULL && canon.len == 0);
    keyfence_bytes_free(&canon); /* harmless twice through the same struct */
    keyfence_bytes_free(NULL);
}

static void messages(void) {
    bool sat;
    size_t n = 0;
    FAILS(KEYFENCE_POLICY_SYNTAX, keyfence_policy_check("a: b or", "a=b", &sat));
    OK(keyfence_error_message(NULL, 0, &n));
    CHECK(n > 10);
    char tiny[8];
    OK(keyfence_error_message(tiny, sizeof tiny, &n));
    CHECK(strlen(tiny) == sizeof tiny - 1);
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_error_message(NULL, 4, &n));
    OK(keyfence_policy_check("a: b", "a=b", &sat));
    OK(keyfence_error_message(tiny, sizeof tiny, &n));
    CHECK(n == 0 && tiny[0] == 0); /* a success clears the message */

    CHECK(strcmp(keyfence_result_name(KEYFENCE_OK), "OK") == 0);
    CHECK(strcmp(keyfence_result_name(KEYFENCE_POLICY_NOT_SATISFIED), "POLICY_NOT_SATISFIED") == 0);
    CHECK(strcmp(keyfence_result_name(424242), "UNKNOWN") == 0);
    CHECK(strlen(keyfence_version()) >= 5);
}

static void abe(void) {
    keyfence_abe_public_key *pk = NULL;
    keyfence_abe_master_key *msk = NULL;
    OK(keyfence_abe_setup(&pk, &msk));

    keyfence_abe_attribute_key *eu = NULL, *na = NULL;
    OK(keyfence_abe_keygen(msk, "region=EU,country=DE", &eu));
    OK(keyfence_abe_keygen(msk, "region=NA", &na));
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_abe_keygen(NULL, "a=b", &eu));
    FAILS(KEYFENCE_INVALID_ATTRIBUTES, keyfence_abe_keygen(msk, "region", &eu));

    const char *msg = "the customer's key";
    keyfence_bytes ct = {0};
    OK(keyfence_abe_encrypt(pk, "region: EU and not country: FR", (const uint8_t *)msg, strlen(msg), &ct));
    FAILS(KEYFENCE_POLICY_SYNTAX, keyfence_abe_encrypt(pk, "region: EU)", (const uint8_t *)msg, 1, &ct));
    size_t pos = 0;
    CHECK(keyfence_error_position(&pos) && pos == 10);
    MESSAGE_HAS("^");
    FAILS(KEYFENCE_INVALID_ARGUMENT, keyfence_abe_encrypt(pk, "region: EU", NULL, 5, &ct));

    keyfence_bytes pt = {0};
    OK(keyfence_abe_decrypt(eu, ct.data, ct.len, &pt));
    CHECK(pt.len == strlen(msg) && memcmp(pt.data, msg, pt.len) == 0);
    keyfence_bytes_free(&pt);
    FAILS(KEYFENCE_POLICY_NOT_SATISFIED, keyfence_abe_decrypt(na, ct.data, ct.len, &pt));
    CHECK(pt.data == NULL); /* outputs are written only on success */

    bool could = false;
    OK(keyfence_abe_could_decrypt("region=EU,country=DE", ct.data, ct.len, &could));
    CHECK(could);
    OK(keyfence_abe_could_decrypt("region=EU,country=FR", ct.data, ct.len, &could));
    CHECK(!could);
    keyfence_bytes pol = {0};
    OK(keyfence_abe_policy_of(ct.data, ct.len, &pol));
    CHECK(strcmp((const char *)pol.data, "region: EU and not country: FR") == 0);
    keyfence_bytes_free(&pol);

    /* Tampering: a flipped byte near the end (the tag) and a truncation. */
    ct.data[ct.len - 5] ^= 1;
    FAILS(KEYFENCE_INVALID_CIPHERTEXT, keyfence_abe_decrypt(eu, ct.data, ct.len, &pt));
    ct.data[ct.len - 5] ^= 1;
    FAILS(KEYFENCE_INVALID_CIPHERTEXT, keyfence_abe_decrypt(eu, ct.data, ct.len - 1, &pt));
    MESSAGE_HAS("ciphertext");

    /* Keys survive their encodings, and decrypt the same. */
    keyfence_bytes enc = {0};
    keyfence_abe_attribute_key *eu2 = NULL;
    OK(keyfence_abe_attribute_key_to_bytes(eu, &enc));
    OK(keyfence_abe_attribute_key_from_bytes(enc.data, enc.len, &eu2));
    enc.data[0] ^= 0xff;
    keyfence_abe_attribute_key *bad = NULL;
    FAILS(KEYFENCE_INVALID_KEY, keyfence_abe_attribute_key_from_bytes(enc.data, enc.len, &bad));
    CHECK(bad == NULL);
    keyfence_bytes_free(&enc);
    OK(keyfence_abe_decrypt(eu2, ct.data, ct.len, &pt));
    keyfence_bytes_free(&pt);

    keyfence_abe_public_key *pk2 = NULL;
    keyfence_abe_master_key *msk2 = NULL;
    OK(keyfence_abe_public_key_to_bytes(pk, &enc));
    OK(keyfence_abe_public_key_from_bytes(enc.data, enc.len, &pk2));
    keyfence_bytes_free(&enc);
    OK(keyfence_abe_master_key_to_bytes(msk, &enc));
    OK(keyfence_abe_master_key_from_bytes(enc.data, enc.len, &msk2));
    keyfence_bytes_free(&enc);
    FAILS(KEYFENCE_INVALID_KEY, keyfence_abe_public_key_from_bytes((const uint8_t *)"x", 1, &pk2));

    keyfence_bytes_free(&ct);
    keyfence_abe_attribute_key_free(eu);
    keyfence_abe_attribute_key_free(eu2);
    keyfence_abe_attribute_key_free(na);
    keyfence_abe_attribute_key_free(NULL);
    keyfence_abe_public_key_free(pk);
    keyfence_abe_public_key_free(pk2);
    keyfence_abe_master_key_free(msk);
    keyfence_abe_master_key_free(msk2);
}

int main(void) {
    policies();
    messages();
    abe();
    printf("test_abe: ok\n");
    return 0;
}
