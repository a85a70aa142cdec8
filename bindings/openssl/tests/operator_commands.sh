#!/usr/bin/env bash
# operator_commands.sh CLI MODULES WORK: what an operator types to renew
# and issue with a keyfence key, run with the unmodified `openssl` command
# line, for every key type (P-256, P-384, RSA-2048, Ed25519), with the keys
# in process and in the isolated key process:
#   req -new, then req -verify;   req -x509 (a CA), then openssl verify;
#   x509 -req -CAkey, then openssl verify of the leaf;
#   ca -gencrl, then crl -verify;  an OCSP response, then ocsp -verify;
#   RSA PKCS#1 v1.5 and PSS with SHA-256/384/512;
#   the key file named by its plain path as well as by keyfence:PATH;
#   `provider-config --include` added to the system's openssl.cnf;
# and each signature algorithm the certificate names is the one OpenSSL
# names when it signs with the same key as a PEM file. What keyfence does
# not sign (P-256 with SHA-384, PSS with another salt, SHA-1), and every
# way of taking the private half out (pkey -text, -out, pkcs12 -export),
# is refused with the provider's reason, never a crash.
#
# MODULES is meant to hold the provider built under AddressSanitizer and
# UBSan (keyfence_provider_asan); the ASan runtime is then preloaded into
# `openssl`, which is not instrumented. Any report fails the test.
set -euo pipefail
cli="$1" modules="$2" work="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
# shellcheck source=common.sh
. "$here/common.sh"

keys_and_configs
keys="$PWD/keys"

# With the sanitizers (common.sh's asan_env), a report ends the command
# with exit 23, which `ossl` turns into a failure.
if [ "${#asan_env[@]}" -gt 0 ]; then echo "the provider runs under AddressSanitizer and UBSan"; fi

# ossl CONF ARGS...: openssl with keyfence's provider; a crash or a
# sanitizer report fails the test, whatever the command was expected to do.
ossl() {
    local cnf="$1" rc=0
    shift
    "${asan_env[@]}" env OPENSSL_CONF="$PWD/$cnf" openssl "$@" 2>"$work/last.err" || rc=$?
    if [ "$rc" -ge 23 ]; then
        cat "$work/last.err" >&2
        fail "openssl $* ended with $rc (a crash or a sanitizer report)"
    fi
    return "$rc"
}
# ok CONF ARGS...: the command succeeds.
ok() {
    local cnf="$1"
    shift
    ossl "$cnf" "$@" || { cat "$work/last.err" >&2; fail "openssl $* failed ($cnf)"; }
}
# refused CONF WHY ARGS...: the command fails, saying WHY.
refused() {
    local cnf="$1" why="$2" rc=0
    shift 2
    ossl "$cnf" "$@" || rc=$?
    [ "$rc" != 0 ] || fail "openssl $* was not refused ($cnf)"
    grep -q "$why" "$work/last.err" || { cat "$work/last.err" >&2; fail "openssl $*: no '$why' in the error"; }
}
# The signature algorithm a certificate, request or CRL names, with its
# parameters, as OpenSSL prints it (the line and those indented below it).
sigalg() {
    openssl "$1" -in "$2" -noout -text | awk '/Signature Algorithm/ { p = 1; print; next } p && /^ {9,}[A-Z]/ { print; next } { p = 0 }' |
        head -6
}
same_sigalg() { # KIND KEYFENCE-MADE OPENSSL-MADE
    local a b
    a="$(sigalg "$1" "$2")" b="$(sigalg "$1" "$3")"
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "$2 names the signature algorithm '$a', OpenSSL '$b'"
    ! grep -qi invalid <<<"$a" || fail "$2: $a"
}

openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout leaf.key -subj /CN=leaf -out leaf.csr \
    2>/dev/null

