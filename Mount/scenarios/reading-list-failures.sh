#!/usr/bin/env bash
# reading-list when the source misbehaves: a download that fails part-way fails the import at
# `read` with no record; after `fault clear` a retry succeeds with the source's bytes. A token
# that expires mid-copy fails at `access` or `read`, with no record and nothing staged.
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

providerfs fault add "$MNT/docs/slow.pdf" --slow 2MiB --times 0
access="$(first_line providerfs token grant "$MNT/docs/slow.pdf" --ttl 1s)"
expired="$(rl import "$access" --json || true)"
case "$(rl_field "$expired" stage)" in
    access | read) say "ok: a token expiring mid-copy failed at $(rl_field "$expired" stage): $(rl_field "$expired" error)" ;;
    *) fail "a token expiring mid-copy: $expired" ;;
esac
[[ "$(rl_documents)" == 1 ]] || fail "the expired import left a record"
expect_library_consistent
scenario_done
