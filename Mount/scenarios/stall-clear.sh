#!/usr/bin/env bash
# The fault ends while a download is still stalled on it: a reader gave up (killed), the
# download waits out its deadline in the background, and the user clears the fault and reads
# again at once. That read gets the right bytes, without waiting out the old stall.
# (rclone: the first read after the fault ended waited 21 s for the stalled downloader, row 3a.)
source "$(dirname "$0")/lib.sh"
scenario_start

make_file stuck.bin 2MiB
mount_source --stall-timeout 3s
file="$MNT/stuck.bin"

providerfs fault add "$file" --stall --at 1MiB --times 0
in_background cat "$file" >/dev/null 2>&1
reader=$!
wait_for_progress "$file" $((1 << 20))
kill -KILL "$reader"
wait_for_pid "$reader" 1 || fail "the reader was still there 1 s after SIGKILL"
say "killed the reader; the item is $(xattr "$file" state) ($(xattr "$file" progress))"

providerfs fault clear "$file"
expect_content dd "$file"
(( $(seconds_to_micros "$READ_SECONDS") < 2500000 )) \
    || fail "the read after fault clear took $READ_SECONDS s: it waited out the old stall"
expect_state "$file" materialized
scenario_done
