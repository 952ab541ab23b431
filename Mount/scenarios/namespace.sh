#!/usr/bin/env bash
# scenario-providers: local (symbolic and hard links: WebDAV has none (EPERM))
# Namespace changes through a writable mount (issue 14), as a user would script them: mkdir -p,
# mv of a file and of a directory, mv over an existing file, ln -s, rm, rm -r, and rmdir of a
# non-empty directory (ENOTEMPTY). After each step the SOURCE directory shows the change. A
# `providerfs present` process watching a file hears accommodatePresentedItemDeletion before `rm`
# of that file returns.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file docs/a.txt 4KiB
make_file docs/b.txt 8KiB
make_file keep/c.txt 1KiB
mount_source

mkdir -p "$MNT/projects/2026/q4"
[[ -d "$SRC/projects/2026/q4" ]] || fail "mkdir -p through the mount did not reach the source"
say "ok: mkdir -p made projects/2026/q4 at the source"

mv "$MNT/docs/a.txt" "$MNT/projects/2026/q4/a.txt"
[[ ! -e "$SRC/docs/a.txt" ]] && cmp -s "$SRC/projects/2026/q4/a.txt" "$S/reference/docs/a.txt" \
    || fail "mv of a file across directories is not what the source shows"
say "ok: mv across directories, the bytes unchanged at the source"

mv "$MNT/keep/c.txt" "$MNT/docs/b.txt"
cmp -s "$SRC/docs/b.txt" "$S/reference/keep/c.txt" || fail "mv over an existing file did not replace it at the source"
cmp -s "$MNT/docs/b.txt" "$S/reference/keep/c.txt" || fail "mv over an existing file: the mount shows other bytes"
say "ok: mv over an existing file replaced it (mount and source)"

mv "$MNT/projects" "$MNT/archive"
cmp -s "$MNT/archive/2026/q4/a.txt" "$S/reference/docs/a.txt" || fail "a file inside a moved directory reads wrong"
[[ -d "$SRC/archive/2026/q4" && ! -e "$SRC/projects" ]] || fail "mv of a directory is not what the source shows"
say "ok: mv of a directory; what is inside reads through its new path"

ln -s ../archive/2026/q4/a.txt "$MNT/docs/link"
[[ "$(readlink "$SRC/docs/link")" == "../archive/2026/q4/a.txt" ]] || fail "ln -s did not reach the source"
cmp -s "$MNT/docs/link" "$S/reference/docs/a.txt" || fail "the symlink does not lead to the file through the mount"
say "ok: ln -s, stored as given, followed through the mount"

expect_failure_errno() {  # expect_failure_errno ERRNO CMD… : CMD fails and says the errno's message
    local errno="$1" message
    shift
    message="$(errno_message "$errno")"
    if out="$("$@" 2>&1)"; then fail "'$*' succeeded; expected $errno"; fi
    [[ "$out" == *"$message"* ]] || fail "'$*' failed with '$out', expected $errno ($message)"
    say "ok: '$*' fails with $errno"
}
expect_failure_errno ENOTEMPTY rmdir "$MNT/archive/2026"
expect_failure_errno EEXIST mkdir "$MNT/docs"
expect_failure_errno ENOENT mv "$MNT/missing" "$MNT/docs/x"

# A presenter of docs/b.txt hears of its deletion before rm returns.
in_background "$PROVIDERFS" present "$MNT/docs/b.txt" >"$S/out/presenter"
presenter=$!
deadline=$(( $(micros) + 10000000 ))
until grep -q '"event":"ready"' "$S/out/presenter" 2>/dev/null; do
    (( $(micros) < deadline )) || fail "the presenter did not say ready within 10 s"
    sleep 0.05
done
rm "$MNT/docs/b.txt"
grep -q accommodatePresentedItemDeletion "$S/out/presenter" \
    || fail "rm returned before the presenter heard accommodatePresentedItemDeletion: $(cat "$S/out/presenter")"
[[ ! -e "$SRC/docs/b.txt" ]] || fail "rm did not reach the source"
say "ok: the presenter heard accommodatePresentedItemDeletion before rm returned"
kill -TERM "$presenter"
wait "$presenter" 2>/dev/null || true

rm -r "$MNT/archive"
[[ ! -e "$SRC/archive" && ! -e "$MNT/archive" ]] || fail "rm -r did not remove the tree at the source"
say "ok: rm -r removed the tree (mount and source)"
[[ "$(ls -A "$SRC/docs")" == "link" ]] || fail "the source's docs holds $(ls -A "$SRC/docs"), expected only link"

scenario_done
