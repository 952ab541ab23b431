#!/usr/bin/env bash
# tar x of a real-looking source tree through a writable mount (issue 23): about 3,000 entries with
# symbolic links (relative, absolute, dangling, to directories, placed before the files tar writes
# after them, so tar's placeholder check of st_ino runs), empty files, a deep path, odd names and
# explicit modes and times. tar must exit 0, and the mount and (once the write-back is done) the
# source must hold exactly what the same tar x made in a plain directory: kinds, bytes, link
# targets, modes, mtimes. Every item keeps its st_ino through the write-back and a remount (D-389).
# Hard links are the documented exception (SEMANTICS.md "Hard links"): an archive with them makes
# tar exit 2 with EPERM for each, and nothing else is lost.
#
source "$(dirname "$0")/lib.sh"
scenario_start

tree="$S/tree"
mkdir -p "$tree/a/links" "$tree/z"
python3 - "$tree" <<'PY'
import os, sys
root = sys.argv[1]
# Links first (tar extracts them as placeholders until the end), then many files after them.
os.symlink("../z/f1", root + "/a/links/relative")
os.symlink("/etc/hostname", root + "/a/links/absolute")
os.symlink("../nowhere/at/all", root + "/a/links/dangling")
os.symlink("../z", root + "/a/links/to-directory")
os.symlink("..", root + "/a/links/dotdot")
for i in range(1, 1501):
    with open("%s/z/f%d" % (root, i), "w") as f:
        f.write("%d\n" % i)
for i in range(200):
    open("%s/z/empty%d" % (root, i), "w").close()
deep = root + "/deep/" + "/".join("level%02d" % i for i in range(40))
os.makedirs(deep)
with open(deep + "/bottom.txt", "w") as f:
    f.write("at the bottom\n")
odd = root + "/odd"
os.mkdir(odd)
for name in ["with space", "-leading-dash", "quote'\"", "tab\there", "ünïcødé ✓", "x" * 255, "new\nline", "*?[glob]"]:
    with open(odd + "/" + name, "wb") as f:
        f.write(name.encode() + b"\n")
for d in range(60):
    sub = "%s/src/m%02d" % (root, d)
    os.makedirs(sub)
    for i in range(20):
        with open("%s/s%d.c" % (sub, i), "wb") as f:
            f.write(os.urandom(37 * i + d))
        os.symlink("s%d.c" % i, "%s/l%d.h" % (sub, i))
os.chmod(root + "/z/f2", 0o600)
os.chmod(root + "/z/f3", 0o755)
os.utime(root + "/z/f4", (1_000_000_000, 1_000_000_000))
PY
tar cf "$S/tree.tar" -C "$tree" a z deep odd src
entries=$(tar tf "$S/tree.tar" | wc -l)
mkdir -p "$S/reference/x"
tar xf "$S/tree.tar" -C "$S/reference/x"

mount_source
mkdir "$MNT/x"
tar xf "$S/tree.tar" -C "$MNT/x" 2>"$S/out/tar.err" || fail "tar x through the mount exited $?: $(head -5 "$S/out/tar.err")"
[[ ! -s "$S/out/tar.err" ]] || fail "tar x through the mount complained: $(head -5 "$S/out/tar.err")"
say "ok: tar x of $entries entries through the mount exited 0, silently"

# Compares two trees without following links: kind, bytes, link target, mode, a file's mtime.
compare_trees() {
    python3 - "$1" "$2" <<'PY'
import os, stat, sys
def walk(root):
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(info.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                out[rel] = ("dir", stat.S_IMODE(info.st_mode))
            else:
                with open(path, "rb") as f:
                    out[rel] = ("file", stat.S_IMODE(info.st_mode), f.read(), info.st_mtime_ns // 10**9)
    return out
expected, actual = walk(sys.argv[1]), walk(sys.argv[2])
problems = []
for rel in sorted(set(expected) | set(actual)):
    if rel not in actual: problems.append("missing: %r %s" % (rel, expected[rel][0]))
    elif rel not in expected: problems.append("unexpected: %r" % rel)
    elif expected[rel] != actual[rel]:
        e, a = expected[rel], actual[rel]
        problems.append("differs: %r (%s vs %s)" % (rel, e[:2], a[:2]))
if problems:
    print("%d differences, first: %s" % (len(problems), "; ".join(problems[:5])))
    sys.exit(1)
print(len(expected))
PY
}
inodes() { (cd "$1" && find . -printf '%i %p\n' | sort -k2); }

compared=$(compare_trees "$S/reference/x" "$MNT/x") || fail "the mount differs from a plain tar x: $compared"
say "ok: the mount holds exactly what tar x made in a plain directory ($compared entries: kinds, bytes, link targets, modes, mtimes)"
inodes "$MNT/x" >"$S/out/inodes.before"

deadline=$(( $(micros) + 60000000 ))
until compared=$(compare_trees "$S/reference/x" "$SRC/x" 2>&1); do
    (( $(micros) < deadline )) || fail "the source did not come to hold the tree within 60 s: $compared"
    sleep 0.5
done
say "ok: the source holds the same tree once the write-back is done ($compared entries)"

inodes "$MNT/x" >"$S/out/inodes.uploaded"
cmp -s "$S/out/inodes.before" "$S/out/inodes.uploaded" \
    || fail "st_ino changed with the write-back: $(diff "$S/out/inodes.before" "$S/out/inodes.uploaded" | head -4)"
[[ $(cut -d' ' -f1 "$S/out/inodes.before" | sort | uniq -d | wc -l) -eq 0 ]] \
    || fail "two items share an st_ino: $(cut -d' ' -f1 "$S/out/inodes.before" | sort | uniq -d | head -3)"
say "ok: every item kept its st_ino through the write-back, and no two share one"

timeout -k 2 30 "$PROVIDERFS" unmount "$MNT" >/dev/null || fail "unmount failed"
mount_source
inodes "$MNT/x" >"$S/out/inodes.remounted"
cmp -s "$S/out/inodes.before" "$S/out/inodes.remounted" \
    || fail "st_ino changed across a remount: $(diff "$S/out/inodes.before" "$S/out/inodes.remounted" | head -4)"
compared=$(compare_trees "$S/reference/x" "$MNT/x") || fail "after a remount the mount differs: $compared"
say "ok: after a remount with the same cache, the same tree with the same st_ino for every item"

# Hard links: refused with EPERM (documented), each reported by tar; everything else extracted.
mkdir -p "$S/hard"
printf 'linked\n' >"$S/hard/one"
ln "$S/hard/one" "$S/hard/two"
tar cf "$S/hard.tar" -C "$S" hard
mkdir "$MNT/h"
set +e
tar xf "$S/hard.tar" -C "$MNT/h" 2>"$S/out/hard.err"
status=$?
set -e
[[ $status -eq 2 ]] || fail "tar x of hard links exited $status, expected 2 (link(2) refused)"
grep -q "Operation not permitted" "$S/out/hard.err" || fail "tar did not report EPERM: $(cat "$S/out/hard.err")"
[[ "$(cat "$MNT/h/hard/one")" == linked ]] || fail "the first name of the hard-linked file was not extracted"
say "ok: hard links are refused with EPERM and tar says so (exit 2); the file itself is extracted"
scenario_done
