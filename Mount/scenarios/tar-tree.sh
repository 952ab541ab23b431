#!/usr/bin/env bash
# scenario-providers: local (symbolic and hard links are most of what it checks: WebDAV has none (EPERM))
# tar x of a real-looking source tree through a writable mount (issue 23): about 3,000 entries with
# symbolic links (relative, absolute, dangling, to directories, placed before the files tar writes
# after them, so tar's placeholder check of st_ino runs), empty files, a deep path, odd names and
# explicit modes and times. tar must exit 0, and the mount and (once the write-back is done) the
# source must hold exactly what the same tar x made in a plain directory: kinds, bytes, link
# targets, modes, mtimes. Every item keeps its st_ino through the write-back and a remount (D-389).
# Hard links (D-396): groups of names in one directory and across directories (an empty file, a
# read-only one, one with an old mtime, one per source directory) come out as the plain tar x makes
# them, at the mount and at the source: the same names share one st_ino, with the same st_nlink.
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
# Hard links: tar archives the first name it meets as the file, the others as links to it.
hard = root + "/hard"
os.makedirs(hard + "/sub")
with open(hard + "/one", "w") as f:
    f.write("linked\n")
os.link(hard + "/one", hard + "/two")
os.utime(hard + "/one", (1_000_000_000, 1_000_000_000))
with open(hard + "/three-a", "wb") as f:
    f.write(os.urandom(100_000))
os.link(hard + "/three-a", hard + "/sub/three-b")
os.link(hard + "/three-a", root + "/z/three-c")  # archived first (z comes before hard)
open(hard + "/empty", "w").close()
os.link(hard + "/empty", hard + "/sub/empty-too")
with open(hard + "/ro", "w") as f:
    f.write("read only\n")
os.chmod(hard + "/ro", 0o444)
os.link(hard + "/ro", hard + "/sub/ro-too")
for d in range(60):
    sub = "%s/src/m%02d" % (root, d)
    os.link(sub + "/s3.c", sub + "/copy-of-s3.c")
PY
tar cf "$S/tree.tar" -C "$tree" a z deep odd src hard
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
# The link identity of a tree: every group of names that share an st_ino, with its st_nlink (one
# line per group of more than one name, sorted), and a check that nothing else shares one.
link_groups() {
    python3 - "$1" <<'PY'
import os, sys
root = sys.argv[1]
by_inode = {}
for directory, dirs, files in os.walk(root):
    for name in dirs + files:
        path = os.path.join(directory, name)
        info = os.lstat(path)
        by_inode.setdefault(info.st_ino, []).append((os.path.relpath(path, root), info.st_nlink))
groups = []
for entries in by_inode.values():
    links = {nlink for _, nlink in entries}
    if len(entries) > 1 or links != {1} and not os.path.isdir(os.path.join(root, entries[0][0])):
        if len(links) != 1:
            print("names of one inode disagree on st_nlink: %r" % entries)
            sys.exit(1)
        groups.append("%d %s" % (links.pop(), " ".join(sorted(repr(name) for name, _ in entries))))
for line in sorted(groups):
    print(line)
PY
}

compared=$(compare_trees "$S/reference/x" "$MNT/x") || fail "the mount differs from a plain tar x: $compared"
say "ok: the mount holds exactly what tar x made in a plain directory ($compared entries: kinds, bytes, link targets, modes, mtimes)"
link_groups "$S/reference/x" >"$S/out/groups.reference" || fail "the plain tar x: $(cat "$S/out/groups.reference")"
[[ $(wc -l <"$S/out/groups.reference") -eq 64 ]] \
    || fail "the reference has $(wc -l <"$S/out/groups.reference") hard-link groups, expected 64"
link_groups "$MNT/x" >"$S/out/groups.mount" || fail "the mount: $(cat "$S/out/groups.mount")"
cmp -s "$S/out/groups.reference" "$S/out/groups.mount" \
    || fail "hard links differ from a plain tar x: $(diff "$S/out/groups.reference" "$S/out/groups.mount" | head -4)"
say "ok: the mount has the same 64 hard-link groups as the plain tar x (names by st_ino, st_nlink)"
inodes "$MNT/x" >"$S/out/inodes.before"

deadline=$(( $(micros) + 60000000 ))
until compared=$(compare_trees "$S/reference/x" "$SRC/x" 2>&1); do
    (( $(micros) < deadline )) || fail "the source did not come to hold the tree within 60 s: $compared"
    sleep 0.5
done
say "ok: the source holds the same tree once the write-back is done ($compared entries)"
link_groups "$SRC/x" >"$S/out/groups.source" || fail "the source: $(cat "$S/out/groups.source")"
cmp -s "$S/out/groups.reference" "$S/out/groups.source" \
    || fail "hard links at the source differ: $(diff "$S/out/groups.reference" "$S/out/groups.source" | head -4)"
say "ok: the source has the same hard-link groups (the write-back kept every link)"

inodes "$MNT/x" >"$S/out/inodes.uploaded"
cmp -s "$S/out/inodes.before" "$S/out/inodes.uploaded" \
    || fail "st_ino changed with the write-back: $(diff "$S/out/inodes.before" "$S/out/inodes.uploaded" | head -4)"
link_groups "$MNT/x" >"$S/out/groups.uploaded" || fail "the mount after the write-back: $(cat "$S/out/groups.uploaded")"
cmp -s "$S/out/groups.reference" "$S/out/groups.uploaded" \
    || fail "hard links changed with the write-back: $(diff "$S/out/groups.reference" "$S/out/groups.uploaded" | head -4)"
say "ok: every item kept its st_ino through the write-back; only the names of one file share one"

timeout -k 2 30 "$PROVIDERFS" unmount "$MNT" >/dev/null || fail "unmount failed"
mount_source
inodes "$MNT/x" >"$S/out/inodes.remounted"
cmp -s "$S/out/inodes.before" "$S/out/inodes.remounted" \
    || fail "st_ino changed across a remount: $(diff "$S/out/inodes.before" "$S/out/inodes.remounted" | head -4)"
compared=$(compare_trees "$S/reference/x" "$MNT/x") || fail "after a remount the mount differs: $compared"
link_groups "$MNT/x" >"$S/out/groups.remounted" || fail "after a remount: $(cat "$S/out/groups.remounted")"
cmp -s "$S/out/groups.reference" "$S/out/groups.remounted" \
    || fail "hard links changed across a remount: $(diff "$S/out/groups.reference" "$S/out/groups.remounted" | head -4)"
say "ok: after a remount with the same cache, the same tree, hard links and st_ino for every item"

scenario_done
