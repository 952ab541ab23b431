#!/usr/bin/env bash
# Pins from a shell (issue 27 item 2, D-445; docs/MOUNT.md): `providerfs pin` keeps a folder
# downloaded — its files arrive with no reader, a file created in it at the source too — and
# `evict` refuses them ("pinned"); `status` counts them; `setfattr -n user.providerfs.pin -v
# unpinned` evicts them; `pin --inherit` goes back to the parent's policy.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file docs/a.bin 1MiB
make_file docs/deep/b.bin 512KiB
make_file other/c.bin 256KiB
mount_source

# wait_state PATH STATE: polls user.providerfs.state (nothing reads the file) for up to 20 s.
wait_state() {
    local deadline=$(( $(micros) + $(seconds_to_micros 20) ))
    until [[ "$(xattr "$1" state)" == "$2" ]]; do
        (( $(micros) < deadline )) || fail "$1 is $(xattr "$1" state), not $2, after 20 s"
        sleep 0.05
    done
    say "ok: $1 is $2 (nothing read it)"
}

providerfs pin "$MNT/docs" >"$S/out/pin.out" || fail "pin failed: $(cat "$S/out/pin.out")"
grep -q "docs: pinned; kept downloaded" "$S/out/pin.out" || fail "pin said: $(cat "$S/out/pin.out")"
wait_state "$MNT/docs/a.bin" materialized
wait_state "$MNT/docs/deep/b.bin" materialized
expect_state "$MNT/other/c.bin" dataless
[[ "$(xattr "$MNT/docs" pin)" == pinned && "$(xattr "$MNT/docs/deep/b.bin" pin)" == inherited ]] \
    || fail "user.providerfs.pin: docs $(xattr "$MNT/docs" pin), docs/deep/b.bin $(xattr "$MNT/docs/deep/b.bin" pin)"
say "ok: getfattr user.providerfs.pin: docs pinned, docs/deep/b.bin inherited"

if providerfs evict "$MNT/docs/a.bin" >"$S/out/evict.out" 2>&1; then fail "evict of a pinned file succeeded"; fi
grep -q "not evicted: pinned" "$S/out/evict.out" || fail "evict said: $(cat "$S/out/evict.out")"
expect_state "$MNT/docs/a.bin" materialized
say "ok: evict refuses a pinned file (exit 1, \"pinned\")"

# Created at the source inside the pinned folder: downloaded unread.
make_file docs/deep/new.bin 300KiB
wait_state "$MNT/docs/deep/new.bin" materialized
expect_content cat "$MNT/docs/deep/new.bin"

status_json >"$S/out/status.json"
python3 - "$S/out/status.json" <<'PY' || fail "status shows no pins: $(cat "$S/out/status.json")"
import json, sys
pins = json.load(open(sys.argv[1]))["cache"]["pins"]
assert pins["pinnedItems"] == 1 and pins["files"] == 3 and pins["downloadedFiles"] == 3, pins
PY
say "ok: status counts 3 of 3 pinned files downloaded"

# setfattr: a bad value is EINVAL; unpinned evicts at once.
if setfattr -n user.providerfs.pin -v always "$MNT/docs" 2>"$S/out/bad.err"; then fail "setfattr took 'always'"; fi
grep -q "$(errno_message EINVAL)" "$S/out/bad.err" || fail "setfattr of a bad value said: $(cat "$S/out/bad.err")"
setfattr -n user.providerfs.pin -v unpinned "$MNT/docs" || fail "setfattr unpinned failed"
expect_state "$MNT/docs/a.bin" dataless
expect_state "$MNT/docs/deep/b.bin" dataless
[[ "$(stat -c %b "$MNT/docs/a.bin")" == 0 ]] || fail "docs/a.bin has $(stat -c %b "$MNT/docs/a.bin") blocks after unpin"
say "ok: setfattr unpinned evicted the folder; a bad value is EINVAL"

providerfs pin --inherit "$MNT/docs" >"$S/out/inherit.out" || fail "pin --inherit failed"
[[ "$(xattr "$MNT/docs" pin)" == inherited ]] || fail "docs is $(xattr "$MNT/docs" pin) after pin --inherit"
say "ok: pin --inherit: $(cat "$S/out/inherit.out")"
expect_content cat "$MNT/docs/a.bin"

scenario_done