for cnf in local.cnf isolated.cnf; do
    for k in ec256 ec384 rsa2048 ed25519; do
        d="$cnf-$k"
        mkdir -p "$d"
        # OpenSSL's default digest for a P-384 PEM key is SHA-256, which
        # keyfence does not pair with P-384: its key files default to
        # SHA-384, so the reference is made with that.
        ref_md=()
        [ "$k" = ec384 ] && ref_md=(-sha384)
        kf="keyfence:$keys/$k.kfk"
        # A certificate request, as a renewal starts.
        ok "$cnf" req -new -key "$kf" -subj /CN=renewed -out "$d/req.csr"
        ok "$cnf" req -verify -in "$d/req.csr" -noout
        openssl req -new -key "$keys/$k.pem" "${ref_md[@]}" -subj /CN=renewed -out "$d/ref.csr" -config /dev/null
        same_sigalg req "$d/req.csr" "$d/ref.csr"
        # A self-signed CA certificate, then a leaf it issues.
        ok "$cnf" req -x509 -new -key "$kf" -subj "/CN=keyfence $k CA" -days 1 -out "$d/ca.crt" \
            -addext basicConstraints=critical,CA:TRUE -addext keyUsage=keyCertSign,cRLSign
        ok "$cnf" verify -CAfile "$d/ca.crt" "$d/ca.crt"
        openssl req -x509 -new -key "$keys/$k.pem" "${ref_md[@]}" -subj /CN=ref -days 1 -out "$d/ref.crt" -config /dev/null
        same_sigalg x509 "$d/ca.crt" "$d/ref.crt"
        ok "$cnf" x509 -req -in leaf.csr -CA "$d/ca.crt" -CAkey "$kf" -CAcreateserial -days 1 -out "$d/leaf.crt"
        ok "$cnf" verify -CAfile "$d/ca.crt" "$d/leaf.crt"
        # A CRL, as `openssl ca` makes it.
        : >"$d/index.txt"
        echo 01 >"$d/crlnumber"
        printf '[ca]\ndefault_ca = d\n[d]\ndatabase = %s\ncrlnumber = %s\ndefault_md = default\ndefault_crl_days = 1\n' \
            "$PWD/$d/index.txt" "$PWD/$d/crlnumber" >"$d/ca.cnf"
        ok "$cnf" ca -config "$d/ca.cnf" -gencrl -cert "$d/ca.crt" -keyfile "$kf" -out "$d/crl.pem"
        ok "$cnf" crl -in "$d/crl.pem" -CAfile "$d/ca.crt" -noout
        # An OCSP response signed by the CA key about the leaf.
        serial="$(openssl x509 -in "$d/leaf.crt" -noout -serial | cut -d= -f2)"
        printf 'V\t%s\t\t%s\tunknown\t/CN=leaf\n' "$(date -u -d tomorrow +%y%m%d%H%M%SZ)" "$serial" >"$d/index.txt"
        openssl ocsp -issuer "$d/ca.crt" -cert "$d/leaf.crt" -reqout "$d/ocsp.req" -no_nonce 2>/dev/null
        ok "$cnf" ocsp -index "$d/index.txt" -rsigner "$d/ca.crt" -rkey "$kf" -CA "$d/ca.crt" -reqin "$d/ocsp.req" \
            -respout "$d/ocsp.resp"
        ok "$cnf" ocsp -respin "$d/ocsp.resp" -CAfile "$d/ca.crt" -issuer "$d/ca.crt" -cert "$d/leaf.crt" -no_nonce
        grep -q "Response verify OK" "$work/last.err" || fail "the OCSP response by $k did not verify"
        echo "$cnf $k: req, req -x509, x509 -req -CAkey, ca -gencrl, ocsp: signed and verified"
    done
    # RSA: PKCS#1 v1.5 and PSS with each digest keyfence signs with.
    kf="keyfence:$keys/rsa2048.kfk"
    for md in sha256 sha384 sha512; do
        for pad in pkcs1 pss; do
            opts=()
            [ "$pad" = pss ] && opts=(-sigopt rsa_padding_mode:pss -sigopt rsa_pss_saltlen:digest)
            out="$cnf-rsa-$pad-$md.crt"
            ok "$cnf" req -x509 -new -key "$kf" "-$md" "${opts[@]}" -subj /CN=rsa -days 1 -out "$out"
            ok "$cnf" verify -CAfile "$out" "$out"
            openssl req -x509 -new -key "$keys/rsa2048.pem" "-$md" "${opts[@]}" -subj /CN=ref -days 1 \
                -out "ref-$out" -config /dev/null
            same_sigalg x509 "$out" "ref-$out"
        done
    done
    echo "$cnf rsa2048: PKCS#1 v1.5 and PSS with SHA-256, SHA-384, SHA-512"
    # What keyfence does not sign: refused with the reason.
    refused "$cnf" "pairs P-256 with SHA-256" req -x509 -new -key "keyfence:$keys/ec256.kfk" -sha384 -subj /CN=x \
        -days 1 -out bad.crt
    refused "$cnf" "a salt of its length" req -x509 -new -key "$kf" -sigopt rsa_padding_mode:pss \
        -sigopt rsa_pss_saltlen:max -subj /CN=x -days 1 -out bad.crt
    refused "$cnf" "digest sha1" req -new -key "$kf" -sha1 -subj /CN=x -out bad.csr
    # The private half never leaves: printing, writing and PKCS#12 say so.
    refused "$cnf" "cannot be exported" pkey -in "$kf" -text -noout
    refused "$cnf" "cannot be exported" pkey -in "$kf" -out exported.pem
    refused "$cnf" "cannot be exported" pkcs12 -export -inkey "$kf" -in "$keys/rsa2048.crt" -out x.p12 -passout pass:x
    [ ! -s exported.pem ] || fail "a private key was written"
    # One spelling everywhere: the plain path, as servers take it, works
    # in the openssl command line too, beside keyfence:PATH.
    for k in ec256 rsa2048 ed25519; do
        ok "$cnf" pkey -in "$keys/$k.kfk" -pubout -out "plain-$k.pub"
        ok "$cnf" pkey -in "keyfence:$keys/$k.kfk" -pubout -out "uri-$k.pub"
        cmp -s "plain-$k.pub" "uri-$k.pub" || fail "$k: the plain path and keyfence: give other keys"
        ok "$cnf" req -new -key "$keys/$k.kfk" -subj /CN=plain -out "plain-$k.csr"
        ok "$cnf" req -verify -in "plain-$k.csr" -noout
    done
    # A key this machine may not open, by its plain path: OpenSSL 3.0's
    # file: store drops the decoder's error, so the provider's own line
    # says why.
    refused "$cnf" "POLICY_NOT_SATISFIED" pkey -in "$keys/fr.kfk" -pubout
