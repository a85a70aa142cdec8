#!/usr/bin/env bash
# make_keys.sh CLI DIR: what the provider's tests use, made fresh in DIR
# with the `keyfence` command line CLI and openssl:
#   store/, served/ (its servers' copy, which the key agent reads),
#   us.machine (country=US), fr.machine (country=FR);
#   a CA (ca.pem) and, for each of ec256 ec384 rsa2048 ed25519: NAME.pem
#   (the plain key), NAME.env (wrapped under `country: US`), NAME.kfk (the
#   provider's key file), NAME.crt (its certificate from the CA, for
#   localhost and 127.0.0.1);
#   fr.kfk: a key only FR machines may open, whose file names fr.machine,
#   which then gets the US machine's key instead (a machine that may not).
set -euo pipefail
cli="$1" dir="$2"
mkdir -p "$dir"
cd "$dir"
"$cli" authority init --store store >/dev/null
"$cli" authority issue --store store --attrs country=US --out us.machine >/dev/null
"$cli" authority issue --store store --attrs country=FR --out fr.machine >/dev/null
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 \
    -subj /CN=keyfence-test-ca 2>/dev/null
gen() {
    case "$1" in
        ec256) openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 ;;
        ec384) openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 ;;
        rsa2048) openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 ;;
        ed25519) openssl genpkey -algorithm ED25519 ;;
    esac
}
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >san.ext
for k in ec256 ec384 rsa2048 ed25519; do
    gen $k >$k.pem 2>/dev/null
    "$cli" authority wrap --store store --policy 'country: US' --in $k.pem --out $k.env >/dev/null
    "$cli" provider-key --envelope $k.env --store store --machine-key us.machine --out $k.kfk
    openssl req -new -key $k.pem -subj /CN=localhost -out $k.csr 2>/dev/null
    openssl x509 -req -in $k.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext \
        -out $k.crt 2>/dev/null
done
gen ec256 >fr.pem 2>/dev/null
"$cli" authority wrap --store store --policy 'country: FR' --in fr.pem --out fr.env >/dev/null
"$cli" provider-key --envelope fr.env --store store --machine-key fr.machine --out fr.kfk
cp us.machine fr.machine
# The servers' copy the key agent reads: the store without authority/.
"$cli" authority export --store store --to served >/dev/null
