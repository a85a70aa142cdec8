#!/usr/bin/env bash
# bench_token.sh CLI MODULES WORK [SECONDS] [ROUNDS]: signatures per
# CPU-second with keys in a SoftHSM2 token (vectors/softhsm-fixture.sh),
# signed by unmodified OpenSSL (bench_sign.c, an `openssl speed`-style
# loop on two threads) through keyfence's provider (a key file naming the
# key's URI) and through pkcs11-provider (the URI itself), alternated
# ROUNDS times in one run so both see the same machine. Prints one JSON
# line per key type with the median ratio (target: keyfence >= 1.0x
# pkcs11-provider). pkcs11-provider is found at KEYFENCE_PKCS11_PROVIDER
# or where Debian 13 and Ubuntu 24.04 install it
# (/usr/lib/<arch>/ossl-modules/pkcs11.so, package pkcs11-provider); on
# Debian 12, build its release 0.5 (meson setup build && ninja -C build)
# and point KEYFENCE_PKCS11_PROVIDER at build/src/pkcs11.so. Without it,
# only keyfence's figures are printed.
# MODULES should hold a release build (cmake -DCMAKE_BUILD_TYPE=Release).
set -euo pipefail
cli="$(realpath "$1")" modules="$(realpath "$2")" work="$3" secs="${4:-3}" rounds="${5:-3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work" && mkdir -p "$work" && cd "$work" && work="$PWD"
cc -O2 -o bench_sign "$here/bench_sign.c" -lcrypto -lpthread
bash "$here/../../../vectors/softhsm-fixture.sh" "$work/hsm" >/dev/null
set -a
# shellcheck disable=SC1091
. "$work/hsm/env"
set +a
p11="${KEYFENCE_PKCS11_PROVIDER:-}"
if [ -z "$p11" ]; then
    for m in /usr/lib/*/ossl-modules/pkcs11.so /usr/lib64/ossl-modules/pkcs11.so; do
        [ -e "$m" ] && { p11="$m"; break; }
    done
fi
"$cli" provider-config --module "$modules/keyfence.so" >keyfence.cnf
cnf=keyfence.cnf
if [ -n "$p11" ]; then
    # One configuration loads both providers for both runs: SoftHSM2 does
    # its own cryptography with this process's libcrypto, whose decoders
    # are slower with more providers loaded (SoftHSM2's Ed25519 loses a
    # third of its speed beside keyfence's provider), so each provider is
    # measured beside the other.
    cnf=both.cnf
    cat >both.cnf <<EOF
openssl_conf = openssl_init
[openssl_init]
providers = provider_sect
[provider_sect]
default = default_sect
keyfence = keyfence_sect
pkcs11 = pkcs11_sect
[default_sect]
activate = 1
[keyfence_sect]
module = $modules/keyfence.so
activate = 1
[pkcs11_sect]
module = $p11
pkcs11-module-path = $KEYFENCE_PKCS11_MODULE
pkcs11-module-token-pin = file:$KEYFENCE_PKCS11_PIN_FILE
activate = 1
EOF
else
    echo "pkcs11-provider not found (KEYFENCE_PKCS11_PROVIDER): keyfence's figures only" >&2
fi
# run CNF KEY DIGEST: one measurement's signatures per CPU-second,
# checked against the public key openssl made with the key.
run() {
    OPENSSL_CONF="$work/$1" ./bench_sign "$2" "$secs" 2 "$3" "$work/$label.pub" | sed -n 's/.*"per_cpu_s": \([0-9]*\).*/\1/p'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for case in "ecdsa-p256-sha256 tls-p256 sha256" "rsa-pkcs1-sha256 tls-rsa sha256" "ed25519 tls-ed none"; do
    read -r alg label md <<<"$case"
    "$cli" provider-key --pkcs11 "pkcs11:token=edge;object=$label" --out "$label.kfk"
    openssl pkey -in "$work/hsm/keys/$label.pem" -pubout -out "$label.pub"
    kf=() pp=() ratios=()
    for r in $(seq "$rounds"); do
        # Alternate which goes first, so neither always meets a cold cache.
        if [ $((r % 2)) = 1 ]; then
            kf+=("$(run "$cnf" "keyfence:$work/$label.kfk" "$md")")
            [ -z "$p11" ] || pp+=("$(run "$cnf" "pkcs11:token=edge;object=$label;type=private" "$md")")
        else
            [ -z "$p11" ] || pp+=("$(run "$cnf" "pkcs11:token=edge;object=$label;type=private" "$md")")
            kf+=("$(run "$cnf" "keyfence:$work/$label.kfk" "$md")")
        fi
        [ -z "$p11" ] || ratios+=("$(awk -v a="${kf[-1]}" -v b="${pp[-1]}" 'BEGIN { printf "%.3f", a / b }')")
    done
    k="$(printf '%s\n' "${kf[@]}" | median)"
    if [ -n "$p11" ]; then
        p="$(printf '%s\n' "${pp[@]}" | median)"
        ratio="$(printf '%s\n' "${ratios[@]}" | median)"
        printf '{"alg": "%s", "keyfence_per_cpu_s": %s, "pkcs11_provider_per_cpu_s": %s, "ratio": %s, "rounds": [%s], "target": 1.0}\n' \
            "$alg" "$k" "$p" "$ratio" "$(IFS=,; echo "${ratios[*]}")"
    else
        printf '{"alg": "%s", "keyfence_per_cpu_s": %s}\n' "$alg" "$k"
    fi
done
