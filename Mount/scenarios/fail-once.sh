#!/usr/bin/env bash
# `--times 1` (the default): the fault strikes the next download of the item, the mount's own
# retries included, so a plain `cat` right after `fault add` sees the error; the download after
# that one succeeds without clearing anything.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file once.bin 2MiB
make_file twice.bin 2MiB
mount_source

providerfs fault add "$MNT/once.bin" --fail-at 1MiB
expect_errno cat "$MNT/once.bin" EIO 5
expect_state "$MNT/once.bin" error
expect_content cat "$MNT/once.bin"          # the fault is used up
expect_state "$MNT/once.bin" materialized

providerfs fault add "$MNT/twice.bin" --fail-at 1MiB --times 2
expect_errno dd "$MNT/twice.bin" EIO 5
expect_errno python "$MNT/twice.bin" EIO 5
expect_content dd "$MNT/twice.bin"
scenario_done
