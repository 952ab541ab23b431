#!/usr/bin/env bash
# --metadata: the fault strikes the provider's listing, lookup and getattr as well, not only the
# content. What ProviderFS has not listed yet fails with the fault's errno; an open (which always
# revalidates the item) fails too; nothing hangs. Listings ProviderFS already holds keep
# answering until they expire (5 s).
source "$(dirname "$0")/lib.sh"
scenario_start

make_file known/seen.bin 1MiB       # its folder is listed before the fault
make_file unknown/new.bin 1MiB      # its folder is never listed before the fault
mount_source --stall-timeout 1s
ls -l "$MNT/known" >/dev/null

providerfs fault add "$MNT/known" --fail-at 0 --metadata --times 0     # a folder: everything inside
providerfs fault add "$MNT/unknown" --fail-at 0 --metadata --times 0

expect_failure EIO 5 ls "$MNT/unknown"
expect_failure EIO 5 stat "$MNT/unknown/new.bin"
expect_fast 2 ls "$MNT/known"                 # the listing held from before the fault
expect_errno cat "$MNT/known/seen.bin" EIO 5  # the open's revalidation meets the fault
expect_errno python "$MNT/known/seen.bin" EIO 5

providerfs fault clear --all "$MNT"
expect_content cat "$MNT/known/seen.bin"
expect_content cat "$MNT/unknown/new.bin"
scenario_done
