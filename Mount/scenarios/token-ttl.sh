#!/usr/bin/env bash
# A token with a 2 s TTL (issue 12): reads through its access path work, and stop at the expiry
# (EACCES, "Permission denied"): a reader polling every 10 ms sees its last success before the
# expiry and its first failure within 100 ms after it. `token list --all` then shows the token
# expired, and `token log` holds its grant, uses, expiry and the denials.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file docs/report.txt 64KiB
mount_source
file="$MNT/docs/report.txt"

# The grant and the polling reader in one python process, on one monotonic clock: the expiry is
# between (before the grant command) + 2 s and (after it) + 2 s. Each read is open + read whole +
# close, so every read asks the daemon again (lookups, open, read).
python3 - "$PROVIDERFS" "$file" "$(reference_of "$file")" >"$S/out/probe" 2>&1 <<'PY' || fail "the polling reader failed: $(cat "$S/out/probe")"
import errno, json, subprocess, sys, time
providerfs, path, reference = sys.argv[1:4]
want = open(reference, "rb").read()
before = time.monotonic()
out = subprocess.run([providerfs, "token", "grant", path, "--ttl", "2s", "--json"], check=True,
                     capture_output=True, text=True).stdout
after = time.monotonic()
grant = json.loads(out)
access, ttl = grant["accessPath"], 2.0
samples = []  # (start, end, outcome)
while time.monotonic() < after + ttl + 0.5:
    start = time.monotonic()
    try:
        with open(access, "rb") as f:
            data = f.read()
        outcome = "ok" if data == want else f"WRONG BYTES ({len(data)})"
    except OSError as e:
        outcome = errno.errorcode.get(e.errno, str(e.errno))
    samples.append((start, time.monotonic(), outcome))
    time.sleep(0.01)
oks = [s for s in samples if s[2] == "ok"]
fails = [s for s in samples if s[2] != "ok"]
print(f"id {grant['id']}; grant command took {(after - before) * 1000:.0f} ms; {len(samples)} reads: "
      f"{len(oks)} ok, {len(fails)} refused")
problems = []
if not oks or oks[0] is not samples[0]:
    problems.append(f"the first read after the grant did not work: {samples[0][2]}")
if any(s[2] not in ("ok", "EACCES") for s in samples):
    problems.append("unexpected outcomes: " + ", ".join(sorted({s[2] for s in samples} - {"ok", "EACCES"})))
# Reads that ended before the earliest possible expiry work.
early = [s for s in samples if s[1] < before + ttl and s[2] != "ok"]
if early:
    problems.append(f"{len(early)} reads ending before the expiry were refused ({early[0][2]} at "
                    f"{early[0][1] - before:.3f} s)")
# No read that started after the latest possible expiry works.
late = [s for s in samples if s[0] >= after + ttl and s[2] == "ok"]
if late:
    problems.append(f"{len(late)} reads starting after the expiry still worked (last at {late[-1][0] - after:.3f} s)")
first_refused = next((s for s in samples if s[2] == "EACCES"), None)
if first_refused is None:
    problems.append("no read was refused")
else:
    # Access ended within 100 ms of the expiry: the first refused read started at most 100 ms
    # after the latest possible expiry (the grant's own duration makes the window wider).
    since = first_refused[0] - (after + ttl)
    print(f"last ok read ended {oks[-1][1] - (before + ttl):+.3f} s from the earliest expiry; first refused read "
          f"started {since:+.3f} s from the latest expiry")
    if since > 0.1:
        problems.append(f"the first refused read started {since:.3f} s after the expiry (> 100 ms)")
    if any(s[2] == "ok" for s in samples if s[0] > first_refused[0]):
        problems.append("a read worked again after one was refused")
if problems:
    print("PROBLEMS: " + "; ".join(problems))
    sys.exit(1)
print("ACCESS " + access)
PY
ACCESS="$(sed -n 's/^ACCESS //p' "$S/out/probe")"
ACCESS_ITEM["$ACCESS"]="docs/report.txt"
TOKEN_ID="$(sed -n 's/^id \([0-9a-f]*\);.*/\1/p' "$S/out/probe")"
grep -v '^ACCESS ' "$S/out/probe" | while IFS= read -r line; do say "ok: $line"; done

# After the wait: every reader gets EACCES, at open, with no byte.
for reader in cat dd python; do expect_errno "$reader" "$ACCESS" EACCES 5; done
expect_failure EACCES 5 ls "$(dirname "$ACCESS")"
expect_content cat "$file"   # the plain path is not affected

expect_token_state "$TOKEN_ID" "expired"
expect_token_events "$TOKEN_ID" grant use expiry "denial expired"
scenario_done
