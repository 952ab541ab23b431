#!/usr/bin/env bash
# CMD owns its claim (issue 24 item 3, D-406), as the issue tried it: `providerfs coordinate
# --write F -- CMD`, the wrapper killed -9 while CMD runs. CMD's own append to F through the mount
# completes at once (before: it waited for the 60 s claim deadline, then published), the claim
# is still held while CMD lives (it names CMD's pid; a second `coordinate --write` waits), and it
# ends when CMD exits (the second writer then runs).
source "$(dirname "$0")/lib.sh"
scenario_start

printf 'one\n' >"$SRC/f.txt"
mount_source   # the default claim deadline, 60 s
file="$MNT/f.txt"
export S file

# CMD: says its pid, waits until its wrapper is dead, appends to F (timed), waits for "end".
cat >"$S/cmd.sh" <<'SH'
echo $$ >"$S/cmd.pid"
i=0; while [ ! -e "$S/killed" ]; do i=$((i+1)); [ $i -gt 400 ] && exit 9; sleep 0.025; done
s=$(date +%s%N); echo x >>"$file"; status=$?; e=$(date +%s%N)
echo "$status $(( (e - s) / 1000 ))" >"$S/append.tmp"; mv "$S/append.tmp" "$S/append"
i=0; while [ ! -e "$S/end" ]; do i=$((i+1)); [ $i -gt 1200 ] && exit 9; sleep 0.025; done
date +%s%N >"$S/ended"
SH

in_background "$PROVIDERFS" coordinate --write "$file" -- sh "$S/cmd.sh"
wrapper=$!
for _ in $(seq 200); do [[ -s "$S/cmd.pid" ]] && break; sleep 0.05; done
[[ -s "$S/cmd.pid" ]] || fail "CMD never started"
cmd="$(cat "$S/cmd.pid")"
BACKGROUND+=("$cmd")
kill -KILL "$wrapper"
wait "$wrapper" 2>/dev/null || true
kill -0 "$cmd" 2>/dev/null || fail "CMD did not outlive its wrapper"
touch "$S/killed"

# 1. CMD's append passes its own claim at once: well under 5% of the 60 s deadline.
for _ in $(seq 1400); do [[ -e "$S/append" ]] && break; sleep 0.05; done
read -r status micros_taken <"$S/append" || fail "CMD's append never ended"
[[ "$status" == 0 ]] || fail "CMD's append failed with status $status"
(( micros_taken < 3000000 )) || fail "CMD's append took $micros_taken µs (the claim deadline is 60 s)"
say "ok: CMD's append through the mount took $micros_taken µs after its wrapper's kill -9"

# 2. The claim is held while CMD lives, and names CMD.
claims="$(providerfs claims --mount "$MNT" --json)"
python3 - "$claims" "$cmd" <<'PY' || fail "the mount's claims do not show CMD's write claim: $claims"
import json, sys
claims = json.loads(sys.argv[1])["claims"]
sys.exit(0 if [(c["state"], str(c["pid"])) for c in claims] == [("held", sys.argv[2])] else 1)
PY
in_background "$PROVIDERFS" coordinate --write "$file" --timeout 30s -- sh -c 'date +%s%N >"$S/second"'
second=$!
for _ in $(seq 200); do providerfs claims --mount "$MNT" | grep -q waiting && break; sleep 0.05; done
providerfs claims --mount "$MNT" | grep -q waiting || fail "the second writer is not waiting: $(providerfs claims --mount "$MNT")"
[[ ! -e "$S/second" ]] || fail "the second writer ran while CMD held the claim"
say "ok: the claim names CMD (pid $cmd) and a second coordinate --write waits for it"

# 3. Released when CMD exits: the second writer runs after CMD's end.
touch "$S/end"
wait "$second" || fail "the second writer failed"
(( $(cat "$S/second") >= $(cat "$S/ended") )) || fail "the second writer ran before CMD ended"
[[ "$(cat "$file")" == $'one\nx' ]] || fail "f.txt: $(cat "$file")"
say "ok: the second writer ran after CMD exited; f.txt holds CMD's append"
scenario_done
