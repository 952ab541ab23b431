#!/usr/bin/env bash
# scenario-providers: local (FIFOs, sockets and devices are chown'ed: WebDAV stores no owners)
# FIFOs, sockets and devices made through the mount (D-398) are kept by the mount alone, "not
# synced": a FIFO carries bytes from a writer to a reader (the kernel's, never the daemon's), a
# Unix socket binds and accepts, a device node shows its number (and does not open: nodev). None
# reaches the source; `providerfs status` lists each as local-only (the state xattr cannot be read
# on them: Linux allows user.* xattrs on regular files and directories only). They survive a
# remount and move with their directory, which rmdir then refuses (ENOTEMPTY). Needs root (mknod
# of a device), as CI runs the scenarios.
source "$(dirname "$0")/lib.sh"
scenario_start
[[ "$(id -u)" -eq 0 ]] || fail "needs root (mknod of a device): run the scenarios as root, as CI does"

expect_local_only() {
    local json
    json="$(status_json)" || fail "providerfs status $MNT failed"
    python3 -c '
import json, sys
found = {i["path"]: i["state"] for i in json.loads(sys.argv[1]).get("transfers", [])}
want = sys.argv[2:]
bad = [p for p in want if found.get(p) != "local-only"]
sys.exit(1 if bad else 0)
' "$json" "$@" || fail "providerfs status does not list $* as local-only: $json"
    say "ok: providerfs status lists $* as local-only"
}

mkdir -p "$SRC/dir"
mount_source

mkfifo -m 0620 "$MNT/dir/pipe"
[[ "$(stat -c %F:%a "$MNT/dir/pipe")" == "fifo:620" ]] || fail "the FIFO shows as $(stat -c %F:%a "$MNT/dir/pipe")"
timeout 10 sh -c "echo through-the-pipe >'$MNT/dir/pipe'" &
writer=$!
got="$(timeout 10 cat "$MNT/dir/pipe")" || fail "reading the FIFO failed"
wait "$writer" || fail "the FIFO's writer failed"
[[ "$got" == through-the-pipe ]] || fail "the FIFO carried '$got'"
say "ok: a writer and a reader met through the FIFO"

python3 - "$MNT/dir/sock" <<'PYTHON' || fail "the Unix socket did not bind and accept"
import os, socket, sys
path = sys.argv[1]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(1)
client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
client.connect(path)
peer, _ = server.accept()
client.sendall(b"ping")
assert peer.recv(4) == b"ping"
PYTHON
[[ "$(stat -c %F "$MNT/dir/sock")" == socket ]] || fail "the socket shows as $(stat -c %F "$MNT/dir/sock")"
say "ok: a Unix socket bound in the mount, and a client connected to it"

mknod -m 0600 "$MNT/dir/null" c 1 3
[[ "$(stat -c '%F %t:%T' "$MNT/dir/null")" == "character special file 1:3" ]] \
    || fail "the device shows as $(stat -c '%F %t:%T' "$MNT/dir/null")"
if head -c 1 "$MNT/dir/null" 2>/dev/null; then fail "a device in the mount opened (the mount is nodev)"; fi
say "ok: a device node shows its number and does not open (nodev)"

chown 65534:65534 "$MNT/dir/pipe"
chmod 0640 "$MNT/dir/pipe"
[[ "$(stat -c %u:%g:%a "$MNT/dir/pipe")" == "65534:65534:640" ]] || fail "chown/chmod of the FIFO: $(stat -c %u:%g:%a "$MNT/dir/pipe")"
[[ -z "$(ls -A "$SRC/dir")" ]] || fail "the source has $(ls -A "$SRC/dir")"
say "ok: none of them reached the source"
expect_local_only dir/pipe dir/sock dir/null

out="$(rmdir "$MNT/dir" 2>&1)" && fail "rmdir of a directory holding local-only nodes succeeded"
[[ "$out" == *"not empty"* ]] || fail "rmdir said '$out', expected ENOTEMPTY"
mv "$MNT/dir" "$MNT/moved"
say "ok: rmdir refused (ENOTEMPTY); the directory moved"

providerfs unmount "$MNT" --timeout 10s >/dev/null
wait_for_pid "$DAEMON_PID" 10 || fail "the daemon (pid $DAEMON_PID) did not end within 10 s of the unmount"
mount_source
[[ "$(ls "$MNT/moved" | tr '\n' ' ')" == "null pipe sock " ]] || fail "after the remount: $(ls "$MNT/moved")"
[[ "$(stat -c %F:%u:%a "$MNT/moved/pipe")" == "fifo:65534:640" ]] || fail "after the remount the FIFO is $(stat -c %F:%u:%a "$MNT/moved/pipe")"
expect_local_only moved/pipe moved/sock moved/null
timeout 10 sh -c "echo again >'$MNT/moved/pipe'" &
writer=$!
[[ "$(timeout 10 cat "$MNT/moved/pipe")" == again ]] || fail "the FIFO carried nothing after the remount"
wait "$writer"
rm "$MNT/moved/pipe" "$MNT/moved/sock" "$MNT/moved/null"
rmdir "$MNT/moved"
[[ ! -e "$SRC/moved" ]] || fail "the source still has moved/"
say "ok: kept across the remount; unlinked, then the directory went"
scenario_done
