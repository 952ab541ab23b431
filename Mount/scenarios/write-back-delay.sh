#!/usr/bin/env bash
# The write-back settle (docs/SEMANTICS.md "Write-back", D-405, D-408), on a mount made with
# `--write-back-delay 2s`: SQLite in its default rollback-journal mode commits 30 transactions
# through the mount; its journal (made and deleted within each commit) never reaches the source,
# the database does once the delay has passed, and the rows at the source are all there. A file
# made and removed through the mount within the delay leaves nothing at the source but its
# directory's moved mtime. A file closed through the mount is not at the source before the delay
# and is after it. An unmount sends what still waits.
source "$(dirname "$0")/lib.sh"
scenario_start

mkdir -p "$SRC/app" "$SRC/tmp"
mount_source --write-back-delay 2s
ls "$MNT" "$MNT/app" "$MNT/tmp" >/dev/null   # listed (and watched) as a user's shell would have them

# A file made and removed within the delay: nothing at the source, the directory's mtime moved.
printf 'scratch\n' >"$MNT/tmp/swap.tmp"
touch -d '2001-09-09 01:46:40' "$MNT/tmp"   # as tar x sets a directory's mtime after its files
rm "$MNT/tmp/swap.tmp"
[[ ! -e "$SRC/tmp/swap.tmp" ]] || fail "a file removed within the delay reached the source"
(( $(stat -c %Y "$SRC/tmp") > 1000000000 + 86400 )) \
    || fail "the source directory's mtime did not move for the removed file: $(stat -c %Y "$SRC/tmp")"
say "ok: a file made and removed within the delay left only its directory's mtime at the source"

# A closed file waits out the delay, then arrives.
printf 'hello\n' >"$MNT/app/notes.txt"
closed=$(micros)
[[ ! -e "$SRC/app/notes.txt" ]] || fail "the closed file reached the source before its delay"
until [[ -e "$SRC/app/notes.txt" ]]; do
    (( $(micros) - closed < 20000000 )) || fail "the closed file never reached the source"
    sleep 0.05
done
waited=$(( ($(micros) - closed) / 1000 ))
(( waited >= 1900 )) || fail "the closed file reached the source after $waited ms, before its 2 s delay"
cmp -s "$SRC/app/notes.txt" <(printf 'hello\n') || fail "the uploaded bytes differ"
say "ok: a closed file reached the source after $waited ms (delay 2 s)"

# SQLite: 30 commits; the journal never appears at the source.
python3 - "$MNT/app/db.sqlite" "$SRC/app" >"$S/out/sqlite.out" 2>&1 <<'PY' || fail "sqlite: $(cat "$S/out/sqlite.out")"
import os, sqlite3, sys
path, source = sys.argv[1], sys.argv[2]
c = sqlite3.connect(path, isolation_level=None)
c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
for i in range(30):
    c.execute("BEGIN")
    c.execute("INSERT INTO t (v) VALUES (?)", (f"row {i}",))
    c.execute("COMMIT")
    if os.path.exists(source + "/db.sqlite-journal"):
        sys.exit(f"commit {i}: the journal is at the source")
c.close()
PY
committed=$(micros)
until [[ -e "$SRC/app/db.sqlite" ]] && python3 -c '
import sqlite3, sys
sys.exit(0 if sqlite3.connect(sys.argv[1]).execute("select count(*) from t").fetchone()[0] == 30 else 1)
' "$SRC/app/db.sqlite" 2>/dev/null; do
    (( $(micros) - committed < 30000000 )) || fail "the database never reached the source with its 30 rows"
    sleep 0.1
done
[[ ! -e "$SRC/app/db.sqlite-journal" ]] || fail "the journal is at the source"
say "ok: 30 commits: the database reached the source with its rows, the journal never did"

# What waits at an unmount is sent by it.
printf 'last\n' >"$MNT/app/last.txt"
providerfs unmount "$MNT" --timeout 20s >/dev/null || fail "unmount failed"
DAEMON_PID=""
cmp -s "$SRC/app/last.txt" <(printf 'last\n') || fail "the unmount did not send the file that waited"
say "ok: the unmount sent the file that still waited"
scenario_done
