#!/usr/bin/env bash
# Every wait in the mount can be stopped (issue 24 item 2, D-400). Behind a write claim that
# `providerfs coordinate --write` holds for 30 s, a read open and a write open (libc open through
# ctypes, so EINTR is seen; the SIGINT handler is installed without SA_RESTART) end with EINTR
# soon after a caught SIGINT, `cat` waiting the same way is gone soon after SIGKILL, `timeout 2 sh
# -c 'echo x >> F'` ends at its 2 s, and after each the server shows no claim of that process
# left waiting; nothing the stopped writers held reached the file. Then a read of a stalled
# download (`providerfs fault add --stall`) ends with EINTR on SIGINT too (D-285), and so does a
# rename waiting for a stalled upload of its file (`fault add --on upload --stall`). Times are the
# stopped process's own clock at its return against bash's at the kill. "Soon" is checked as a
# ratio: within a twentieth of the 30 s the claim is held (the target is 100 ms; each time is
# printed).
source "$(dirname "$0")/lib.sh"
scenario_start

printf 'held\n' >"$SRC/f.txt"
make_file stuck.bin 2MiB
PROVIDERFS_CLAIM_TIMEOUT=60s mount_source
file="$MNT/f.txt"
HOLD=30

cat >"$S/opener.py" <<'PY'
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
signal.signal(signal.SIGINT, lambda number, frame: None)
signal.siginterrupt(signal.SIGINT, True)
path, mode = sys.argv[1], sys.argv[2]
flags = {"read": os.O_RDONLY, "append": os.O_WRONLY | os.O_APPEND}[mode]
print("OPENING", flush=True)
fd = libc.open(path.encode(), flags)
end = time.time()
print("RESULT", fd, ctypes.get_errno() if fd < 0 else 0, "%.6f" % end, flush=True)
if fd >= 0 and mode == "append":
    os.write(fd, b"INTRUDER\n")
PY

cat >"$S/reader.py" <<'PY'
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.pread.restype = ctypes.c_ssize_t
libc.pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
signal.signal(signal.SIGINT, lambda number, frame: None)
signal.siginterrupt(signal.SIGINT, True)
fd = os.open(sys.argv[1], os.O_RDONLY)
buffer = ctypes.create_string_buffer(1 << 20)
print("OPENING", flush=True)
n = libc.pread(fd, buffer, 1 << 20, 1 << 20)
print("RESULT", n, ctypes.get_errno() if n < 0 else 0, "%.6f" % time.time(), flush=True)
PY


# waiting_claims: the mount's claims that wait (lines of `providerfs claims`).
waiting_claims() { providerfs claims --mount "$MNT" | grep -i "waiting" || true; }

# wait_until_waiting PID: until a claim of PID waits at the server (at most 10 s).
wait_until_waiting() {
    local i
    for i in $(seq 200); do
        providerfs claims --mount "$MNT" | grep -qiE "waiting.* $1( |$)|^ *$1 .*waiting" && return 0
        sleep 0.05
    done
    fail "no waiting claim of pid $1: $(providerfs claims --mount "$MNT")"
}

# The holder: a write claim for $HOLD s.
"$PROVIDERFS" coordinate --write "$file" --timeout 10s -- sh -c "touch '$S/granted'; sleep $HOLD" &
holder=$!
BACKGROUND+=("$holder")
for _ in $(seq 200); do [[ -e "$S/granted" ]] && break; sleep 0.05; done
[[ -e "$S/granted" ]] || fail "the holder's claim was never granted"
held_since="$EPOCHREALTIME"
limit_us=$(( HOLD * 1000000 / 20 ))

# interrupted_open MODE: an open (read or append) behind the claim; SIGINT; EINTR in time.
interrupted_open() {
    local mode="$1" out="$S/out/open-$1"
    python3 "$S/opener.py" "$file" "$mode" >"$out" 2>&1 &
    local pid=$!
    BACKGROUND+=("$pid")
    wait_until_waiting "$pid"
    local sent
    sent="$EPOCHREALTIME"
    kill -INT "$pid"
    wait_for_pid "$pid" 5 || fail "the $mode open was still waiting 5 s after SIGINT"
    local result
    result="$(grep RESULT "$out" || true)"
    read -r _ fd err ended <<<"$result"
    [[ "$fd" == "-1" && "$err" == "4" ]] || fail "the $mode open after SIGINT: '$result' (want RESULT -1 4, EINTR)"
    local took_us
    took_us="$(python3 -c "print(int(($ended - $sent) * 1e6))")"
    (( took_us < limit_us )) || fail "the $mode open took $took_us us to end after SIGINT (limit $limit_us us)"
    say "ok: the $mode open waiting for the claim got EINTR $(( took_us / 1000 )) ms after SIGINT"
    [[ -z "$(waiting_claims)" ]] || fail "a claim still waits after the $mode open was interrupted: $(waiting_claims)"
}
interrupted_open read
interrupted_open append

# SIGKILL of cat waiting at its open.
cat "$file" >/dev/null 2>&1 &
cat_pid=$!
BACKGROUND+=("$cat_pid")
wait_until_waiting "$cat_pid"
killed="$EPOCHREALTIME"
kill -KILL "$cat_pid"
wait_for_pid "$cat_pid" 5 || fail "cat was still there 5 s after SIGKILL"
took_us=$(( $(micros) - $(micros "$killed") ))
(( took_us < limit_us )) || fail "cat took $took_us us to go after SIGKILL (limit $limit_us us)"
say "ok: cat waiting for the claim was gone $(( took_us / 1000 )) ms after SIGKILL"
[[ -z "$(waiting_claims)" ]] || fail "a claim still waits after cat was killed: $(waiting_claims)"

