#!/usr/bin/env bash
# A key server on loopback for the bindings' remote-signing tests, set up as
# docs/remote.md deploys one (C, Python and Node run the same fixture).
#
#   vectors/remote-fixture.sh KEYFENCE DIR
#
# KEYFENCE is the `keyfence` command line. In DIR it makes, with the
# `openssl` command line: a mesh CA (ca.pem) and certificates for the
# server (sfo1.pem/.key, DNS name sfo1) and a client (client.pem/.key), a
# client certificate from another CA (stranger.pem/.key); with KEYFENCE: an
# authority store (store/), machine keys for a US server (sfo1.machine) and
# a Tokyo client (nrt1.machine), and an ECDSA P-256 key (key.pem, public
# half key.pub.pem) wrapped under `country: US` (key.env), which the Tokyo
# machine may not open. Then it starts `keyfence serve` for sfo1 on a free
# loopback port and returns once it listens: its address is in
# server.addr, its pid in server.pid. The server stops by itself after
# 300 s; tests kill it when done.
set -euo pipefail
kf="$1"
dir="$2"
mkdir -p "$dir"
cd "$dir"

ossl() { openssl "$@" 2>/dev/null; }
ca() { # ca NAME: NAME.key, NAME.pem
    ossl ecparam -name prime256v1 -genkey -noout -out "$1.key"
    ossl req -x509 -new -key "$1.key" -subj "/CN=$1" -days 2 -out "$1.pem"
}
issue() { # issue CA NAME: NAME.key, NAME.pem with DNS:NAME, signed by CA
    ossl ecparam -name prime256v1 -genkey -noout -out "$2.key"
    ossl req -new -key "$2.key" -subj "/CN=$2" -out "$2.csr"
    printf 'subjectAltName=DNS:%s\n' "$2" >"$2.ext"
    ossl x509 -req -in "$2.csr" -CA "$1.pem" -CAkey "$1.key" -CAcreateserial -days 2 -extfile "$2.ext" -out "$2.pem"
}
ca ca
issue ca sfo1
issue ca client
ca other-ca
issue other-ca stranger

"$kf" authority init --store store >/dev/null
"$kf" authority issue --store store --attrs 'country=US,region=NA' --out sfo1.machine >/dev/null
"$kf" authority issue --store store --attrs 'country=JP,region=APAC' --out nrt1.machine >/dev/null
ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out key.pem
ossl pkey -in key.pem -pubout -out key.pub.pem
"$kf" authority wrap --store store --policy 'country: US' --in key.pem --out key.env >/dev/null

"$kf" serve --listen 127.0.0.1:0 --name sfo1 --seconds 300 --threads 1 \
    --cert sfo1.pem --key sfo1.key --ca ca.pem \
    --store store --machine-key sfo1.machine --envelopes key.env >server.out 2>server.err &
echo $! >server.pid
for _ in $(seq 200); do
    if grep -q '^listening ' server.out 2>/dev/null; then
        sed -n 's/^listening //p' server.out | head -n 1 >server.addr
        exit 0
    fi
    kill -0 "$(cat server.pid)" 2>/dev/null || { cat server.err >&2; exit 1; }
    sleep 0.05
done
echo "remote-fixture: the server did not start listening" >&2
exit 1
