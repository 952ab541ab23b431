#!/usr/bin/env bash
# A plain write through the mount waits for another process's write claim (issue 24 item 1,
# D-399), as the issue tried it: `providerfs coordinate --write F -- …` holds F while a plain
# python O_WRONLY|O_APPEND writer opens F. With the claim deadline at 3 s and the holder at 6 s,
# the writer's open fails with ETIMEDOUT after about 3 s and none of its bytes ever reach F (at
# the mount or the source). A second writer that opens while the holder still has 1.5 s left
# waits for it, then appends after what the holder wrote inside its claim (it started from the
# holder's version). A `providerfs present` of F hears relinquishPresentedItemToWriter before
# that writer's claim is granted and presentedItemDidChange after its close.
source "$(dirname "$0")/lib.sh"
scenario_start

printf 'one\n' >"$SRC/f.txt"
PROVIDERFS_CLAIM_TIMEOUT=3s mount_source
file="$MNT/f.txt"

cat >"$S/append.py" <<'PY'
import errno, os, sys, time
start = time.time()
try:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
    os.write(fd, sys.argv[2].encode() + b"\n")
    os.close(fd)
    print("ok %.3f" % (time.time() - start))
except OSError as e:
    print("errno %s %.3f" % (errno.errorcode.get(e.errno, e.errno), time.time() - start))
PY

# hold SECONDS: the holder appends "holder" inside a write claim held SECONDS (pid in $holder).
hold() {
    rm -f "$S/granted"
    "$PROVIDERFS" coordinate --write "$file" --timeout 10s -- \
        sh -c "echo holder >> '$file'; touch '$S/granted'; sleep $1" &
    holder=$!
    BACKGROUND+=("$holder")
    for _ in $(seq 200); do [[ -e "$S/granted" ]] && break; sleep 0.05; done
    [[ -e "$S/granted" ]] || fail "the holder's claim was never granted"
}

# 1. The deadline: ETIMEDOUT at the open, nothing of the intruder anywhere.
hold 6
result="$(timeout 20 python3 "$S/append.py" "$file" INTRUDER)"
read -r kind name seconds <<<"$result"
[[ "$kind $name" == "errno ETIMEDOUT" ]] || fail "the write behind the claim: '$result' (want ETIMEDOUT)"
python3 -c "import sys; sys.exit(0 if 2.5 <= $seconds <= 5.9 else 1)" \
    || fail "ETIMEDOUT after $seconds s; the deadline is 3 s and the holder ends at 6 s"
say "ok: the plain writer's open failed with ETIMEDOUT after $seconds s (claim deadline 3 s, holder 6 s)"
wait "$holder" || fail "the holder failed"
for _ in $(seq 100); do cmp -s "$file" "$SRC/f.txt" && break; sleep 0.1; done
[[ "$(cat "$file")" == $'one\nholder' ]] || fail "f.txt at the mount: $(cat "$file")"
[[ "$(cat "$SRC/f.txt")" == $'one\nholder' ]] || fail "f.txt at the source: $(cat "$SRC/f.txt")"
say "ok: INTRUDER is neither at the mount nor at the source; the holder's line is"

# 2. Within the deadline: the writer waits, then appends after the holder's version; a presenter
# hears relinquish before the writer's claim and didChange after.
in_background "$PROVIDERFS" present "$file" >"$S/out/presenter"
presenter=$!
deadline=$(( $(micros) + 10000000 ))
until grep -q '"event":"ready"' "$S/out/presenter" 2>/dev/null; do
    (( $(micros) < deadline )) || fail "the presenter did not say ready within 10 s"
    sleep 0.05
done
hold 1.5
result="$(timeout 20 python3 "$S/append.py" "$file" second)"
read -r kind seconds <<<"$result"
[[ "$kind" == ok ]] || fail "the second writer: $result"
python3 -c "import sys; sys.exit(0 if $seconds >= 0.5 else 1)" || fail "the second writer did not wait ($seconds s)"
wait "$holder" || fail "the second holder failed"
[[ "$(cat "$file")" == $'one\nholder\nholder\nsecond' ]] || fail "f.txt after the wait: $(cat "$file")"
say "ok: the second writer waited $seconds s for the holder, then appended after the holder's line"
for _ in $(seq 100); do
    [[ "$(grep -c presentedItemDidChange "$S/out/presenter")" -ge 3 ]] && break
    sleep 0.05
done
events="$(sed -n 's/.*"event":"\([A-Za-z]*\)".*/\1/p' "$S/out/presenter" | tail -n +2 | tr '\n' ' ')"
# In order: the holder's claim and its command's own write open ask the presenter to relinquish,
# each ends with didChange; only then is the plain writer's claim granted (relinquish), and its
# close ends with didChange.
python3 - "$events" <<'PY' || fail "presenter events not as expected: $events"
import sys
events = [e for e in sys.argv[1].split() if e in ("relinquishToWriter", "presentedItemDidChange")]
R, D = "relinquishToWriter", "presentedItemDidChange"
sys.exit(0 if events == [R, R, D, D, R, D] else 1)
PY
say "ok: the presenter heard relinquishToWriter and presentedItemDidChange for the holder, then for the writer"
kill -TERM "$presenter"
scenario_done
