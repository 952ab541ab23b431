#!/usr/bin/env bash
# A token bound to a process (`token grant --pid`, issue 12): the bound process reads through the
# access path (from its main thread and from a second thread: threads map to their process), every
# other process is refused with EACCES (another python, cat, a child of the bound process), and
# after the bound process ends, a NEW process given the same pid (through
# /proc/sys/kernel/ns_last_pid, root only) is refused too: the start time differs
# (processReused). Without root that last part cannot be arranged; it then says so.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file notes/todo.txt 48KiB
mount_source
expect_content cat "$MNT/notes/todo.txt"
file="$MNT/notes/todo.txt"

python3 - "$PROVIDERFS" "$file" "$(reference_of "$file")" >"$S/out/probe" 2>&1 <<'PY' \
    || fail "the pid probe failed: $(sed 's#\.scoped/pfs_[a-z0-9_]*#.scoped/<token>#g' "$S/out/probe")"
import errno, json, os, subprocess, sys, time
providerfs, path, reference = sys.argv[1:4]
want = open(reference, "rb").read()
problems = []

def attempt(access):
    try:
        with open(access, "rb") as f:
            data = f.read()
        return "ok" if data == want else f"WRONG BYTES ({len(data)})"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

# The bound process: reads the access path it is sent, from its main thread and from another
# thread, and has a child (cat) try it; answers with the three outcomes.
bound_code = r'''
import errno, subprocess, sys, threading
want = open(sys.argv[1], "rb").read()
def attempt(access):
    try:
        with open(access, "rb") as f:
            return "ok" if f.read() == want else "WRONG BYTES"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
print("ready", flush=True)
access = sys.stdin.readline().strip()
main = attempt(access)
other = []
thread = threading.Thread(target=lambda: other.append(attempt(access)))
thread.start(); thread.join()
child = subprocess.run(["cat", access], capture_output=True)
print(main, other[0], "ok" if child.returncode == 0 else ("EACCES" if b"Permission denied" in child.stderr else child.stderr.decode()), flush=True)
sys.stdin.readline()
'''
bound = subprocess.Popen([sys.executable, "-c", bound_code, reference], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
try:
    assert bound.stdout.readline().strip() == "ready"
    grant = json.loads(subprocess.run([providerfs, "token", "grant", path, "--pid", str(bound.pid), "--json"],
                                      check=True, capture_output=True, text=True).stdout)
    access, token_id = grant["accessPath"], grant["id"]
    print(f"ID {token_id}")
    print(f"granted {token_id} bound to pid {bound.pid}")
    mine = attempt(access)
    print(f"another process (pid {os.getpid()}): {mine}")
    if mine != "EACCES": problems.append(f"another process got {mine}, expected EACCES")
    cat = subprocess.run(["cat", access], capture_output=True)
    print(f"cat (another process): exit {cat.returncode}, {cat.stderr.decode().strip().split(': ')[-1]}")
    if cat.returncode == 0 or b"Permission denied" not in cat.stderr: problems.append("cat was not refused")
    bound.stdin.write(access + "\n"); bound.stdin.flush()
    main, thread, child = bound.stdout.readline().split(" ", 2)
    child = child.strip()
    print(f"bound process pid {bound.pid}: main thread {main}, second thread {thread}; its child cat: {child}")
    if main != "ok": problems.append(f"the bound process's main thread got {main}")
    if thread != "ok": problems.append(f"the bound process's second thread got {thread}")
    if child != "EACCES": problems.append(f"the bound process's child got {child}, expected EACCES")
finally:
    bound.stdin.close()
    bound.wait(10)
pid = bound.pid

# The pid reused: ns_last_pid is the last pid handed out, so the next fork gets pid + 1 if it is
# free and nothing else forks in between (retried).
try:
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    can_reuse = True
except OSError as e:
    can_reuse = False
    print(f"SKIPPED the reused-pid case: cannot write /proc/sys/kernel/ns_last_pid ({e.strerror}; needs root). "
          "The unit tests cover it (AccessTokens: processReused).")
if can_reuse:
    for tries in range(1, 101):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read_end)
            outcome = attempt(access) if os.getpid() == pid else "missed"
            os.write(write_end, outcome.encode())
            os._exit(0)
        os.close(write_end)
        outcome = os.read(read_end, 100).decode()
        os.close(read_end)
        os.waitpid(child, 0)
        if child == pid:
            break
    else:
        outcome = None
        problems.append("could not get the pid again in 100 tries (the machine forks too much)")
    if outcome is not None:
        print(f"a new process with the bound pid {pid} (try {tries}): {outcome}")
        if outcome != "EACCES": problems.append(f"the process reusing pid {pid} got {outcome}, expected EACCES")
        print("REUSED")
if problems:
    print("PROBLEMS: " + "; ".join(problems))
    sys.exit(1)
PY
TOKEN_ID="$(sed -n 's/^ID //p' "$S/out/probe")"
grep -v '^ID \|^REUSED' "$S/out/probe" | while IFS= read -r line; do say "ok: $line"; done
expect_token_events "$TOKEN_ID" grant use "denial wrongProcess"
if grep -q '^REUSED' "$S/out/probe"; then expect_token_events "$TOKEN_ID" "denial processReused"; fi
expect_token_state "$TOKEN_ID" "no expiry"
scenario_done
