#!/usr/bin/env bash
# Require-token mode (`providerfs mount --require-token`, docs/SEMANTICS.md "Require-token mode"):
# every program but this user's own providerfs commands gets EACCES on plain paths, also on
# paths those commands just looked up, and on `..` out of an access path; the mount point
# itself still stats (stat, df); status, download and token grant work on plain paths; a granted
# access path reads with cat and dd; each refusal is explained in the daemon's log. Then a
# remount without the flag: plain paths are open again and the token still reads.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file docs/report.pdf 2MiB
make_file secret.bin 64KiB
mount_source --require-token

# The mount point answers everyone (or every tool that checks it would break).
expect_fast 5 stat "$MNT"
expect_fast 5 df "$MNT"

# Ordinary programs of the same user: EACCES on every plain path.
expect_failure EACCES 5 cat "$MNT/secret.bin"
expect_failure EACCES 5 ls "$MNT"
expect_failure EACCES 5 ls "$MNT/docs"
expect_failure EACCES 5 stat "$MNT/docs/report.pdf"
expect_failure EACCES 5 getfattr -n user.providerfs.state "$MNT/docs/report.pdf"
expect_errno python "$MNT/docs/report.pdf" EACCES 5

# This user's providerfs commands: the mode shows, and plain paths work for them. (Outputs are
# taken whole before they are searched: `grep -q` ending a pipe early would be a SIGPIPE.)
out="$(status_json)" || fail "providerfs status --json failed"
[[ "$out" == *'"requireToken":true'* ]] || fail "providerfs status --json does not show require-token mode: $out"
out="$(providerfs status "$MNT")" || fail "providerfs status failed"
[[ "$out" == *"access:   require-token"* ]] || fail "providerfs status does not show require-token mode: $out"
say "ok: providerfs status shows require-token mode"
out="$(providerfs status "$MNT/docs/report.pdf")" || fail "providerfs status of a plain path failed"
[[ "$out" =~ state:\ +dataless ]] || fail "providerfs status of a plain path: $out"
providerfs download "$MNT/docs" >/dev/null || fail "providerfs download of a plain folder failed"
out="$(providerfs status "$MNT/docs/report.pdf")" || fail "providerfs status of a plain path failed"
[[ "$out" =~ state:\ +materialized ]] || fail "not downloaded: $out"
say "ok: providerfs status and download work on plain paths"

# What those commands looked up lets nobody else in: every walk asks the daemon again.
expect_failure EACCES 5 cat "$MNT/docs/report.pdf"
expect_failure EACCES 5 dd if="$MNT/docs/report.pdf" of=/dev/null bs=1M

# The way in for programs: an access path.
granted="$(providerfs token grant "$MNT/docs")" || fail "providerfs token grant of a plain folder failed"
access="${granted%%$'\n'*}"
[[ "$access" == "$MNT/.scoped/"* ]] || fail "token grant printed no access path: $access"
expect_content cat "$access/report.pdf" "$SRC/docs/report.pdf"
expect_content dd "$access/report.pdf" "$SRC/docs/report.pdf"
expect_failure EACCES 5 cat "$access/../../secret.bin"
expect_failure EACCES 5 ls "$access/../.."

grep -q "refused (require-token mode): cat (pid" "$S/daemon.log" \
    || fail "the daemon's log does not explain the refusals"
say "ok: the log explains: $(grep -m1 "refused (require-token mode): cat" "$S/daemon.log" | cut -d' ' -f3-)"

# Without the flag, the same cache: plain paths are open again, the stored token still reads.
providerfs unmount "$MNT" >/dev/null || fail "unmount failed"
mount_source
expect_content cat "$MNT/secret.bin"
expect_content cat "$access/report.pdf" "$SRC/docs/report.pdf"
out="$(providerfs status "$MNT")" || fail "providerfs status failed"
[[ "$out" == *"access:   plain paths open"* ]] || fail "providerfs status still shows require-token mode: $out"

scenario_done
