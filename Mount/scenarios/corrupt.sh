#!/usr/bin/env bash
# A provider that delivers wrong bytes (bit rot, a broken proxy). The provider's content checksum
# does not match, so the reader gets EIO and never the wrong bytes; the item is never marked
# materialized and the wrong bytes are never served from the cache, not even after a remount
# (rclone serves them silently and keeps them cached, reference/rclone-under-faults.md row 4).
source "$(dirname "$0")/lib.sh"
scenario_start

make_file photo.jpg 3MiB
mount_source
file="$MNT/photo.jpg"

providerfs fault add "$file" --corrupt --at 2MiB --times 0   # flips bytes from 2 MiB on
for reader in cat dd python; do
    expect_errno "$reader" "$file" EIO 5
done
expect_state "$file" error
expect_error_xattr "$file" EIO "do not match their checksum"
expect_status_error "$file" EIO

# The item is not materialized, also after the daemon restarts on the same cache.
providerfs unmount "$MNT" >/dev/null
DAEMON_PID=""
mount_source
[[ "$(xattr "$file" state)" != materialized ]] || fail "a corrupt download counts as materialized after a remount"
say "ok: after a remount the item is $(xattr "$file" state) ($(xattr "$file" progress))"
expect_errno cat "$file" EIO 5   # faults are stored: still corrupt after the restart

providerfs fault clear "$file"
expect_content cat "$file"
expect_content python "$file"
expect_state "$file" materialized
expect_status_clean "$file"

scenario_done
