#!/usr/bin/env bash
# Conflicts (docs/SEMANTICS.md "Conflicts", D-362, D-386): an edit through the mount while the
# source changes keeps both versions. The source's version stays under the name (at the source
# and through the mount); the edit is uploaded beside it as "NAME (conflict YYYY-MM-DD HHMMSS).EXT"
# (UTC), which the mount lists and reads, and the original's user.providerfs.conflict names it.
# Two cases: an existing file rewritten at the source while a writer has it open through the
# mount, and a file created through the mount whose name someone takes at the source before its
# upload.
source "$(dirname "$0")/lib.sh"
scenario_start

printf 'base\n' >"$SRC/notes.txt"
mount_source
ls "$MNT" >/dev/null   # the root listed (and watched) as a user's shell would have it

before="$(date -u '+%Y-%m-%d %H%M%S')"
python3 - "$MNT" "$SRC" >"$S/out/edit.out" 2>&1 <<'PY' || fail "the edits failed: $(cat "$S/out/edit.out")"
import os, sys
mnt, src = sys.argv[1], sys.argv[2]
# 1. An existing file: opened for writing through the mount, rewritten at the source, then
#    written and closed through the mount.
fd = os.open(mnt + "/notes.txt", os.O_WRONLY | os.O_TRUNC)
with open(src + "/notes.txt", "w") as f:
    f.write("theirs: written at the source\n")
os.write(fd, b"ours: written through the mount\n")
os.close(fd)
# 2. A new file: created through the mount, the same name made at the source, then written and
#    closed through the mount.
fd = os.open(mnt + "/new.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
with open(src + "/new.txt", "w") as f:
    f.write("theirs: new at the source\n")
os.write(fd, b"ours: new through the mount\n")
os.close(fd)
PY
say "edited notes.txt and created new.txt through the mount while the source changed both"

# conflict_copy NAME OURS: waits (20 s) for the one conflict copy of NAME at the source; sets COPY.
# Fails at once when the source's NAME holds OURS (the upload replaced their version: no conflict
# check).
conflict_copy() {
    local base="${1%.*}" ext="${1##*.}" deadline copies
    deadline=$(( $(micros) + $(seconds_to_micros 20) ))
    while :; do
        mapfile -t copies < <(cd "$SRC" && ls -1 | grep -F "$base (conflict " || true)
        (( ${#copies[@]} == 0 )) || break
        [[ "$(cat "$SRC/$1" 2>/dev/null)" != "$2" ]] \
            || fail "the source's $1 holds the mount's edit: the upload replaced the source's version (no conflict check)"
        (( $(micros) < deadline )) || fail "no conflict copy of $base.$ext at the source after 20 s: $(ls -1 "$SRC" | paste -sd, -)"
        sleep 0.05
    done
    (( ${#copies[@]} == 1 )) || fail "${#copies[@]} conflict copies of $base.$ext: ${copies[*]}"
    COPY="${copies[0]}"
    [[ "$COPY" =~ ^"$base"\ \(conflict\ ([0-9]{4}-[0-9]{2}-[0-9]{2}\ [0-9]{6})\)\."$ext"$ ]] \
        || fail "conflict copy '$COPY' is not named '$base (conflict YYYY-MM-DD HHMMSS).$ext'"
    local stamp="${BASH_REMATCH[1]}" after
    after="$(date -u '+%Y-%m-%d %H%M%S')"
    [[ ! "$stamp" < "$before" && ! "$stamp" > "$after" ]] \
        || fail "conflict copy '$COPY': its time $stamp is not the UTC time of the upload ($before … $after)"
    say "ok: the edit of $base.$ext is kept at the source as '$COPY'"
}

# expect_text PATH TEXT [SECONDS]: PATH reads exactly TEXT (waits up to SECONDS, default 10, for it)
expect_text() {
    local deadline got
    deadline=$(( $(micros) + $(seconds_to_micros "${3:-10}") ))
    while :; do
        got="$(timeout -k 2 "$READER_TIMEOUT" cat "$1" 2>&1)" && [[ "$got" == "$2" ]] && break
        (( $(micros) < deadline )) || fail "$1 reads '$got', expected '$2'"
        sleep 0.05
    done
    say "ok: $1 reads '$2'"
}

# expect_conflict NAME THEIRS OURS: the source's version (THEIRS) under NAME, the mount's (OURS) as
# the conflict copy, at the source and through the mount; the original names its copy.
expect_conflict() {
    local name="$1" theirs="$2" ours="$3" got
    conflict_copy "$name" "$ours"
    expect_text "$SRC/$name" "$theirs"
    expect_text "$SRC/$COPY" "$ours"
    expect_text "$MNT/$name" "$theirs"
    expect_text "$MNT/$COPY" "$ours"
    ls -1 "$MNT" | grep -qxF "$COPY" || fail "ls $MNT does not list '$COPY': $(ls -1 "$MNT" | paste -sd, -)"
    say "ok: ls $MNT lists '$COPY'"
    got="$(xattr "$MNT/$name" conflict)" || fail "$MNT/$name has no user.providerfs.conflict"
    [[ "$got" == "$COPY" ]] || fail "$MNT/$name: user.providerfs.conflict is '$got', expected '$COPY'"
    say "ok: user.providerfs.conflict of $name = $got"
}

expect_conflict notes.txt "theirs: written at the source" "ours: written through the mount"
expect_conflict new.txt "theirs: new at the source" "ours: new through the mount"
scenario_done
