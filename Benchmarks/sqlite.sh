#!/usr/bin/env bash
# Benchmarks SQLiteStore against raw SQLite on this machine (issue 3, "Performance"):
#   - raw_sqlite.c: the same work through the C API (prepared statements, no wrapper): the baseline;
#   - sqlite-bench (Swift, -c release): the same work through SQLiteStore;
#   - the sqlite3 command-line tool: lookups and inserts as SQL text (it parses every statement).
# Prints ops/s (median of REPETITIONS runs) and SQLiteStore / raw C ratios. Not a test: numbers
# depend on the machine. Usage: Benchmarks/sqlite.sh [rows] [lookups] [repetitions]
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
cli_median() { # name operations sql-file database
    local rates=()
    for _ in $(seq "$REPETITIONS"); do
        local start end
        start=$(seconds)
        sqlite3 "$4" <"$3" >/dev/null
        end=$(seconds)
        rates+=("$(echo "$2 / ($end - $start)" | bc -l)")
    done
    printf '%s\n' "${rates[@]}" | sort -g | awk -v name="$1" '{ v[NR] = $1 } END { printf "%s %d\n", name, v[int(NR / 2) + 1] }'
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

echo
echo "rows=$ROWS lookups=$LOOKUPS repetitions=$REPETITIONS (median ops/s; $(nproc) cores)"
printf '%-30s %14s %14s %14s %12s\n' measurement "raw C" SQLiteStore "sqlite3 CLI" "Store/raw C"
for name in insert_one_transaction lookup_read_per_lookup lookup_batched_1000 lookup_async_read_per_lookup lookup_while_writing; do
    raw=$(awk -v n="$name" '$1 == n { print $2 }' "$work/raw.txt")
    store=$(awk -v n="$name" '$1 == n { print $2 }' "$work/swift.txt")
    cli=$(awk -v n="$name" '$1 == n { print $2 }' "$work/cli.txt")
    base="$raw"
    # The async variant has no C twin; compare it with the synchronous raw lookup.
    [[ "$name" == lookup_async_read_per_lookup ]] && base=$(awk '$1 == "lookup_read_per_lookup" { print $2 }' "$work/raw.txt")
    ratio=$(echo "scale=2; ${store:-0} / ${base:-1}" | bc -l)
    printf '%-30s %14s %14s %14s %12s\n' "$name" "${raw:--}" "${store:--}" "${cli:--}" "$ratio"
done
