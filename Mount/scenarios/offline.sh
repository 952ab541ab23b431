#!/usr/bin/env bash
# scenario-providers: local (goes offline by removing the source directory; a stopped WebDAV server is not scripted yet)
# The provider goes offline. Items already downloaded keep working from the cache, listings and
# stat answer from the metadata kept locally, and an item that is not cached fails at once with
# ENETUNREACH ("Network is unreachable"), never a hang. When the provider is back, it reads whole.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file cached.bin 2MiB
make_file uncached.bin 2MiB
make_file never-listed/inside.bin 1KiB
mount_source --stall-timeout 2s
ls -l "$MNT" >/dev/null                               # the listing is known before going offline
listed="$EPOCHREALTIME"
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
expect_state "$MNT/uncached.bin" error
expect_error_xattr "$MNT/uncached.bin" ENETUNREACH
expect_status_error "$MNT/uncached.bin" ENETUNREACH
# Metadata from the cache, fast.
expect_fast 3 ls -l "$MNT"
expect_fast 3 stat "$MNT/uncached.bin"
reachable="$(status_json | python3 -c 'import json,sys; print(json.load(sys.stdin)["provider"]["reachable"])')"
[[ "$reachable" == False ]] || fail "providerfs status says the provider is reachable while offline"
say "ok: providerfs status: provider reachable = $reachable"

# Offline always strikes metadata calls too (--metadata changes nothing): past the listing's
# expiry (5 s) ls and stat still answer from the metadata kept locally, an unlisted folder fails.
while (( $(micros) - $(micros "$listed") < 5200000 )); do sleep 0.1; done
expect_fast 3 ls -l "$MNT"
expect_fast 3 stat "$MNT/uncached.bin"
expect_failure ENETUNREACH 5 ls "$MNT/never-listed"
expect_content cat "$MNT/cached.bin"
expect_errno cat "$MNT/uncached.bin" ENETUNREACH 5

# Back online: the uncached item reads whole.
providerfs fault clear --all "$MNT"
expect_content cat "$MNT/uncached.bin"
expect_state "$MNT/uncached.bin" materialized

scenario_done
