#!/usr/bin/env bash
# Claims survive a coordination server crash (D-402, issue 24 item 4): several
# `providerfs coordinate --write DOC -- CMD` writers in loops, each CMD checking that nobody else is
# inside (a marker directory: mkdir fails when another writer is in), while the standalone server
# is killed with SIGKILL every 1–3 s and started again on demand by the clients. Passes with 0
# overlaps, 0 hangs (every coordinate bounded by `timeout`), every exit 0 (76 would be a claim
# reported lost), and progress across the kills. No mount: the standalone server is the subject.
source "$(dirname "$0")/lib.sh"
scenario_start

WRITERS="${WRITERS:-4}"
DURATION="${DURATION:-40}"   # seconds of writing
export PROVIDERFS_COORDINATOR="$PROVIDERFS"   # servers started on demand run the binary under test
export PROVIDERFS_COORDINATOR_IDLE=60s
DOC="$S/doc"
touch "$DOC"

# The running server's pid, only while it is this scenario's `providerfs coordinator`.
server_pid() {
    local pid
    pid="$(cat "$PROVIDERFS_RUNTIME_DIR/coordinator.pid" 2>/dev/null)" || return 1
    [[ -n "$pid" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "coordinator" \
        && grep -qz "PROVIDERFS_RUNTIME_DIR=$PROVIDERFS_RUNTIME_DIR" "/proc/$pid/environ" 2>/dev/null \
        && echo "$pid"
}
# On every exit: the writers' `coordinate` processes (a killed writer loop leaves its child running)
# and any server, found by this scenario's runtime directory in their environment, killed by pid.
stop_all() {
    local dir pid killed=() _
    for dir in /proc/[0-9]*; do
        pid="${dir#/proc/}"
        [[ "$pid" != "$$" && "$pid" != "$BASHPID" ]] || continue
        if grep -qz "^PROVIDERFS_RUNTIME_DIR=$PROVIDERFS_RUNTIME_DIR\$" "$dir/environ" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null && killed+=("$pid")
        fi
    done
    # Gone before the temp dir is removed (a dying writer could still create files in it).
    for pid in "${killed[@]}"; do
        for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.01; done
    done
    return 0
}
trap 'status=$?; trap - ERR; set +e; stop_all; (exit $status); scenario_cleanup' EXIT

# One writer: coordinate in a loop until the end time; CMD enters the marker, stays a little,
# leaves. Each outcome is one line in $S/out/writer.N: "ok", "overlap", "exit N", "hang".
writer() {
    local n="$1" end="$2" status
    while (( $(micros) < end )); do
        set +e
        timeout -k 5 40 "$PROVIDERFS" coordinate --write "$DOC" --timeout 30s -- sh -c '
            if ! mkdir "$0/inside" 2>/dev/null; then echo overlap; exit 0; fi
            echo "$1" >>"$0/doc"; sleep 0.$(( $$ % 4 + 1 )); rmdir "$0/inside"; echo ok' "$S" "$n" \
            >>"$S/out/writer.$n" 2>>"$S/out/writer.$n.err"
        status=$?
        set -e
        case $status in
            0) ;;
            124|137) echo hang >>"$S/out/writer.$n" ;;
            *) echo "exit $status" >>"$S/out/writer.$n" ;;
        esac
    done
}

end=$(( $(micros) + DURATION * 1000000 ))
for n in $(seq "$WRITERS"); do
    writer "$n" "$end" &
    BACKGROUND+=("$!")
done
say "$WRITERS writers on $DOC for ${DURATION}s"

kills=0
while (( $(micros) < end )); do
    sleep "$(( RANDOM % 3 + 1 )).$(( RANDOM % 10 ))"
    if pid="$(server_pid)"; then
        kill -KILL "$pid" && kills=$((kills + 1))
    fi
done
for pid in "${BACKGROUND[@]}"; do wait "$pid"; done
BACKGROUND=()

cat "$S"/out/writer.*.err 2>/dev/null | sort | uniq -c | sed 's/^/    stderr: /' | head -20
ok=$(cat "$S"/out/writer.[0-9]* | grep -c '^ok$' || true)
overlaps=$(cat "$S"/out/writer.[0-9]* | grep -c '^overlap$' || true)
hangs=$(cat "$S"/out/writer.[0-9]* | grep -c '^hang$' || true)
others=$(cat "$S"/out/writer.[0-9]* | grep -c '^exit' || true)
say "server killed $kills times; $ok writes inside the claim, $overlaps overlaps, $hangs hangs, $others other exits"
[[ "$overlaps" -eq 0 ]] || fail "$overlaps writers found another writer inside"
[[ "$hangs" -eq 0 ]] || fail "$hangs coordinate commands hung (killed by timeout)"
[[ "$others" -eq 0 ]] || fail "coordinate exited non-zero: $(cat "$S"/out/writer.[0-9]* | grep '^exit' | sort | uniq -c | tr '\n' ' ')"
[[ "$kills" -ge $(( DURATION / 4 )) ]] || fail "the server was killed only $kills times"
[[ "$ok" -ge $(( kills * 2 )) ]] || fail "too little progress: $ok writes for $kills kills"
[[ "$(wc -l <"$DOC")" -eq "$ok" ]] || fail "$DOC has $(wc -l <"$DOC") lines for $ok writes"
scenario_done
