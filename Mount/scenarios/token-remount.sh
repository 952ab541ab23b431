#!/usr/bin/env bash
# Tokens survive an unmount and a remount on the same cache directory (issue 12): the same access
# path reads again after the remount (a folder grant and a file grant with a TTL), a revoked token
# stays revoked, and `token list` shows the TTL token's time left still running, not restarted.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file docs/a.txt 32KiB
make_file docs/b.txt 16KiB
make_file c.bin 256KiB
mount_source
grant_token "$MNT/docs"
folder="$ACCESS" folder_id="$TOKEN_ID"
grant_token "$MNT/c.bin" --ttl 1h
timed="$ACCESS" timed_id="$TOKEN_ID"
grant_token "$MNT/docs/b.txt"
revoked="$ACCESS" revoked_id="$TOKEN_ID"
expect_content cat "$folder/a.txt" "$SRC/docs/a.txt"
expect_content cat "$timed" "$SRC/c.bin"
expect_content cat "$revoked" "$SRC/docs/b.txt"
providerfs token revoke "$revoked_id" "$MNT" >/dev/null
expect_errno cat "$revoked" EACCES 5

providerfs unmount "$MNT" --timeout 10s >/dev/null
wait_for_pid "$DAEMON_PID" 10 || fail "the daemon (pid $DAEMON_PID) did not end within 10 s of the unmount"
! grep -qs " $MNT " /proc/self/mounts || fail "$MNT is still mounted after providerfs unmount"
[[ ! -e "$folder" ]] || fail "the access path exists with the mount gone"
say "ok: unmounted; the daemon ended"
DAEMON_PID=""
mount_source

# The same paths, on the new daemon.
expect_content cat "$folder/a.txt" "$SRC/docs/a.txt"
expect_content dd "$folder/b.txt" "$SRC/docs/b.txt"
expect_content python "$timed" "$SRC/c.bin"
expect_errno cat "$revoked" EACCES 5
expect_token_state "$folder_id" "no expiry"
expect_token_state "$timed_id" "expires"
left="$(timeout -k 2 10 "$PROVIDERFS" token list "$MNT" --json | grep "\"id\":\"$timed_id\"" \
    | sed -n 's/.*"timeLeftMilliseconds":\([0-9]*\).*/\1/p')"
[[ -n "$left" ]] && (( left < 3600000 && left > 3500000 )) \
    || fail "the 1 h token has ${left:-no} ms left after the remount, expected a little under 3,600,000"
say "ok: the 1 h token has $left ms left after the remount (time left kept, not restarted)"
expect_token_state "$revoked_id" "revoked"
expect_token_events "$revoked_id" grant revocation "denial revoked"
expect_token_events "$folder_id" grant use
scenario_done
