#!/usr/bin/env bash
# A SoftHSM2 token in a folder of its own, for the PKCS#11 tests (Rust, C,
# Python, Node and the OpenSSL provider's run the same fixture).
#
#   vectors/softhsm-fixture.sh DIR
#
# Writes DIR/softhsm2.conf (tokens in DIR/tokens, nothing outside DIR),
# initializes the token `edge` with the user PIN in DIR/pin (mode 0600),
# and imports four keys made by `openssl genpkey`, each a private key
# object (sensitive, not extractable) with its public key beside it:
#
#   label      id   kind       PEM kept for the tests
#   tls-p256   01   P-256      DIR/keys/tls-p256.pem
#   tls-p384   02   P-384      DIR/keys/tls-p384.pem
#   tls-rsa    03   RSA-2048   DIR/keys/tls-rsa.pem
#   tls-ed     04   Ed25519    DIR/keys/tls-ed.pem
#
# DIR/env holds what a process needs to use the token, one VAR=value a
# line: SOFTHSM2_CONF, KEYFENCE_PKCS11_MODULE, KEYFENCE_PKCS11_PIN_FILE.
# Exits 77 (a skip) when SoftHSM2 is not installed, unless
# KEYFENCE_REQUIRE_SERVERS is set (./x installs softhsm2 and sets it).
set -euo pipefail
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
module=""
for m in /usr/lib/softhsm/libsofthsm2.so /usr/lib/*-linux-gnu/softhsm/libsofthsm2.so /usr/local/lib/softhsm/libsofthsm2.so; do
    [ -e "$m" ] && { module="$m"; break; }
done
if [ -z "$module" ] || ! command -v softhsm2-util >/dev/null; then
    if [ -n "${KEYFENCE_REQUIRE_SERVERS:-}" ]; then
        echo "softhsm-fixture: KEYFENCE_REQUIRE_SERVERS is set but SoftHSM2 is not installed" >&2
        exit 1
    fi
    echo "softhsm-fixture: *** SKIPPED: no SoftHSM2 (apt-get install softhsm2) ***" >&2
    exit 77
fi
mkdir -p "$dir/tokens" "$dir/keys"
cat > "$dir/softhsm2.conf" <<EOF
directories.tokendir = $dir/tokens
objectstore.backend = file
log.level = ERROR
slots.removable = false
EOF
export SOFTHSM2_CONF="$dir/softhsm2.conf"
( umask 077; printf '%s\n' "$(od -An -N6 -tu2 /dev/urandom | tr -d ' \n' | cut -c1-8)" > "$dir/pin" )
pin="$(head -n1 "$dir/pin")"
softhsm2-util --init-token --free --label edge --pin "$pin" --so-pin "so-$pin" >/dev/null
gen() { # gen LABEL ID ALGORITHM [OPTIONS...]
    local label="$1" id="$2" alg="$3"; shift 3
    ( umask 077; openssl genpkey -algorithm "$alg" "$@" -out "$dir/keys/$label.pem" 2>/dev/null )
    softhsm2-util --import "$dir/keys/$label.pem" --token edge --label "$label" --id "$id" --pin "$pin" >/dev/null
}
gen tls-p256 01 EC -pkeyopt ec_paramgen_curve:P-256
gen tls-p384 02 EC -pkeyopt ec_paramgen_curve:P-384
gen tls-rsa 03 RSA -pkeyopt rsa_keygen_bits:2048
gen tls-ed 04 ED25519
printf 'SOFTHSM2_CONF=%s\nKEYFENCE_PKCS11_MODULE=%s\nKEYFENCE_PKCS11_PIN_FILE=%s\n' \
    "$dir/softhsm2.conf" "$module" "$dir/pin" > "$dir/env"
