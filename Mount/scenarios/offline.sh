#!/usr/bin/env bash
# The provider goes offline. Items already downloaded keep working from the cache, listings and
# stat answer from the metadata kept locally, and an item that is not cached fails at once with
# ENETUNREACH ("Network is unreachable"), never a hang. When the provider is back, it reads whole.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file cached.bin 2MiB
make_file uncached.bin 2MiB
mount_source --stall-timeout 2s
ls -l "$MNT" >/dev/null                               # the listing is known before going offline
providerfs download "$MNT/cached.bin" >/dev/null      # one item fully downloaded
expect_state "$MNT/cached.bin" materialized

providerfs fault add "$MNT" --offline --times 0       # the whole provider, until cleared
# Cached: the bytes come from the cache, nothing changes.
for reader in cat dd python; do
    expect_content "$reader" "$MNT/cached.bin"
done
expect_state "$MNT/cached.bin" materialized
# Not cached: ENETUNREACH at once.
for reader in cat dd python; do
    expect_errno "$reader" "$MNT/uncached.bin" ENETUNREACH 5
done
say "uncached.bin: state $(xattr "$MNT/uncached.bin" state), error '$(xattr "$MNT/uncached.bin" error || true)'"
# Metadata from the cache, fast.
expect_fast 3 ls -l "$MNT"
expect_fast 3 stat "$MNT/uncached.bin"
reachable="$(status_json | python3 -c 'import json,sys; print(json.load(sys.stdin)["provider"]["reachable"])')"
[[ "$reachable" == False ]] || fail "providerfs status says the provider is reachable while offline"
say "ok: providerfs status: provider reachable = $reachable"

# --metadata: listing, lookup and getattr of the provider fail as well.
providerfs fault clear --all
providerfs fault add "$MNT" --offline --metadata --times 0
set +e
ls_out="$(timeout 5 ls -l "$MNT" 2>&1)"; ls_status=$?
stat_out="$(timeout 5 stat -c %s "$MNT/uncached.bin" 2>&1)"; stat_status=$?
set -e
say "with --metadata: ls → exit $ls_status ($(head -c 120 <<<"$ls_out" | tr '\n' ' ')), stat → exit $stat_status ($stat_out)"
[[ $ls_status -ne 124 && $stat_status -ne 124 ]] || fail "ls or stat hung with --offline --metadata"
expect_content cat "$MNT/cached.bin"
expect_errno cat "$MNT/uncached.bin" ENETUNREACH 5

# Back online: the uncached item reads whole.
providerfs fault clear --all
expect_content cat "$MNT/uncached.bin"
expect_state "$MNT/uncached.bin" materialized

scenario_done
