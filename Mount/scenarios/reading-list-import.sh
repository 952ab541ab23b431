#!/usr/bin/env bash
# reading-list imports from a plain path and from a token access path; two documents with the
# same name stay two; the app's copy still opens, byte for byte, after the source is moved and
# then removed in the provider and the app restarted; a text file named .pdf fails at validate; a
# PDF qpdf must repair is imported and flagged, and refused with --strict.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/reading-list.lib"
scenario_start

make_pdf docs/paper.pdf 3
make_pdf other/paper.pdf 5
make_repaired_pdf docs/repaired.pdf
mkdir -p "$SRC/docs" && echo "meeting notes" >"$SRC/docs/notes.pdf"
make_pdf docs/whole.pdf 4
head -c "$(( $(stat -c %s "$SRC/docs/whole.pdf") / 4 ))" "$SRC/docs/whole.pdf" >"$SRC/docs/cut.pdf"   # a real PDF, cut short
mount_source

plain="$(rl import "$MNT/docs/paper.pdf" --json)"
[[ "$(rl_field "$plain" result)" == imported ]] || fail "plain import: $plain"
first="$(rl_field "$plain" documentID)"
say "ok: plain path imported as $first ($(rl_field "$plain" pages) pages)"

access="$(first_line providerfs token grant "$MNT/other/paper.pdf" --ttl 10m)"
token="$(rl import "$access" --json)"
[[ "$(rl_field "$token" result)" == imported ]] || fail "token import: $token"
second="$(rl_field "$token" documentID)"
[[ "$first" != "$second" ]] || fail "two paper.pdf got one id"
say "ok: token access path imported as $second; two documents named paper.pdf"

report="$(rl report --json)"
[[ "$report" != *pfs_* ]] || fail "a token is in the report"
[[ "$report" == *'"sourceCategory":"tokenPath"'* && "$report" == *'"sourceCategory":"mountPath"'* ]] \
    || fail "the report lacks the source categories: $report"
say "ok: the report has both categories and no token"

mv "$SRC/docs/paper.pdf" "$SRC/docs/moved.pdf"
rm "$SRC/docs/moved.pdf"
rl open "$first" --cat >"$S/out/first.pdf"
cmp "$S/out/first.pdf" "$S/reference/docs/paper.pdf" || fail "the app's copy differs from the original"
say "ok: source moved and removed; the app (a new process) opens identical bytes"

notes="$(rl import "$MNT/docs/notes.pdf" --json || true)"
[[ "$(rl_field "$notes" stage)" == validate ]] || fail "a text file was not refused at validate: $notes"
say "ok: text named .pdf fails at validate: $(rl_field "$notes" error)"
cut="$(rl import "$MNT/docs/cut.pdf" --json || true)"
[[ "$(rl_field "$cut" stage)" == validate ]] || fail "a PDF cut short was not refused at validate: $cut"
say "ok: a PDF cut short fails at validate: $(rl_field "$cut" error)"

repaired="$(rl import "$MNT/docs/repaired.pdf" --json)"
[[ "$(rl_field "$repaired" repaired)" == True ]] || fail "a repaired PDF was not flagged: $repaired"
strict="$(rl import "$MNT/docs/repaired.pdf" --strict --json || true)"
[[ "$(rl_field "$strict" stage)" == validate ]] || fail "--strict accepted a repaired PDF: $strict"
say "ok: a repaired PDF is imported and flagged; --strict refuses it"

[[ "$(rl_documents)" == 3 ]] || fail "expected 3 documents, have $(rl_documents)"
expect_library_consistent
scenario_done
