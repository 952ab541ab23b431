#!/usr/bin/env bash
# Batch imports through one access path (issue 24 item 6, D-394): every coordinated open probes
# `.scoped/.providerfs-package` (the coordinator's package marker), a name that cannot be a token.
# Before, each probe counted as a token guess and the 21st within a second throttled the user:
# 20 of 25 imports went through. Now such names are ENOENT, unlogged and uncounted: 500 imports
# in one process and 500 in 500 processes all succeed, and `token log` has no denial; real
# guesses still throttle. About 30 s on a shared 2-core machine (READING_LIST_BATCH=N for fewer).
# Over WebDAV 100 per phase (every open there is a round trip to rclone; 100, two phases at once,
# are still four times the 25 imports that met the throttle before), so it runs over both providers.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/reading-list.lib"
scenario_start

default_count=500
[[ "${SCENARIO_PROVIDER:-local}" != webdav ]] || default_count=100
count="${READING_LIST_BATCH:-$default_count}"   # imports per phase (fewer for a quick local run)
make_pdf batch/f0.pdf 1
for (( i = 1; i < count; i++ )); do cp "$SRC/batch/f0.pdf" "$SRC/batch/f$i.pdf"; done
mount_source

access="$(first_line providerfs token grant "$MNT/batch" --ttl 10m)"
[[ "$access" == "$MNT/.scoped/pfs_"* ]] || fail "token grant printed no access path: $access"

probe="$(stat "$MNT/.scoped/.providerfs-package" 2>&1 || true)"
[[ "$probe" == *"No such file or directory"* ]] || fail "the package probe is not ENOENT: $probe"
say "ok: .scoped/.providerfs-package is ENOENT"

# One process imports them all while 500 other processes of the same user import them too (the
# report: the user's other processes were refused meanwhile).
paths=()
for (( i = 0; i < count; i++ )); do paths+=("$access/f$i.pdf"); done
in_background "$READING_LIST" import "${paths[@]}" --json --data-dir "$S/app" >"$S/out/one.json"
one=$!

# 500 processes, 8 at a time; each lane of 8 has its own data directory, so no library is used
# by two imports at once (its start-up repair would take the other's import for an interrupted one).
python3 - "$READING_LIST" "$S/apps" "$access" "$count" >"$S/out/processes.json" <<'PY'
import subprocess, sys, threading
reading_list, apps, access, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lanes, results = 8, [""] * count
def lane(k):
    for i in range(k, count, lanes):
        done = subprocess.run([reading_list, "import", f"{access}/f{i}.pdf", "--json", "--data-dir", f"{apps}/{k}"],
                              capture_output=True, text=True, timeout=60)
        results[i] = done.stdout.strip() or f"exit {done.returncode}: {done.stderr.strip()}"
threads = [threading.Thread(target=lane, args=(k,)) for k in range(lanes)]
for thread in threads: thread.start()
for thread in threads: thread.join()
print("\n".join(results))
PY
imported="$(grep -c '"result":"imported"' "$S/out/processes.json" || true)"
[[ "$imported" == "$count" ]] \
    || fail "$count processes imported $imported through one grant: $(grep -v -m3 '"result":"imported"' "$S/out/processes.json")"
say "ok: $count processes (8 at a time) imported all $count through one grant"
wait "$one" || true
imported="$(grep -c '"result":"imported"' "$S/out/one.json" || true)"
[[ "$imported" == "$count" ]] \
    || fail "one process imported $imported of $count through one grant: $(grep -v -m3 '"result":"imported"' "$S/out/one.json")"
say "ok: meanwhile one process imported all $count through the same grant"

log="$(providerfs token log --json)"
denials="$(grep -c '"denial"\|"rateLimited"' <<<"$log" || true)"
[[ "$denials" == 0 ]] || fail "the probes were logged as denials: $(grep -m3 '"denial"\|"rateLimited"' <<<"$log")"
say "ok: token log has no denial and no rate limiting"

# Brute-force protection stays: 21 well-formed guesses throttle this user, the grant with it.
guess="$MNT/.scoped/pfs_$(python3 -c 'print("a" * 8 + "_" + "a" * 32)')"
for (( i = 0; i < 21; i++ )); do stat "$guess" >/dev/null 2>&1 && fail "a guess was found"; done
refused="$(cat "$access/f0.pdf" 2>&1 >/dev/null || true)"
[[ "$refused" == *"Permission denied"* ]] || fail "21 guesses in a row did not throttle: $refused"
say "ok: 21 real guesses still throttle the user (Permission denied on the grant)"

[[ "$(rl_documents)" == "$count" ]] || fail "expected $count documents, have $(rl_documents)"
scenario_done
