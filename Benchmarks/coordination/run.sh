#!/usr/bin/env bash
# Coordination benchmark (a measurement, not a timed test). Prints medians of:
#   1. uncontended claim+release in one process: the arbiter behind its lock (what the mount's
#      in-process claims cost) and the whole FileCoordinator call (URL checks, path resolution);
#   2. uncontended claim+release across processes: coordination-probe <-> `providerfs coordinator`;
#   3. claims/s with 8 concurrent reader processes on one file;
#   4. for scale, a bare C ping-pong over a Unix socketpair (pingpong.c), measured in the same
#      rounds, interleaved: on a loaded machine the ratio cross-process / ping-pong means more
#      than either number alone.
# Targets (issue 2): <= 2 us in-process, <= 50 us across processes.
# Environment: ROUNDS (default 5), COUNT (claims per round, default 20000), READERS=0 skips 3,
# BIN=DIR uses the coordination-probe and providerfs already built in DIR (for A/B comparisons).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/opt/swift/usr/bin:$PATH"

if [[ -z "${BIN:-}" ]]; then
    swift build -c release --product coordination-probe -Xswiftc -warnings-as-errors >/dev/null
    swift build -c release --product providerfs -Xswiftc -warnings-as-errors >/dev/null
    BIN="$(swift build -c release -Xswiftc -warnings-as-errors --show-bin-path)"
fi
ROUNDS="${ROUNDS:-5}"
COUNT="${COUNT:-20000}"
READERS="${READERS:-1}"

WORK="$(mktemp -d /tmp/pfs-bench-XXXXXX)"
cc -O2 -o "$WORK/pingpong" Benchmarks/coordination/pingpong.c
export PROVIDERFS_RUNTIME_DIR="$WORK/run" PROVIDERFS_COORDINATOR="$BIN/providerfs"
mkdir -p "$WORK/files"
FILE="$WORK/files/doc"
"$BIN/providerfs" coordinator >"$WORK/server.log" 2>&1 &
SERVER=$!
cleanup() {
    kill -TERM "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 500); do [[ -S "$PROVIDERFS_RUNTIME_DIR/coordinator.sock" ]] && break; sleep 0.01; done

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

arbiter=(); coordinator=(); remote=(); readers=(); pingpong=(); heldRead=(); heldWrite=()
for _ in $(seq "$ROUNDS"); do
    pingpong+=("$("$WORK/pingpong" "$COUNT" | awk '/^median_ns/ { print $2 }')")
    out="$("$BIN/coordination-probe" bench-local "$COUNT" "$FILE")"
    arbiter+=("$(awk '/^arbiter_median_ns/ { print $2 }' <<<"$out")")
    coordinator+=("$(awk '/^coordinator_median_ns/ { print $2 }' <<<"$out")")
    # With 1,000 read claims held on other files (a mount with 1,000 open files): a read claim
    # looks only at writers; a write claim still looks at every claim (fewer rounds: it is slow).
    out="$("$BIN/coordination-probe" bench-local "$((COUNT / 20))" "$FILE" 1000)"
    heldRead+=("$(awk '/^arbiter_read_median_ns/ { print $2 }' <<<"$out")")
    heldWrite+=("$(awk '/^arbiter_median_ns/ { print $2 }' <<<"$out")")
    out="$("$BIN/coordination-probe" bench-claims "$COUNT" "$FILE")"
    remote+=("$(awk '/^median_ns/ { print $2 }' <<<"$out")")
    [[ "$READERS" == 0 ]] && continue
    per=$((COUNT / 4))
    start=$(date +%s%N)
    pids=()
    for i in $(seq 8); do
        "$BIN/coordination-probe" bench-claims "$per" "$FILE" --read >"$WORK/reader.$i" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    end=$(date +%s%N)
    readers+=("$(awk -v n=$((per * 8)) -v ns=$((end - start)) 'BEGIN { printf "%d", n / (ns / 1e9) }')")
done

printf 'load average: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
printf 'in-process claim+release, arbiter host (median of %s rounds x %s): %s ns\n' "$ROUNDS" "$COUNT" \
    "$(printf '%s\n' "${arbiter[@]}" | median)"
printf 'in-process claim+release, FileCoordinator.coordinate:                 %s ns\n' \
    "$(printf '%s\n' "${coordinator[@]}" | median)"
printf 'in-process, arbiter host, 1,000 read claims held: read claim          %s ns\n' \
    "$(printf '%s\n' "${heldRead[@]}" | median)"
printf 'in-process, arbiter host, 1,000 read claims held: write claim         %s ns\n' \
    "$(printf '%s\n' "${heldWrite[@]}" | median)"
printf 'cross-process claim+release (probe <-> providerfs coordinator):       %s ns\n' \
    "$(printf '%s\n' "${remote[@]}" | median)"
if [[ "$READERS" != 0 ]]; then
    printf '8 concurrent reader processes, total claims/s:                        %s\n' \
        "$(printf '%s\n' "${readers[@]}" | median)"
fi
printf 'reference: C socketpair ping-pong between two processes:              %s ns\n' \
    "$(printf '%s\n' "${pingpong[@]}" | median)"
printf 'per round (ns): cross-process %s | ping-pong %s\n' "${remote[*]}" "${pingpong[*]}"
