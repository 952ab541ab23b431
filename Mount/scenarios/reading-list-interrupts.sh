#!/usr/bin/env bash
# reading-list interrupted: SIGINT during an import (a slow download, and a stalled one: exit 130
# within 1 s, "cancelled" in the report) creates no record and leaves no staged file;
# kill -9 with the pending record made (READING_LIST_PAUSE_AT, the app's test hook) is repaired
# by the next start, and so is one after the move (report and list then name the same document); two imports running at once (both stopped mid-copy, then resumed) do not
# disturb each other.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/reading-list.lib"
scenario_start

make_pdf docs/big.pdf 2 $((6 << 20))
make_pdf docs/one.pdf 1
make_pdf docs/two.pdf 2 $((2 << 20))
make_pdf docs/stalled.pdf 2 $((4 << 20))
mount_source
providerfs fault add "$MNT/docs/big.pdf" --slow 1MiB --times 0
# Stalls at 2 MiB until the mount's stall deadline (30 s): far longer than the 1 s Ctrl-C allows.
providerfs fault add "$MNT/docs/stalled.pdf" --stall --at 2MiB --times 0

# SIGINT once the import has its staging file.
# The binary itself in the background ($! is its pid, not a subshell's).
"$READING_LIST" import "$MNT/docs/big.pdf" --data-dir "$S/app" 2>"$S/out/sigint.err" &
pid=$!
BACKGROUND+=("$pid")
for _ in $(seq 1000); do [[ -n "$(ls -A "$S/app/staging" 2>/dev/null)" ]] && break; sleep 0.01; done
[[ -n "$(ls -A "$S/app/staging" 2>/dev/null)" ]] || fail "the import never staged a file"
kill -INT "$pid"
status=0
wait "$pid" || status=$?
[[ $status -eq 130 ]] || fail "SIGINT: exit $status, expected 130: $(cat "$S/out/sigint.err")"
grep -q cancelled "$S/out/sigint.err" || fail "SIGINT: no 'cancelled' in: $(cat "$S/out/sigint.err")"
[[ "$(rl_documents)" == 0 ]] || fail "a cancelled import left a record"
expect_library_consistent
say "ok: SIGINT → exit 130, no record, nothing staged"

