#!/usr/bin/env bash
# A download that fails at byte 0, in the middle, and at the last byte.
# Every reader (cat, dd, python) gets EIO at once, never wrong bytes; the item shows `error` with
# the errno and the byte; after `fault clear` a plain re-read has the source's sha256.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file first.bin 2MiB    # fails at byte 0
make_file middle.bin 2MiB   # fails at 1 MiB
make_file last.bin 2MiB     # fails at the last byte
mount_source

size=$(size_bytes 2MiB)
for case in "first.bin 0" "middle.bin $((size / 2))" "last.bin $((size - 1))"; do
    read -r name at <<<"$case"
    file="$MNT/$name"
    echo "-- $name: --fail-at $at"
    providerfs fault add "$file" --fail-at "$at" --times 0   # until cleared: every reader sees it

    for reader in cat dd python; do
        expect_errno "$reader" "$file" EIO 5
    done
    expect_state "$file" error
    expect_error_xattr "$file" EIO "transfer failed at byte"
    expect_status_error "$file" EIO "$at"
    present="$(xattr "$file" progress)"
    [[ "${present%/*}" -le "$at" ]] || fail "$name: $present present, but the download failed at byte $at"

    providerfs fault clear "$file"
    expect_content cat "$file"
    expect_state "$file" materialized
    expect_no_error_xattr "$file"
    expect_status_clean "$file"
done

scenario_done
