#!/usr/bin/env bash
# Cache control from a shell (issue 27; docs/MOUNT.md): `providerfs evict` returns a downloaded
# file to a placeholder and frees its space, and refuses one that is open; `--cache-max-size`
# keeps the downloaded content within the limit as files are read, least recently used first; a
# process that must not download (a copy of cat named like an indexer) gets EDEADLK for a
# placeholder while ordinary readers download.
source "$(dirname "$0")/lib.sh"
scenario_start

for index in 0 1 2 3 4 5; do make_file "f$index.bin" 2MiB; done
make_file docs/a.txt 10KiB
mount_source --cache-max-size 5MiB

# Evict: materialized → dataless, its blocks gone, the same bytes when read again.
providerfs download "$MNT/f0.bin" >/dev/null
expect_state "$MNT/f0.bin" materialized
providerfs evict "$MNT/f0.bin" >"$S/out/evict.out" || fail "evict failed: $(cat "$S/out/evict.out")"
grep -q "f0.bin: evicted" "$S/out/evict.out" || fail "evict said: $(cat "$S/out/evict.out")"
expect_state "$MNT/f0.bin" dataless
[[ "$(stat -c %b "$MNT/f0.bin")" == 0 ]] || fail "f0.bin still has $(stat -c %b "$MNT/f0.bin") blocks after evict"
say "ok: evicted, st_blocks 0"
expect_content cat "$MNT/f0.bin"

# Open: refused with the reason, exit 1, nothing removed.
exec 7<"$MNT/f0.bin"
if providerfs evict "$MNT/f0.bin" >"$S/out/open.out" 2>&1; then fail "evict of an open file succeeded"; fi
grep -q "not evicted: open" "$S/out/open.out" || fail "evict of an open file said: $(cat "$S/out/open.out")"
exec 7<&-
expect_state "$MNT/f0.bin" materialized
say "ok: an open file is refused (exit 1, \"open\")"

# The limit: six 2 MiB files read in turn through a 5 MiB mount; the content directory stays
# within it (checked after each), the oldest are placeholders again, every file reads whole.
for index in 1 2 3 4 5; do
    expect_content cat "$MNT/f$index.bin"
    deadline=$(( $(micros) + $(seconds_to_micros 10) ))
    while (( $(du -s --block-size=1 "$S/cache/content" | cut -f1) > $(size_bytes 5MiB) )); do
        (( $(micros) < deadline )) || fail "the cache holds $(du -sh "$S/cache/content" | cut -f1) after f$index.bin, over 5 MiB"
        sleep 0.05
    done
done
expect_state "$MNT/f5.bin" materialized
expect_state "$MNT/f0.bin" dataless
status_json >"$S/out/status.json"
python3 - "$S/out/status.json" <<'PY' || fail "status shows no limits: $(cat "$S/out/status.json")"
import json, sys
limits = json.load(open(sys.argv[1]))["cache"]["limits"]
assert limits["maximumSize"] == 5 << 20 and limits["evictions"] >= 3 and "blockedReason" not in limits, limits
PY
say "ok: within 5 MiB after each file; status counts the evictions"
expect_content cat "$MNT/f0.bin"

# A process that must not download: EDEADLK, nothing fetched; an ordinary reader downloads.
cp /bin/cat "$S/tracker-miner-fs-3"
if "$S/tracker-miner-fs-3" "$MNT/docs/a.txt" >/dev/null 2>"$S/out/indexer.err"; then
    fail "an indexer downloaded a placeholder"
fi
grep -q "$(errno_message EDEADLK)" "$S/out/indexer.err" || fail "the indexer got: $(cat "$S/out/indexer.err")"
expect_state "$MNT/docs/a.txt" dataless
say "ok: tracker-miner-fs-3 → EDEADLK, nothing downloaded"
expect_content cat "$MNT/docs/a.txt"
"$S/tracker-miner-fs-3" "$MNT/docs/a.txt" >/dev/null || fail "the indexer cannot read a downloaded file"
say "ok: once downloaded, the indexer reads it"

scenario_done
