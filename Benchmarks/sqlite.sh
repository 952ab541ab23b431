#!/usr/bin/env bash
# Benchmarks SQLiteStore against raw SQLite on this machine (issue 3, "Performance"):
#   - raw_sqlite.c: the same work through the C API (prepared statements, no wrapper): the baseline;
#   - sqlite-bench (Swift, -c release): the same work through SQLiteStore;
#   - the sqlite3 command-line tool: lookups and inserts as SQL text (it parses every statement).
# Prints, per measurement, the median of REPETITIONS runs as wall-clock ops/s and as ops per
# CPU-second, and SQLiteStore / raw C ratios of both. On a busy shared machine compare the CPU
# ratio: wall time there mostly measures how much of a core the scheduler gave each process.
# Not a test: numbers depend on the machine. Usage: Benchmarks/sqlite.sh [rows] [lookups] [repetitions]
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS="${1:-100000}"
LOOKUPS="${2:-200000}"
REPETITIONS="${3:-5}"

work="$(mktemp -d /tmp/sqlite-bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT

echo "== building (release)" >&2
cc -O2 -o "$work/raw_sqlite" Benchmarks/raw_sqlite.c -lsqlite3 -lpthread
swift build -c release --product sqlite-bench >&2
bench="$(swift build -c release --show-bin-path)/sqlite-bench"

echo "== raw C API" >&2
"$work/raw_sqlite" "$work" "$ROWS" "$LOOKUPS" "$REPETITIONS" >"$work/raw.txt"
echo "== SQLiteStore" >&2
"$bench" "$work" "$ROWS" "$LOOKUPS" "$REPETITIONS" >"$work/swift.txt"

echo "== sqlite3 CLI" >&2
seconds() { date +%s.%N; }
cli_median() { # name operations sql-file database: wall and CPU (user+sys of sqlite3) medians
    local rates=() cpu_rates=()
    for _ in $(seq "$REPETITIONS"); do
        local start end cpu
        start=$(seconds)
        cpu=$( { TIMEFORMAT='%U %S'; time sqlite3 "$4" <"$3" >/dev/null; } 2>&1 | tail -1)
        end=$(seconds)
        rates+=("$(echo "$2 / ($end - $start)" | bc -l)")
        cpu_rates+=("$(echo "$cpu" | awk -v n="$2" '{ t = $1 + $2; if (t <= 0) t = 0.01; printf "%f", n / t }')")
    done
    local wall_median cpu_median
    wall_median=$(printf '%s\n' "${rates[@]}" | sort -g | awk '{ v[NR] = $1 } END { printf "%d", v[int(NR / 2) + 1] }')
    cpu_median=$(printf '%s\n' "${cpu_rates[@]}" | sort -g | awk '{ v[NR] = $1 } END { printf "%d", v[int(NR / 2) + 1] }')
    echo "$1 $wall_median $cpu_median"
}
cli_db="$work/cli.db"
sqlite3 "$cli_db" "PRAGMA journal_mode=WAL; CREATE TABLE kv (id INTEGER PRIMARY KEY, value TEXT NOT NULL, size INTEGER NOT NULL);" >/dev/null
awk -v rows="$ROWS" 'BEGIN { print "PRAGMA synchronous=NORMAL; BEGIN IMMEDIATE; DELETE FROM kv;";
    for (i = 1; i <= rows; i++) printf "INSERT INTO kv (id, value, size) VALUES (%d, %citem-%d-abcdefghijklmnop%c, %d);\n", i, 39, i, 39, i * 3;
    print "COMMIT;" }' >"$work/insert.sql"
awk -v rows="$ROWS" -v lookups="$LOOKUPS" 'BEGIN {
    for (i = 0; i < lookups; i++) printf "SELECT id, value, size FROM kv WHERE id = %d;\n", (i * 7919) % rows + 1 }' >"$work/lookup.sql"
{
    cli_median insert_one_transaction "$ROWS" "$work/insert.sql" "$cli_db"
    cli_median lookup_read_per_lookup "$LOOKUPS" "$work/lookup.sql" "$cli_db"
} >"$work/cli.txt"

field() { awk -v n="$1" -v f="$2" '$1 == n { print $f }' "$3"; }
ratio() { if [[ -n "$1" && -n "$2" ]]; then echo "scale=2; $1 / $2" | bc -l | sed 's/^\./0./'; else echo -; fi; }

echo
echo "rows=$ROWS lookups=$LOOKUPS repetitions=$REPETITIONS; medians; $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-30s %10s %10s %10s %10s %10s %10s %8s %8s\n' "" "raw C" "" "Store" "" "CLI" "" "Store/raw" ""
printf '%-30s %10s %10s %10s %10s %10s %10s %8s %8s\n' measurement "wall/s" "cpu/s" "wall/s" "cpu/s" "wall/s" "cpu/s" wall cpu
for name in insert_one_transaction lookup_read_per_lookup lookup_batched_1000 lookup_async_read_per_lookup lookup_while_writing; do
    base="$name"
    # The async variant has no C twin; compare it with the synchronous raw lookup.
    [[ "$name" == lookup_async_read_per_lookup ]] && base=lookup_read_per_lookup
    raw_wall=$(field "$base" 2 "$work/raw.txt"); raw_cpu=$(field "$base" 3 "$work/raw.txt")
    store_wall=$(field "$name" 2 "$work/swift.txt"); store_cpu=$(field "$name" 3 "$work/swift.txt")
    cli_wall=$(field "$name" 2 "$work/cli.txt"); cli_cpu=$(field "$name" 3 "$work/cli.txt")
    cpu_ratio=$(ratio "$store_cpu" "$raw_cpu")
    # With a second thread writing, process CPU time includes the writer: only wall time compares.
    [[ "$name" == lookup_while_writing ]] && cpu_ratio="n/a"
    printf '%-30s %10s %10s %10s %10s %10s %10s %8s %8s\n' "$name" "${raw_wall:--}" "${raw_cpu:--}" \
        "${store_wall:--}" "${store_cpu:--}" "${cli_wall:--}" "${cli_cpu:--}" "$(ratio "$store_wall" "$raw_wall")" "$cpu_ratio"
done
