#!/usr/bin/env bash
# `token revoke` while a reader has a file open through the access path and reads it slowly (one
# 4 KiB pread every 10 ms; access-path handles are direct I/O, so every pread reaches the daemon):
# the reads before the revoke work, the first read after it fails with EACCES within 100 ms of the
# revoke command returning, every later one too, and new opens (cat, ls) are refused.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file photos/album/cat.jpg 1MiB
mount_source
expect_content cat "$MNT/photos/album/cat.jpg"   # materialized: reads wait for no download
grant_token "$MNT/photos"                         # a folder grant: the file is inside it
file="$ACCESS/album/cat.jpg"

# The reader (a thread) and the revoke (the main thread) in one python process, on one clock.
python3 - "$PROVIDERFS" "$file" "$(reference_of "$file")" "$TOKEN_ID" "$MNT" >"$S/out/probe" 2>&1 <<'PY' \
    || fail "the reader failed: $(mask_tokens <"$S/out/probe")"
import errno, os, subprocess, sys, threading, time
providerfs, path, reference, token_id, mountpoint = sys.argv[1:6]
want = open(reference, "rb").read()
samples = []  # (start, end, outcome)
stop = threading.Event()
opened = threading.Event()
def reader():
    fd = os.open(path, os.O_RDONLY)
    opened.set()
    offset = 0
    try:
        while not stop.is_set():
            start = time.monotonic()
            try:
                data = os.pread(fd, 4096, offset)
                outcome = "ok" if data == want[offset:offset + 4096] else "WRONG BYTES"
                offset = (offset + 4096) % len(want)
            except OSError as e:
                outcome = errno.errorcode.get(e.errno, str(e.errno))
            samples.append((start, time.monotonic(), outcome))
            time.sleep(0.01)
    finally:
        os.close(fd)
thread = threading.Thread(target=reader)
thread.start()
opened.wait(10)
time.sleep(0.5)   # reads go on for a while before the revoke
before = time.monotonic()
subprocess.run([providerfs, "token", "revoke", token_id, mountpoint], check=True, capture_output=True)
after = time.monotonic()
time.sleep(0.5)   # and after it
stop.set()
thread.join()
ok_before = [s for s in samples if s[1] <= before and s[2] == "ok"]
problems = []
if any(s[2] != "ok" for s in samples if s[1] <= before):
    problems.append("a read before the revoke failed")
if len(ok_before) < 5:
    problems.append(f"only {len(ok_before)} reads worked before the revoke")
if any(s[2] == "ok" for s in samples if s[0] >= after):
    problems.append("a read started after the revoke returned still worked")
outcomes = {s[2] for s in samples if s[0] >= after}
if outcomes != {"EACCES"}:
    problems.append(f"reads after the revoke ended with {sorted(outcomes)}, expected only EACCES")
refused = [s for s in samples if s[2] == "EACCES"]
if refused:
    # The first refused read; the revoke took effect between `before` and `after`.
    first = refused[0]
    print(f"{len(ok_before)} reads worked before the revoke (the command took {(after - before) * 1000:.0f} ms); "
          f"the first refused read ended {(first[1] - after) * 1000:+.1f} ms from the revoke's return, "
          f"{len(refused)} refused in all")
    if first[1] - after > 0.1:
        problems.append(f"the first refused read ended {(first[1] - after) * 1000:.0f} ms after the revoke (> 100 ms)")
if problems:
    print("PROBLEMS: " + "; ".join(problems))
    sys.exit(1)
PY
while IFS= read -r line; do say "ok: $line"; done <"$S/out/probe"

# New opens and lookups are refused too.
for reader in cat python; do expect_errno "$reader" "$file" EACCES 5; done
expect_failure EACCES 5 ls "$ACCESS"
expect_failure EACCES 5 stat "$file"
expect_content cat "$MNT/photos/album/cat.jpg"   # the plain path is not affected
expect_token_state "$TOKEN_ID" "revoked"
expect_token_events "$TOKEN_ID" grant use revocation "denial revoked"
scenario_done
