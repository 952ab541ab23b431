#!/usr/bin/env bash
# The provider goes offline: locally by a fault (`providerfs fault add --offline`), over WebDAV by
# stopping the server for real (its port then refuses connections). Items already downloaded keep
# working from the cache, listings and stat answer from the metadata kept locally, and an item
# that is not cached fails at once with ENETUNREACH ("Network is unreachable"), never a hang. A
# file written meanwhile is kept and queued. When the provider is back, the uncached item reads
# whole and the written file reaches it.
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

if [[ "${SCENARIO_PROVIDER:-local}" == webdav ]]; then
    stop_webdav_server
else
    providerfs fault add "$MNT" --offline --times 0   # the whole provider, until cleared
fi
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

# Writes while offline: a cached file rewritten, and a new file, each closed and read back from
# the mount; their uploads wait.
written=(cached.bin written-offline.bin)
for name in "${written[@]}"; do
    head -c 100000 /dev/urandom >"$S/reference/$name"
    cp "$S/reference/$name" "$MNT/$name" || fail "a write of $name while offline failed"
    cmp -s "$S/reference/$name" "$MNT/$name" || fail "$name written offline reads otherwise"
    ! cmp -s "$S/reference/$name" "$SRC/$name" || fail "the provider got $name while offline"
    say "ok: $name written offline is kept by the mount (state $(xattr "$MNT/$name" state))"
done

# Offline always strikes metadata calls too (--metadata changes nothing): past the listing's
# expiry (5 s) ls and stat still answer from the metadata kept locally, an unlisted folder fails.
while (( $(micros) - $(micros "$listed") < 5200000 )); do sleep 0.1; done
expect_fast 3 ls -l "$MNT"
expect_fast 3 stat "$MNT/uncached.bin"
expect_failure ENETUNREACH 5 ls "$MNT/never-listed"
cmp -s "$S/reference/cached.bin" "$MNT/cached.bin" || fail "cached.bin reads otherwise past the listing's expiry"
expect_errno cat "$MNT/uncached.bin" ENETUNREACH 5

# Back online: the uncached item reads whole, and the file written offline reaches the provider.
if [[ "${SCENARIO_PROVIDER:-local}" == webdav ]]; then
    start_webdav_server
else
    providerfs fault clear --all "$MNT"
fi
back="$EPOCHREALTIME"
expect_content cat "$MNT/uncached.bin"
expect_state "$MNT/uncached.bin" materialized
for name in "${written[@]}"; do
    until cmp -s "$S/reference/$name" "$SRC/$name"; do
        (( $(micros) - $(micros "$back") < 30000000 )) || fail "$name written offline did not reach the provider within 30 s of its return"
        sleep 0.2
    done
    say "ok: $name written offline reached the provider $(elapsed_since "$back") s after it came back"
    expect_state "$MNT/$name" materialized
done

scenario_done
