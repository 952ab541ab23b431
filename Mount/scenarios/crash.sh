#!/usr/bin/env bash
# The daemon is killed (kill -9) in the middle of a download. The reader gets an error at once,
# `providerfs mount` onto the dead mount cleans it up and mounts again, at most the last second
# of fetching is fetched again, and the file then reads whole and correct.
# (rclone re-downloads from offset 0 after the same crash, rclone-under-faults.md row 6.)
source "$(dirname "$0")/lib.sh"
scenario_start

make_file big.bin 8MiB
mount_source
file="$MNT/big.bin"
providerfs fault add "$file" --slow 2MiB/s --times 0

background_read "$file" "$S/out/reader"
reader=$!
wait_for_progress "$file" $((3 << 20))
present=$PRESENT
kill -KILL "$DAEMON_PID"
killed_at="$EPOCHREALTIME"
say "killed the daemon (pid $DAEMON_PID) with $present bytes present"
wait_for_pid "$reader" 5 || fail "the reader was still blocked 5 s after the daemon died"
say "ok: the reader ended $(elapsed_since "$killed_at") s after the kill: $(cat "$S/out/reader")"
case "$(cat "$S/out/reader")" in
    "errno ENOTCONN" | "errno ECONNABORTED") ;;   # dead mount / blocked in a request at the kill
    *) fail "the reader got '$(cat "$S/out/reader")', expected ENOTCONN or ECONNABORTED" ;;
esac

# Mount again onto the dead mount point, with the same cache: no unmount needed first.
DAEMON_PID=""
mount_source
after="$(xattr "$file" progress)"; after="${after%/*}"
say "after the remount: $after bytes present ($(xattr "$file" state)); $present were present at the kill"
# At most the last second of fetching (2 MiB at 2 MiB/s) is lost.
[[ $after -ge $((present - (2 << 20))) ]] || fail "only $after of the $present bytes present at the kill survived the crash"

providerfs fault clear "$file"
expect_content cat "$file"
expect_state "$file" materialized

scenario_done