# timeout's SIGTERM ends a shell append waiting for the claim at its 2 s.
started="$EPOCHREALTIME"
timeout 2 sh -c "echo x >> '$file'" 2>/dev/null && fail "the append behind the claim succeeded"
took_us=$(( $(micros) - $(micros "$started") ))
(( took_us < 2000000 + limit_us )) || fail "timeout 2 sh -c 'echo x >> F' took $took_us us"
say "ok: timeout 2 sh -c 'echo x >> F' ended after $(elapsed_since "$started") s"
[[ -z "$(waiting_claims)" ]] || fail "a claim still waits after timeout ended the append: $(waiting_claims)"

# All of that happened while the claim was held.
(( $(micros) - $(micros "$held_since") < HOLD * 1000000 )) || fail "the checks outlived the holder's claim"
wait "$holder" || fail "the holder failed"
[[ "$(cat "$file")" == "held" ]] || fail "a stopped writer's bytes reached the file: $(cat "$file")"
say "ok: the holder ended; the file has none of the stopped writers' bytes"

# A read waiting for a stalled download: EINTR on SIGINT.
providerfs fault add "$MNT/stuck.bin" --stall --at 1MiB --times 0
out="$S/out/stalled"
python3 "$S/reader.py" "$MNT/stuck.bin" >"$out" 2>&1 &
reader=$!
BACKGROUND+=("$reader")
for _ in $(seq 100); do grep -q OPENING "$out" && break; sleep 0.05; done
for _ in $(seq 100); do [[ "$(xattr "$MNT/stuck.bin" state)" == downloading ]] && break; sleep 0.05; done
sleep 0.3
kill -0 "$reader" 2>/dev/null || fail "the reader of the stalled download did not wait: $(cat "$out")"
sent="$EPOCHREALTIME"
kill -INT "$reader"
wait_for_pid "$reader" 5 || fail "the stalled read was still waiting 5 s after SIGINT"
read -r _ n err ended <<<"$(grep RESULT "$out" || true)"
[[ "$n" == "-1" && "$err" == "4" ]] || fail "the stalled read after SIGINT: $(cat "$out") (want RESULT -1 4, EINTR)"
took_us="$(python3 -c "print(int(($ended - $sent) * 1e6))")"
(( took_us < limit_us )) || fail "the stalled read took $took_us us to end after SIGINT (limit $limit_us us)"
say "ok: a read of a stalled download got EINTR $(( took_us / 1000 )) ms after SIGINT"
providerfs fault clear "$MNT/stuck.bin"

# A rename waiting for an upload of its file to end (the upload stalls at the source): EINTR on
# SIGINT, nothing renamed; once the upload is let go the rename goes through.
cat >"$S/rename.py" <<'PY'
import ctypes, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
signal.signal(signal.SIGINT, lambda number, frame: None)
signal.siginterrupt(signal.SIGINT, True)
print("RENAMING", flush=True)
rc = libc.rename(sys.argv[1].encode(), sys.argv[2].encode())
print("RESULT", rc, ctypes.get_errno() if rc < 0 else 0, "%.6f" % time.time(), flush=True)
PY
providerfs fault add "$MNT/f.txt" --on upload --stall --times 0
printf 'uploading\n' >"$file"
for _ in $(seq 100); do [[ "$(xattr "$file" state)" == uploading ]] && break; sleep 0.05; done
[[ "$(xattr "$file" state)" == uploading ]] || fail "the upload of f.txt never started: $(xattr "$file" state)"
out="$S/out/rename"
python3 "$S/rename.py" "$file" "$MNT/g.txt" >"$out" 2>&1 &
renamer=$!
BACKGROUND+=("$renamer")
for _ in $(seq 100); do grep -q RENAMING "$out" && break; sleep 0.05; done
sleep 0.3
kill -0 "$renamer" 2>/dev/null || fail "the rename did not wait for the upload: $(cat "$out")"
sent="$EPOCHREALTIME"
kill -INT "$renamer"
wait_for_pid "$renamer" 5 || fail "the rename was still waiting 5 s after SIGINT"
read -r _ rc err ended <<<"$(grep RESULT "$out" || true)"
[[ "$rc" == "-1" && "$err" == "4" ]] || fail "the rename after SIGINT: $(cat "$out") (want RESULT -1 4, EINTR)"
took_us="$(python3 -c "print(int(($ended - $sent) * 1e6))")"
(( took_us < limit_us )) || fail "the rename took $took_us us to end after SIGINT (limit $limit_us us)"
[[ -e "$file" && ! -e "$MNT/g.txt" ]] || fail "the interrupted rename renamed"
say "ok: a rename waiting for a stalled upload got EINTR $(( took_us / 1000 )) ms after SIGINT, nothing renamed"
providerfs fault clear "$MNT/f.txt" >/dev/null
timeout 20 mv "$file" "$MNT/g.txt" || fail "the rename after the upload was let go failed"
[[ "$(cat "$MNT/g.txt")" == "uploading" ]] || fail "g.txt: $(cat "$MNT/g.txt")"
say "ok: once the upload went on, the rename went through"

scenario_done
