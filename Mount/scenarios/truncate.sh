#!/usr/bin/env bash
# A provider whose stream ends early with no error (a lying server, a cut connection that looks
# like an end of file). ProviderFS knows the item's size and version, so a short stream is a
# failure: EIO, never short data that looks complete, and never an endless refetch loop (rclone
# hangs forever on this, reference/rclone-under-faults.md row 2b).
source "$(dirname "$0")/lib.sh"
scenario_start

make_file cut.bin 3MiB
mount_source
file="$MNT/cut.bin"

providerfs fault add "$file" --truncate-at 1MiB --times 0   # every stream stops at 1 MiB
for reader in cat dd python; do
    expect_errno "$reader" "$file" EIO 5
done
expect_state "$file" error
expect_error_xattr "$file" EIO
expect_status_error "$file" EIO $(size_bytes 1MiB)
present="$(xattr "$file" progress)"
[[ "${present%/*}" -le $(size_bytes 1MiB) ]] || fail "$present present, but every stream stopped at 1 MiB"

# `providerfs download` fails the same way, with the errno, and does not hang either.
if timeout -k 2 10 "$PROVIDERFS" download "$file" >"$S/out/download" 2>&1; then
    fail "providerfs download succeeded on a truncated stream: $(cat "$S/out/download")"
fi
grep -q EIO "$S/out/download" || fail "providerfs download did not name EIO: $(cat "$S/out/download")"
say "ok: providerfs download → exit 1, $(tail -n 1 "$S/out/download")"

providerfs fault clear "$file"
expect_content dd "$file"
expect_state "$file" materialized
expect_status_clean "$file"

scenario_done
