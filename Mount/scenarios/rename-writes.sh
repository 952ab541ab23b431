#!/usr/bin/env bash
# Writes and renames through a writable mount in quick succession (D-371, D-372): 30 times "write
# a.txt, rename it to cN" (the name a.txt reused every time), an editor's save (write doc.tmp,
# rename it over doc.txt) 10 times, and a writer whose file is renamed while it is open (a rotated
# log). Every file must have its own bytes at the mount at once and at the provider once the
# write-back is done; nothing may be left under an old name and no conflict copy may appear.
#
source "$(dirname "$0")/lib.sh"
scenario_start

printf 'old\n' >"$SRC/a.txt"
mount_source

python3 - "$MNT" "$SRC" >"$S/out/renames.out" 2>&1 <<'PY' || fail "the renames failed: $(cat "$S/out/renames.out")"
import os, sys, time
mnt, src = sys.argv[1], sys.argv[2]
for i in range(30):
    with open(mnt + "/a.txt", "w") as f:
        f.write("version %d\n" % i)
    os.rename(mnt + "/a.txt", mnt + "/c%d.txt" % i)
for i in range(10):
    with open(mnt + "/doc.tmp", "w") as f:
        f.write("doc %d\n" % i)
    os.rename(mnt + "/doc.tmp", mnt + "/doc.txt")
fd = os.open(mnt + "/app.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"before the rotation\n")
os.rename(mnt + "/app.log", mnt + "/app.log.1")
os.write(fd, b"after the rotation\n")
os.close(fd)
expected = {"c%d.txt" % i: "version %d\n" % i for i in range(30)}
expected["doc.txt"] = "doc 9\n"
expected["app.log.1"] = "before the rotation\nafter the rotation\n"
def wrong(root):
    names = set(os.listdir(root))
    bad = sorted(n for n in expected if n not in names or open(root + "/" + n).read() != expected[n])
    extra = sorted(names - set(expected))
    return bad, extra
bad, extra = wrong(mnt)
if bad or extra:
    print("at the mount: wrong %s, extra %s" % (bad, extra)); sys.exit(1)
deadline = time.time() + 30
while time.time() < deadline and wrong(src) != ([], []):
    time.sleep(0.05)
bad, extra = wrong(src)
if bad or extra:
    print("at the provider: wrong %s, extra %s" % (bad, extra)); sys.exit(1)
print("ok")
PY
say "ok: 30 write-then-rename, 10 editor saves and a rotated open log: every file has its bytes at the mount and the provider, nothing else is there"
scenario_done
