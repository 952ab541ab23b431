#!/usr/bin/env bash
# A provider that stops sending (a dead connection that stays open). With the mount's stall
# deadline set short (--stall-timeout 1s; the default is 30 s) every reader gets ETIMEDOUT one
# deadline after the last byte arrived, while every other item and every listing stays fast.
# (rclone: EIO after ~60 min at its defaults, reference/rclone-under-faults.md row 3c.)
source "$(dirname "$0")/lib.sh"
scenario_start

make_file stuck.bin 2MiB
make_file other.bin 1MiB
mkdir -p "$SRC/folder" && echo hello >"$SRC/folder/hello.txt"
mount_source --stall-timeout 1s
file="$MNT/stuck.bin"

providerfs fault add "$file" --stall --at 1MiB --times 0   # stops at 1 MiB until cleared
for reader in cat dd python; do
    expect_errno "$reader" "$file" ETIMEDOUT 4
done
expect_state "$file" error
expect_error_xattr "$file" ETIMEDOUT
expect_status_error "$file" ETIMEDOUT $(size_bytes 1MiB)

# While a reader waits on the stalled item, everything else answers at once, and the waiting
# reader ends at once on SIGKILL.
in_background cat "$file" >/dev/null 2>&1
blocked=$!
expect_fast 0.5 ls -l "$MNT"
expect_fast 0.5 stat "$file"
expect_fast 0.5 ls "$MNT/folder"
expect_content cat "$MNT/other.bin"
expect_content cat "$MNT/folder/hello.txt"
kill -0 "$blocked" 2>/dev/null || fail "the reader of the stalled item was no longer waiting"
killed="$EPOCHREALTIME"
kill -KILL "$blocked"
wait_for_pid "$blocked" 1 || fail "a reader waiting on a stall was still there 1 s after SIGKILL"
say "ok: the waiting reader ended $(elapsed_since "$killed") s after SIGKILL"

# A stall shorter than the deadline is only slow: no error. (First let the stalled download the
# killed reader left end at its deadline; a read right after `fault clear` while it still runs is
# stall-clear.sh.)
for _ in $(seq 100); do [[ "$(xattr "$file" state)" != downloading ]] && break; sleep 0.05; done
providerfs fault clear "$file"
providerfs fault add "$file" --stall 300ms --at 1536KiB
expect_content dd "$file"
expect_state "$file" materialized
expect_status_clean "$file"

scenario_done
