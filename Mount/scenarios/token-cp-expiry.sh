#!/usr/bin/env bash
# `cp` through an access path whose token expires mid-copy (issue 12): the provider is slowed
# (2 MiB/s for an 8 MiB file, so the download takes 4 s and the copy provably runs across the 2 s
# expiry). cp fails with a non-zero status and EACCES ("Permission denied"), and nothing claims to
# be complete: GNU cp leaves the destination it was writing, SHORTER than the source (its bytes a
# correct prefix). The mount's item is not damaged: the plain path then reads it whole and right.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file big.bin 8MiB
mount_source
file="$MNT/big.bin"
providerfs fault add "$file" --slow 2MiB/s --times 0

before="$EPOCHREALTIME"
grant_token "$file" --ttl 2s
after="$EPOCHREALTIME"
copy="$S/out/copy.bin"
status=0
timeout -k 2 "$READER_TIMEOUT" cp "$ACCESS" "$copy" 2>"$S/out/cp.err" || status=$?
ended="$EPOCHREALTIME"
[[ $status -ne 124 && $status -ne 137 ]] || fail "cp HUNG: killed by timeout after $READER_TIMEOUT s"
[[ $status -ne 0 ]] || fail "cp across the expiry succeeded ($(stat -c %s "$copy") bytes)"
grep -q "Permission denied" "$S/out/cp.err" || fail "cp failed (exit $status) without EACCES: $(cat "$S/out/cp.err")"
# cp ran across the expiry: it ended after the earliest possible expiry (grant + 2 s).
took="$(elapsed_since "$before")"
(( $(micros "$ended") >= $(micros "$before") + 2000000 )) || fail "cp ended after $took s, before the 2 s expiry"
late=$(( $(micros "$ended") - $(micros "$after") - 2000000 ))
say "ok: cp failed with exit $status after $took s ($(( late / 1000 )) ms after the latest possible expiry): $(mask_tokens <"$S/out/cp.err")"

# Nothing claims completeness: the destination (left by cp) is shorter than the source, and what
# it holds is the source's first bytes.
size=$(stat -c %s "$SRC/big.bin") copied=0
if [[ -e "$copy" ]]; then
    copied=$(stat -c %s "$copy")
    [[ $copied -lt $size ]] || fail "cp failed but left a destination of $copied bytes, the full $size"
    cmp -s -n "$copied" "$copy" "$(reference_of "$file")" || fail "the $copied bytes cp left are not the source's"
    say "ok: cp left the destination SHORTER than the source: $copied of $size bytes, a correct prefix"
else
    say "ok: cp removed the destination"
fi
(( copied > 0 )) || say "note: cp copied no byte before the expiry"

# The item is not damaged: the download goes on (or resumes); the plain path reads it whole.
providerfs fault clear "$file"
expect_content cat "$file"
expect_state "$file" materialized
expect_failure EACCES 5 cat "$ACCESS"
expect_token_state "$TOKEN_ID" "expired"
expect_token_events "$TOKEN_ID" grant use expiry "denial expired"
scenario_done
