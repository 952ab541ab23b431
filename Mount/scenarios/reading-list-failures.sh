#!/usr/bin/env bash
# reading-list when the source misbehaves: a download that fails part-way fails the import at
# `read` with no record; after `fault clear` a retry succeeds with the source's bytes. A token
# that expires mid-copy (`token expire` while the import is stopped after its first MiB) fails at
# `read`, with no record and nothing staged.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/reading-list.lib"
scenario_start

make_pdf docs/big.pdf 2 $((6 << 20))
make_pdf docs/slow.pdf 2 $((6 << 20))
mount_source

providerfs fault add "$MNT/docs/big.pdf" --fail-at 1MiB --times 0
failed="$(rl import "$MNT/docs/big.pdf" --json || true)"
[[ "$(rl_field "$failed" stage)" == read ]] || fail "a failed download did not fail at read: $failed"
[[ "$(rl_documents)" == 0 ]] || fail "a failed import left a record"
expect_library_consistent
say "ok: failed at read: $(rl_field "$failed" error)"

providerfs fault clear "$MNT/docs/big.pdf"
retried="$(rl import "$MNT/docs/big.pdf" --json)"
[[ "$(rl_field "$retried" result)" == imported ]] || fail "the retry after fault clear failed: $retried"
rl open "$(rl_field "$retried" documentID)" --cat | cmp - "$S/reference/docs/big.pdf" || fail "the retried copy differs"
say "ok: after fault clear the import has the source's bytes"

# The token ends mid-copy, on cue: the import stops itself with its first MiB of 6 staged
# (READING_LIST_PAUSE_AT=copy, the app's test hook), the token is expired, the import resumes.
grant_token "$MNT/docs/slow.pdf" --ttl 10m
READING_LIST_PAUSE_AT=copy "$READING_LIST" import "$ACCESS" --json --data-dir "$S/app" \
    >"$S/out/expired.json" 2>"$S/out/expired.err" &
pid=$!
BACKGROUND+=("$pid")
for _ in $(seq 3000); do grep -q "paused at copy" "$S/out/expired.err" 2>/dev/null && break; sleep 0.01; done
grep -q "paused at copy" "$S/out/expired.err" || fail "the import did not stop mid-copy: $(cat "$S/out/expired.err")"
providerfs token expire "$TOKEN_ID" >/dev/null
kill -CONT "$pid"
status=0
wait "$pid" || status=$?
[[ $status -eq 1 ]] || fail "the import across the expiry exited $status: $(cat "$S/out/expired.err")"
expired="$(cat "$S/out/expired.json")"
[[ "$(rl_field "$expired" stage)" == read ]] || fail "a token expiring mid-copy: $expired"
[[ "$(rl_field "$expired" error)" == *"access ended"* ]] || fail "the error does not say access ended: $expired"
say "ok: a token expiring mid-copy failed at read: $(rl_field "$expired" error)"
[[ "$(rl_documents)" == 1 ]] || fail "the expired import left a record"
expect_library_consistent
scenario_done
