#!/usr/bin/env bash
# Writes through access paths on a writable mount (issue 14 item 6, D-369): a read-write token's
# path creates and writes files that the plain path and the provider then have; a read token's
# path refuses writes with EACCES; a writer whose token expires with its file open gets EACCES for
# its next write and for its close, and nothing it wrote is published: the file stays the empty
# one its create made, at the mount and at the provider.
source "$(dirname "$0")/lib.sh"
scenario_start

mkdir -p "$SRC/inbox"
printf 'kept\n' >"$SRC/inbox/kept.txt"
mount_source

# wait_for_source FILE TEXT: the provider (the source directory) has TEXT in FILE within 10 s.
wait_for_source() {
    local _
    for _ in $(seq 1000); do [[ "$(cat "$1" 2>/dev/null)" == "$2" ]] && return 0; sleep 0.01; done
    fail "$1 at the provider is not '$2' after 10 s: '$(cat "$1" 2>/dev/null)'"
}

grant_token "$MNT/inbox" --write --ttl 10m
writer_access="$ACCESS" writer_id="$TOKEN_ID"
printf 'hello through a token\n' >"$writer_access/hello.txt" || fail "a write through a read-write token failed"
[[ "$(cat "$MNT/inbox/hello.txt")" == "hello through a token" ]] || fail "the plain path does not read the token's file"
wait_for_source "$SRC/inbox/hello.txt" "hello through a token"
say "ok: a read-write token's path creates and writes; the plain path and the provider have it"

grant_token "$MNT/inbox" --ttl 10m
expect_failure EACCES 5 sh -c "printf x >'$ACCESS/refused.txt'"
expect_failure EACCES 5 sh -c "printf x >>'$ACCESS/kept.txt'"
expect_failure EACCES 5 truncate -s 0 "$ACCESS/kept.txt"
[[ ! -e "$SRC/inbox/refused.txt" && "$(cat "$SRC/inbox/kept.txt")" == kept ]] || fail "a read token changed the provider"
say "ok: a read token's path refuses create, append and truncate with EACCES"

# A writer stopped after its first MiB; the token expires; it goes on.
mkfifo "$S/go"
python3 - "$writer_access/big.bin" "$S/go" >"$S/out/writer.out" 2>&1 <<'PY' &
import errno, os, sys
path, go = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"a" * (1 << 20))
print("WROTE", flush=True)
open(go).read()
for step, call in (("WRITE2", lambda: os.write(fd, b"b" * (1 << 20))), ("FSYNC", lambda: os.fsync(fd)), ("CLOSE", lambda: os.close(fd))):
    try:
        call()
        print(step, "ok", flush=True)
    except OSError as error:
        print(step, errno.errorcode[error.errno], flush=True)
PY
writer=$!
BACKGROUND+=("$writer")
for _ in $(seq 3000); do grep -q WROTE "$S/out/writer.out" && break; sleep 0.01; done
grep -q WROTE "$S/out/writer.out" || fail "the writer did not write its first MiB: $(cat "$S/out/writer.out")"
providerfs token expire "$writer_id" >/dev/null
echo go >"$S/go"
wait "$writer" || fail "the writer failed: $(cat "$S/out/writer.out")"
for expected in "WRITE2 EACCES" "FSYNC EACCES" "CLOSE EACCES"; do
    grep -qx "$expected" "$S/out/writer.out" || fail "expected '$expected' from the writer: $(cat "$S/out/writer.out")"
done
say "ok: after the expiry the writer's next write, fsync and close are EACCES"
[[ "$(stat -c %s "$MNT/inbox/big.bin")" == 0 ]] || fail "the mount shows $(stat -c %s "$MNT/inbox/big.bin") bytes of the expired writer's file"
[[ "$(stat -c %s "$SRC/inbox/big.bin")" == 0 ]] || fail "the provider got $(stat -c %s "$SRC/inbox/big.bin") bytes of the expired writer's file"
expect_token_state "$writer_id" expired
say "ok: nothing the expired writer wrote is published: the file is the empty one its create made"
scenario_done
