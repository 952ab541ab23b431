#!/usr/bin/env bash
# scenario-providers: local (chown: WebDAV stores no owners)
# Ownership (D-397): a mount by root of a local source shows the source's owners and applies
# chown there; through an --allow-other mount a node made by another user belongs to that user
# at the source (the group of a setgid directory); a chown by a user who may not is EPERM. The
# owners survive a remount (the catalog keeps them). Needs root, as CI runs the scenarios.
source "$(dirname "$0")/lib.sh"
scenario_start
[[ "$(id -u)" -eq 0 ]] || fail "needs root (chown and setpriv): run the scenarios as root, as CI does"
chmod 755 "$S"   # the other user reaches the mount point

owner() { stat -c '%u:%g' "$1"; }
expect_owner() {
    local got
    got="$(owner "$1")"
    [[ "$got" == "$2" ]] || fail "$1 belongs to $got, expected $2"
    say "ok: $1 belongs to $got"
}
as_nobody() { setpriv --reuid 65534 --regid 65534 --clear-groups "$@"; }

mkdir -p "$SRC/shared" "$SRC/team"
chmod 777 "$SRC/shared"
echo kept >"$SRC/given"
chown 65534:65534 "$SRC/given"
chown 0:4242 "$SRC/team"
chmod 2777 "$SRC/team"
mount_source --allow-other

expect_owner "$MNT/given" 65534:65534           # the source's owner, not the mounting user
echo hello >"$MNT/mine"
chown 65534:65534 "$MNT/mine"
expect_owner "$MNT/mine" 65534:65534
expect_owner "$SRC/mine" 65534:65534
chmod 4755 "$MNT/mine"
chown 0:0 "$MNT/mine"                            # Linux's chown clears setuid, root's too
[[ "$(stat -c %a "$MNT/mine")" == 755 ]] || fail "chown left mode $(stat -c %a "$MNT/mine"), expected 755"
[[ "$(stat -c %a "$SRC/mine")" == 755 ]] || fail "the source's mode is $(stat -c %a "$SRC/mine"), expected 755"
say "ok: chown cleared setuid at the mount and the source"

as_nobody sh -c "echo made >'$MNT/shared/made'"  # a deferred create, uploaded later
as_nobody mkdir "$MNT/shared/dir"
as_nobody ln -s made "$MNT/shared/link"
expect_owner "$MNT/shared/made" 65534:65534
expect_owner "$MNT/shared/dir" 65534:65534
expect_owner "$MNT/shared/link" 65534:65534
deadline=$(( $(micros) + 10000000 ))
until [[ -f "$SRC/shared/made" && "$(owner "$SRC/shared/made")" == 65534:65534 ]]; do
    (( $(micros) < deadline )) || fail "$SRC/shared/made not uploaded as 65534:65534 within 10 s"
    sleep 0.1
done
[[ "$(cat "$SRC/shared/made")" == made ]] || fail "$SRC/shared/made has '$(cat "$SRC/shared/made")'"
expect_owner "$SRC/shared/made" 65534:65534
expect_owner "$SRC/shared/dir" 65534:65534
[[ "$(stat -c %u:%g "$SRC/shared/link")" == 65534:65534 ]] || fail "the source's link is not 65534:65534"
say "ok: what nobody made belongs to nobody at the source"

as_nobody touch "$MNT/team/file"
as_nobody mkdir "$MNT/team/sub"
expect_owner "$MNT/team/file" 65534:4242         # the setgid directory's group
expect_owner "$MNT/team/sub" 65534:4242
[[ "$(stat -c %a "$MNT/team/sub")" == 2* ]] || fail "a directory made in a setgid one is $(stat -c %a "$MNT/team/sub"), not setgid"
expect_owner "$SRC/team/sub" 65534:4242
say "ok: a setgid directory gives its group, and its setgid to a new directory"

as_nobody chown 0 "$MNT/shared/made" 2>/dev/null && fail "nobody gave a file to root"
expect_owner "$MNT/shared/made" 65534:65534
say "ok: nobody cannot give its file away (EPERM)"

providerfs unmount "$MNT" --timeout 10s >/dev/null
wait_for_pid "$DAEMON_PID" 10 || fail "the daemon (pid $DAEMON_PID) did not end within 10 s of the unmount"
mount_source --allow-other
expect_owner "$MNT/mine" 0:0
expect_owner "$MNT/shared/made" 65534:65534
expect_owner "$MNT/team/sub" 65534:4242
scenario_done
