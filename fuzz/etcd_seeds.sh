#!/usr/bin/env bash
# Records the seeds of fuzz target etcd_replies (fuzz/seeds/etcd_replies/):
# what a real etcd's JSON gateway answers to the requests the etcd store
# makes (core/src/wrap/etcd.rs), its errors, and its watch stream, with
# and without a compaction. Needs etcd and curl; run from the repository
# root. Keys are under `kf/`, the store prefix the fuzz target assumes.
set -euo pipefail
out=fuzz/seeds/etcd_replies
mkdir -p "$out"
dir="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
etcd --data-dir "$dir/data" --listen-client-urls "http://127.0.0.1:$port" \
    --advertise-client-urls "http://127.0.0.1:$port" --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-cluster "default=http://127.0.0.1:$((port + 1))" >"$dir/log" 2>&1 &
pid=$!
trap 'kill $pid; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
post() { curl -sS -X POST "http://127.0.0.1:$port$1" -d "$2" "${@:3}"; }
b64() { printf %s "$1" | base64 -w0; }
for _ in $(seq 100); do post /v3/kv/range '{"key":"AA=="}' >/dev/null 2>&1 && break; sleep 0.1; done

post /v3/kv/put "{\"key\":\"$(b64 kf/envelopes/aa)\",\"value\":\"$(b64 'KFE2 an envelope')\"}" >"$out/put"
post /v3/kv/put "{\"key\":\"$(b64 kf/envelopes/bb)\",\"value\":\"$(b64 'KFE2 another')\"}" >/dev/null
post /v3/kv/range "{\"key\":\"$(b64 kf/envelopes/aa)\"}" >"$out/range"
post /v3/kv/range "{\"key\":\"$(b64 kf/envelopes/zz)\"}" >"$out/range_none"
post /v3/kv/range "{\"key\":\"$(b64 kf/public/generations)\",\"count_only\":true}" >"$out/revision"
# A listing's pages: keys only, the first of two, then the last.
end="$(b64 kf/envelopes0)"
post /v3/kv/range "{\"key\":\"$(b64 kf/envelopes/)\",\"range_end\":\"$end\",\"limit\":1,\"keys_only\":true}" >"$out/page_more"
post /v3/kv/range "{\"key\":\"$(b64 kf/envelopes/)\",\"range_end\":\"$end\",\"limit\":1000,\"keys_only\":true}" >"$out/page_last"
# get_many: reads in one transaction, one key missing.
post /v3/kv/txn "{\"success\":[{\"request_range\":{\"key\":\"$(b64 kf/envelopes/aa)\"}},{\"request_range\":{\"key\":\"$(b64 kf/envelopes/zz)\"}}]}" >"$out/txn_values"
# commit: a comparison that holds, then one that does not.
post /v3/kv/txn "{\"compare\":[{\"key\":\"$(b64 kf/envelopes/cc)\",\"target\":\"VERSION\",\"result\":\"EQUAL\",\"version\":\"0\"}],\"success\":[{\"request_put\":{\"key\":\"$(b64 kf/envelopes/cc)\",\"value\":\"$(b64 third)\"}},{\"request_delete_range\":{\"key\":\"$(b64 kf/envelopes/bb)\"}}]}" >"$out/txn_commit"
post /v3/kv/txn "{\"compare\":[{\"key\":\"$(b64 kf/envelopes/cc)\",\"target\":\"VERSION\",\"result\":\"EQUAL\",\"version\":\"0\"}],\"success\":[]}" >"$out/txn_conflict"
# An error answer: a key that is not base64.
post /v3/kv/range '{"key":"not base64!"}' >"$out/error" || true
# The watch stream from the first revision: the created message, then
# the events (puts, a delete). etcd keeps it open: curl stops after 2 s.
post /v3/watch "{\"create_request\":{\"key\":\"$(b64 kf/)\",\"range_end\":\"$(b64 kf0)\",\"start_revision\":\"2\"}}" \
    --max-time 2 -N >"$out/watch" 2>/dev/null || true
# After a compaction, a watch from before it.
rev="$(post /v3/kv/put "{\"key\":\"$(b64 kf/envelopes/dd)\",\"value\":\"$(b64 fourth)\"}" | sed 's/.*"revision":"\([0-9]*\)".*/\1/')"
post /v3/kv/compaction "{\"revision\":\"$rev\",\"physical\":true}" >/dev/null
post /v3/watch "{\"create_request\":{\"key\":\"$(b64 kf/)\",\"range_end\":\"$(b64 kf0)\",\"start_revision\":\"2\"}}" \
    --max-time 2 -N >"$out/watch_compacted" 2>/dev/null || true
# Answers edited where etcd does not go: a value that is not a string,
# one that is not base64, a key outside the store's prefix, a key that is
# not UTF-8.
sed 's|"value":"[^"]*"|"value":7|' "$out/range" >"$out/edited_value_not_string"
sed 's|"value":"[^"]*"|"value":"not base64!"|' "$out/range" >"$out/edited_value_not_base64"
sed "s|\"key\":\"$(b64 kf/envelopes/bb)\"|\"key\":\"$(b64 other/bb)\"|" "$out/page_last" >"$out/edited_key_outside"
sed "s|\"key\":\"$(b64 kf/envelopes/bb)\"|\"key\":\"$(printf '\377\376' | base64 -w0)\"|" "$out/page_last" >"$out/edited_key_not_utf8"
# Errors whose gRPC code says nothing, worth another member by their
# message alone (a leader election, a slow member).
for m in leader:"etcdserver: leader changed" timeout:"etcdserver: request timed out"; do
    sed "s|illegal base64 data at input byte 3|${m#*:}|g; s|\"code\":3|\"code\":2|" "$out/error" >"$out/edited_error_${m%%:*}"
done
ls -l "$out"
