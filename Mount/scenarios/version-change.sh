#!/usr/bin/env bash
# The item changes on the provider while it is being read. A reader never gets a mix of the two
# versions: ESTALE ("Stale file handle"), and a new open reads the new version whole.
# (rclone returns old and new bytes mixed, and keeps serving the mix, rclone-under-faults.md 5a.)
source "$(dirname "$0")/lib.sh"
scenario_start

make_file report.bin 2MiB
make_file draft.bin 4MiB
mount_source --stall-timeout 2s

# 1. An injected change: the provider reports a new version when the stream reaches 1 MiB.
file="$MNT/report.bin"
providerfs fault add "$file" --change-version-at 1MiB --times 0
for reader in cat dd python; do
    expect_errno "$reader" "$file" ESTALE 5
done
expect_error_xattr "$file" ESTALE
expect_status_error "$file" ESTALE $(size_bytes 1MiB)
providerfs fault clear "$file"
expect_content cat "$file"

# 2. A real change: the source file is rewritten in place while a slow reader is at ~1 MiB.
file="$MNT/draft.bin"
providerfs fault add "$file" --slow 1MiB/s --times 0
background_read "$file" "$S/out/reader"
reader=$!
wait_for_progress "$file" $((1 << 20))
head -c $((4 << 20)) /dev/urandom | dd of="$SRC/draft.bin" conv=notrunc status=none   # same size, new bytes
say "rewrote $SRC/draft.bin in place while $PRESENT bytes were present"
wait_for_pid "$reader" 20 || fail "the reader did not finish within 20 s"
result="$(cat "$S/out/reader")"
[[ "$result" == "errno ESTALE" ]] || fail "reader during the change: '$result', expected errno ESTALE"
say "ok: python reader during the change → OSError ESTALE"
providerfs fault clear "$file"
expect_content cat "$file"           # the new version, whole
expect_state "$file" materialized

scenario_done
