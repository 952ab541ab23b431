#!/usr/bin/env bash
# Lost updates are impossible through the mount (issue 24 item 1, D-399). For ~25 s, coordinated
# writers (`providerfs coordinate --write F -- python3 …`) rewrite F through the mount as "counter
# line + everything after it", incrementing the counter, while plain processes append a line to F
# through the mount (O_APPEND, no coordination); a third of the appenders are SIGKILLed at a
# random moment (before their open, while it waits for the write claim, or after). At the end:
# the counter equals the completed coordinated increments, every completed append's line is in F
# exactly once, no line comes from an append that never started, and the provider has the same
# bytes. A plain append published inside a coordinated writer's claim would be lost by that
# writer's rewrite; an increment published over by a plain writer that started from an older
# version would leave the counter short. Finally no claim is left held or waiting.
source "$(dirname "$0")/lib.sh"
scenario_start

printf '0\n' >"$SRC/f.txt"
PROVIDERFS_CLAIM_TIMEOUT=30s mount_source

python3 - "$MNT/f.txt" "$SRC/f.txt" "$PROVIDERFS" >"$S/out/torture.out" 2>&1 <<'PY' || fail "the torture failed: $(tail -n 20 "$S/out/torture.out")"
import os, random, signal, subprocess, sys, threading, time
path, source, providerfs = sys.argv[1], sys.argv[2], sys.argv[3]
DURATION = 25.0
rng = random.Random(24)
lock = threading.Lock()
counts = {"increments": 0, "failed_increments": 0, "started": set(), "completed": set(), "killed": 0}
errors = []

REWRITE = r'''
import sys
path = sys.argv[1]
with open(path) as f:
    first = f.readline()
    rest = f.read()
with open(path, "w") as f:
    f.write("%d\n" % (int(first) + 1) + rest)
'''
APPEND = r'''
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
os.write(fd, ("a%s\n" % sys.argv[2]).encode())
os.close(fd)
'''

def coordinated(stop):
    while not stop.is_set():
        p = subprocess.run(
            [providerfs, "coordinate", "--write", path, "--timeout", "60s", "--",
             sys.executable, "-c", REWRITE, path],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
        with lock:
            if p.returncode == 0:
                counts["increments"] += 1
            else:
                counts["failed_increments"] += 1
                errors.append("coordinate exited %d: %s" % (p.returncode, p.stdout.decode()[-300:]))

def plain(stop, worker):
    n = 0
    while not stop.is_set():
        n += 1
        ident = "%d-%d" % (worker, n)
        with lock:
            counts["started"].add(ident)
        p = subprocess.Popen([sys.executable, "-c", APPEND, path, ident], stderr=subprocess.PIPE)
        kill = rng.random() < 0.33
        if kill:
            time.sleep(rng.uniform(0, 0.15))
            p.send_signal(signal.SIGKILL)
        _, err = p.communicate(timeout=90)
        with lock:
            if p.returncode == 0:
                counts["completed"].add(ident)
            elif p.returncode == -signal.SIGKILL and kill:
                counts["killed"] += 1
            else:
                errors.append("append %s exited %d: %s" % (ident, p.returncode, err.decode()[-300:]))

stop = threading.Event()
threads = [threading.Thread(target=coordinated, args=(stop,)) for _ in range(2)]
threads += [threading.Thread(target=plain, args=(stop, w)) for w in range(4)]
for t in threads:
    t.start()
time.sleep(DURATION)
stop.set()
for t in threads:
    t.join()

def check(text, where):
    lines = text.split("\n")
    if lines[-1] != "":
        return "%s: no newline at the end" % where
    lines = lines[:-1]
    counter = int(lines[0])
    appended = lines[1:]
    problems = []
    if counter != counts["increments"]:
        problems.append("counter %d, %d coordinated increments completed" % (counter, counts["increments"]))
    ids = [line[1:] for line in appended]
    if len(set(ids)) != len(ids):
        problems.append("duplicated lines")
    missing = counts["completed"] - set(ids)
    if missing:
        problems.append("%d completed appends lost: %s" % (len(missing), sorted(missing)[:10]))
    strange = set(ids) - counts["started"]
    if strange:
        problems.append("lines of appends that never started: %s" % sorted(strange)[:10])
    return "; ".join("%s: %s" % (where, p) for p in problems)

print("coordinated increments %d (failed %d), appends started %d, completed %d, killed %d" % (
    counts["increments"], counts["failed_increments"], len(counts["started"]), len(counts["completed"]),
    counts["killed"]))
if errors:
    print("errors:\n  " + "\n  ".join(errors[:10]))
    sys.exit(1)
if counts["increments"] < 10 or len(counts["completed"]) < 20 or counts["killed"] < 5:
    print("too little happened to tell anything")
    sys.exit(1)
with open(path) as f:
    problem = check(f.read(), "at the mount")
if problem:
    print(problem)
    sys.exit(1)
deadline = time.time() + 30
while True:
    with open(path, "rb") as f, open(source, "rb") as g:
        if f.read() == g.read():
            break
    if time.time() > deadline:
        print("the provider never got the mount's bytes")
        sys.exit(1)
    time.sleep(0.1)
print("ok")
PY
say "$(head -n 1 "$S/out/torture.out")"
say "ok: the counter equals the completed coordinated increments, every completed plain append is in the file once, the provider has the same bytes"

claims="$(providerfs claims --mount "$MNT")"
grep -q "f.txt" <<<"$claims" && fail "claims left on f.txt after the torture: $claims"
say "ok: no claim left held or waiting"
scenario_done