done

# Token keys (docs/pkcs11.md): key files naming a SoftHSM2 key by its
# PKCS#11 URI, in process and in the key process, for every key type; the
# certificates carry the public key openssl made the key with.
fixture_rc=0
bash "$here/../../../vectors/softhsm-fixture.sh" "$work/hsm" || fixture_rc=$?
if [ "$fixture_rc" = 0 ]; then
    set -a
    # shellcheck disable=SC1091
    . "$work/hsm/env"
    set +a
    for label in tls-p256 tls-p384 tls-rsa tls-ed; do
        "$cli" provider-key --pkcs11 "pkcs11:token=edge;object=$label" --out "tok-$label.kfk"
        grep -q "BEGIN KEYFENCE KEY" "tok-$label.kfk" || fail "no key file for $label"
        openssl pkey -in "$work/hsm/keys/$label.pem" -pubout -out "tok-$label.ref.pub"
        for cnf in local.cnf isolated.cnf; do
            md=()
            [ "$label" = tls-p384 ] && md=(-sha384)
            ok "$cnf" req -x509 -new -key "keyfence:$PWD/tok-$label.kfk" "${md[@]}" -subj "/CN=token $label" -days 1 \
                -out "tok-$label-$cnf.crt"
            ok "$cnf" verify -CAfile "tok-$label-$cnf.crt" "tok-$label-$cnf.crt"
            openssl x509 -in "tok-$label-$cnf.crt" -noout -pubkey >"tok-$label-$cnf.pub"
            cmp -s "tok-$label-$cnf.pub" "tok-$label.ref.pub" || fail "$label ($cnf): the certificate's key is not the token's"
        done
        refused local.cnf "cannot be exported" pkey -in "tok-$label.kfk" -out exported.pem
    done
    # A key the token does not hold: no key file, and the reason.
    "$cli" provider-key --pkcs11 "pkcs11:token=edge;object=nothing" --out none.kfk 2>err.txt && fail "a missing token key made a key file"
    grep -q "no private key with object=nothing" err.txt || { cat err.txt >&2; fail "no reason for the missing token key"; }
    echo "token keys: req -x509 signed in the token (in process and isolated), verified, the key the token's"
elif [ "$fixture_rc" = 77 ]; then
    echo "*** SKIPPED: token keys (no SoftHSM2) ***"
else
    fail "vectors/softhsm-fixture.sh failed"
fi

# provider-config --include: the system's openssl.cnf, its settings kept,
# with the provider added by one .include line at its end.
"$cli" provider-config --module "$modules/keyfence.so" --include >include.cnf
cp /etc/ssl/openssl.cnf system.cnf
echo ".include $PWD/include.cnf" >>system.cnf
"${asan_env[@]}" env OPENSSL_CONF="$PWD/system.cnf" openssl list -providers | grep -q "keyfence provider" ||
    fail "the included configuration does not load the provider"
ok system.cnf req -new -key "$keys/ec256.kfk" -subj /CN=included -out included.csr
ok system.cnf req -verify -in included.csr -noout
ok system.cnf dgst -sha256 -out /dev/null system.cnf
echo "operator commands: all signed, verified and refused as expected"