# SIGINT while the download stalls: the copy is blocked in a read of the source through the
# mount. The import must end within 1 s, cancelled, not wait for the stall deadline.
"$READING_LIST" import "$MNT/docs/stalled.pdf" --data-dir "$S/app" 2>"$S/out/stall.err" &
pid=$!
BACKGROUND+=("$pid")
staged_size() { local f; for f in "$S/app/staging"/*; do [[ -f "$f" ]] && stat -c %s "$f"; done; }
for _ in $(seq 1000); do [[ -n "$(staged_size)" ]] && break; sleep 0.01; done
[[ -n "$(staged_size)" ]] || fail "the stalled import never staged a file: $(cat "$S/out/stall.err")"
# Stuck: the staged copy stops growing short of the stall (2 MiB; the kernel's read-ahead may
# reach it with the first read), and the process still runs.
before=-1
for _ in $(seq 30); do
    now="$(staged_size)"
    [[ "$now" == "$before" ]] && break
    before="$now"
    sleep 0.3
done
[[ "$now" == "$before" ]] && (( now <= 2 << 20 )) || fail "the copy did not stop at the stall: $now bytes staged"
kill -0 "$pid" 2>/dev/null || fail "the stalled import ended by itself: $(cat "$S/out/stall.err")"
sent="$EPOCHREALTIME"
kill -INT "$pid"
wait_for_pid "$pid" 5 || true
took_us=$(( $(micros) - $(micros "$sent") ))
status=0
wait "$pid" || status=$?
(( took_us <= 1000000 )) || fail "SIGINT during a stall: exit after $(( took_us / 1000 )) ms, expected ≤ 1000 ms"
[[ $status -eq 130 ]] || fail "SIGINT during a stall: exit $status, expected 130: $(cat "$S/out/stall.err")"
grep -q cancelled "$S/out/stall.err" || fail "SIGINT during a stall: no 'cancelled' in: $(cat "$S/out/stall.err")"
rl report --json | python3 -c '
import json, sys
attempts = [a for a in map(json.loads, sys.stdin) if a.get("sourcePath", "").endswith("stalled.pdf")]
assert len(attempts) == 1, f"{len(attempts)} attempts of stalled.pdf in the report"
a = attempts[0]
assert a["result"] == "cancelled" and a.get("failedStage") == "read" and not a.get("documentID"), a
' || fail "the report does not show the stalled import as cancelled at read"
[[ "$(rl_documents)" == 0 ]] || fail "a cancelled import left a record"
expect_library_consistent
providerfs fault clear "$MNT/docs/stalled.pdf"
say "ok: SIGINT during a stalled download → exit 130 after $(( took_us / 1000 )) ms, cancelled in the report, no record, nothing staged"

# kill -9 between the record and the move.
READING_LIST_PAUSE_AT=pending-record "$READING_LIST" import "$MNT/docs/one.pdf" --data-dir "$S/app" \
    2>"$S/out/kill.err" &
pid=$!
BACKGROUND+=("$pid")
for _ in $(seq 1000); do grep -q "paused at pending-record" "$S/out/kill.err" 2>/dev/null && break; sleep 0.01; done
grep -q "paused at pending-record" "$S/out/kill.err" || fail "the import did not reach its pending record"
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
rl list >/dev/null 2>"$S/out/restart.err"
grep -q "repaired at start" "$S/out/restart.err" || fail "the next start repaired nothing: $(cat "$S/out/restart.err")"
[[ "$(rl_documents)" == 0 ]] || fail "the killed import's record survived"
expect_library_consistent
rl report --json | grep -q '"result":"interrupted"' || fail "the report does not show the interrupted import"
say "ok: kill -9 with the pending record made: repaired at the next start, shown as interrupted"

# kill -9 after the move, before the record is made available: the next start checks the stored
# copy and makes it available, and the report names the document that list shows.
READING_LIST_PAUSE_AT=record "$READING_LIST" import "$MNT/docs/one.pdf" --data-dir "$S/app" \
    2>"$S/out/kill2.err" &
pid=$!
BACKGROUND+=("$pid")
for _ in $(seq 1000); do grep -q "paused at record" "$S/out/kill2.err" 2>/dev/null && break; sleep 0.01; done
grep -q "paused at record" "$S/out/kill2.err" || fail "the import did not reach its record stage"
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
rl list >/dev/null 2>"$S/out/restart2.err"
[[ "$(rl_documents)" == 1 ]] || fail "the document stored before the kill is not listed: $(rl list --json)"
listed="$(rl list --json | python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["id"])')"
reported="$(rl report --json | python3 -c '
import json, sys
for line in sys.stdin:
    attempt = json.loads(line)
    if attempt["result"] == "interrupted" and attempt.get("documentID"):
        print(attempt["documentID"])
        break
')"
[[ -n "$listed" && "$listed" == "$reported" ]] \
    || fail "report names document '$reported', list shows '$listed'"
expect_library_consistent
say "ok: kill -9 after the move: available at the next start, and report names the listed document"

# Two imports at once, in two processes, made to overlap: each stops itself inside its
# coordinated read with its first MiB staged, and both go on only when both are there.
for name in a b; do
    READING_LIST_PAUSE_AT=copy "$READING_LIST" import "$MNT/docs/two.pdf" --json --data-dir "$S/app" \
        >"$S/out/$name.json" 2>"$S/out/$name.err" &
    BACKGROUND+=("$!")
    eval "$name=$!"
done
for name in a b; do
    for _ in $(seq 3000); do grep -q "paused at copy" "$S/out/$name.err" 2>/dev/null && break; sleep 0.01; done
    grep -q "paused at copy" "$S/out/$name.err" || fail "import $name did not reach its copy: $(cat "$S/out/$name.err")"
done
[[ "$(ls "$S/app/staging" | wc -l)" == 2 ]] || fail "not two staged copies at once: $(ls "$S/app/staging")"
kill -CONT "$a" "$b"
wait "$a" || fail "the first concurrent import failed: $(cat "$S/out/a.json" "$S/out/a.err")"
wait "$b" || fail "the second concurrent import failed: $(cat "$S/out/b.json" "$S/out/b.err")"
# 3: the two, and the one the kill -9 after the move left.
[[ "$(rl_documents)" == 3 ]] || fail "two concurrent imports gave $(( $(rl_documents) - 1 )) documents"
for name in a b; do
    rl open "$(rl_field "$(cat "$S/out/$name.json")" documentID)" --cat | cmp - "$S/reference/docs/two.pdf" \
        || fail "a concurrent import's bytes differ"
done
expect_library_consistent
say "ok: two imports at once: two documents, each its own bytes"
scenario_done
