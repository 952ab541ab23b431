#!/usr/bin/env bash
# Benchmarks SQLiteStore against raw SQLite on this machine (issue 3, "Performance"):
#   - raw_sqlite.c: the same work through the C API (prepared statements, no wrapper): the baseline;
#   - sqlite-bench (Swift, -c release): the same work through SQLiteStore;
#   - the sqlite3 command-line tool: lookups and inserts as SQL text (it parses every statement).
# What each measurement does, exactly: Benchmarks/README.md. raw_sqlite and sqlite-bench print a
# checksum per measurement (ids, text lengths and last bytes, sizes); the run fails if they differ.
# Prints, per measurement, the median of REPETITIONS runs as wall-clock ops/s and as ops per
# CPU-second, and SQLiteStore / raw C ratios of both. On a busy shared machine compare the CPU
# ratio: wall time there mostly measures how much of a core the scheduler gave each process.
#
# --callgrind also counts instructions (valgrind --tool=callgrind) of each program's measured loop
# for inserts and both lookup forms, once, with CALLGRIND_LOOKUPS lookups (default 20000):
# a ratio that does not depend on machine load. --callgrind-only skips the timed runs.
# Not a test: numbers depend on the machine.
# ROUNDS=n (environment) alternates the raw C and SQLiteStore programs n times: see below.
# Usage: Benchmarks/sqlite.sh [--callgrind|--callgrind-only] [rows] [lookups] [repetitions]
set -euo pipefail
cd "$(dirname "$0")/.."
timed=1 callgrind=0
case "${1:-}" in
    --callgrind) callgrind=1; shift ;;
    --callgrind-only) callgrind=1 timed=0; shift ;;
    -*) echo "usage: Benchmarks/sqlite.sh [--callgrind|--callgrind-only] [rows] [lookups] [repetitions]" >&2; exit 64 ;;
esac
ROWS="${1:-100000}"
LOOKUPS="${2:-200000}"
REPETITIONS="${3:-5}"
CALLGRIND_LOOKUPS="${CALLGRIND_LOOKUPS:-20000}"
ROUNDS="${ROUNDS:-1}"

work="$(mktemp -d /tmp/sqlite-bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT

echo "== building (release)" >&2
cc -O2 -g -o "$work/raw_sqlite" Benchmarks/raw_sqlite.c -lsqlite3 -lpthread
swift build -c release --product sqlite-bench -Xswiftc -warnings-as-errors >&2
bench="$(swift build -c release -Xswiftc -warnings-as-errors --show-bin-path)/sqlite-bench"

field() { awk -v n="$1" -v f="$2" '$1 == n { print $f }' "$3"; }
ratio() { if [[ -n "$1" && -n "$2" ]]; then echo "scale=2; $1 / $2" | bc -l | sed 's/^\./0./'; else echo -; fi; }

if ((callgrind)); then
    # Inclusive instruction counts of the functions holding each measured loop. The insert loop
    # runs once (repetitions = 1) and includes its BEGIN/DELETE/COMMIT in both programs.
    echo "== callgrind (rows=$ROWS, lookups=$CALLGRIND_LOOKUPS)" >&2
    only=insert_one_transaction,lookup_read_per_lookup,lookup_batched_1000,lookup_missing_read_per_lookup
    valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.raw" "$work/raw_sqlite" "$work" "$ROWS" \
        "$CALLGRIND_LOOKUPS" 1 "$only" >/dev/null 2>"$work/valgrind.raw.log" || { cat "$work/valgrind.raw.log" >&2; exit 1; }
    valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.swift" "$bench" "$work" "$ROWS" \
        "$CALLGRIND_LOOKUPS" 1 "$only" >/dev/null 2>"$work/valgrind.swift.log" || { cat "$work/valgrind.swift.log" >&2; exit 1; }
    inclusive() { # callgrind file, function-name regex: the inclusive Ir of the one matching function
        callgrind_annotate --inclusive=yes --threshold=100 --auto=no "$1" |
            awk -v pattern="$2" '!found && sub(/^ *[0-9,]+ \( *[0-9.]+%\) +/, "&") {
                line = $0; sub(/\( *[0-9.]+%\)/, "", line); split(line, f, " ")
                if (f[2] ~ pattern) { gsub(",", "", f[1]); print f[1]; found = 1 }
            }'
    }
    {
        echo
        echo "callgrind: instructions per operation (rows=$ROWS, lookups=$CALLGRIND_LOOKUPS, one run each)"
        printf '%-32s %12s %12s %10s\n' measurement "raw C" "Store" "raw/Store"
        for entry in "insert_one_transaction run_insert_one_transaction runInserts $ROWS" \
            "lookup_read_per_lookup run_lookup_read_per_lookup runPerReadLookups $CALLGRIND_LOOKUPS" \
            "lookup_missing_read_per_lookup run_lookup_missing_read_per_lookup runMissingLookups $CALLGRIND_LOOKUPS" \
            "lookup_batched_1000 run_lookup_batched_1000 runBatchedLookups $CALLGRIND_LOOKUPS"; do
            read -r name c_function swift_function operations <<<"$entry"
            raw_ir=$(inclusive "$work/callgrind.raw" ":${c_function}\$")
            # The function itself (or its specialization, Tf…), not the closures inside it (their mangled
            # names continue after KF).
            swift_ir=$(inclusive "$work/callgrind.swift" "sqlite_bench[0-9]+${swift_function}.*KF(Tf[0-9a-z_]+)?\$")
            printf '%-32s %12s %12s %10s\n' "$name" "$((raw_ir / operations))" "$((swift_ir / operations))" \
                "$(ratio "$raw_ir" "$swift_ir")"
        done
    } >"$work/callgrind.txt"
    ((timed)) || { cat "$work/callgrind.txt"; exit 0; }
fi

# ROUNDS > 1 runs the two programs alternately that many times (raw C first in odd rounds,
# SQLiteStore first in even ones), so that a change in machine load hits both, and reports per
# measurement the median of the rounds' medians.
for round in $(seq "$ROUNDS"); do
    order="raw swift"
    ((round % 2 == 0)) && order="swift raw"
    for program in $order; do
        echo "== round $round/$ROUNDS: $([[ $program == raw ]] && echo raw C API || echo SQLiteStore)" >&2
        if [[ $program == raw ]]; then
            "$work/raw_sqlite" "$work" "$ROWS" "$LOOKUPS" "$REPETITIONS" >"$work/raw.$round.txt"
        else
            "$bench" "$work" "$ROWS" "$LOOKUPS" "$REPETITIONS" >"$work/swift.$round.txt"
        fi
    done
done
# Median over rounds of each field; the checksum (field 4) must be the same in every round.
median_of_rounds() { # prefix output
    cat "$work/$1".*.txt | awk '{ n = $1; count[n]++; wall[n, count[n]] = $2; cpu[n, count[n]] = $3
            if (n in sum && sum[n] != $4) sum[n] = "differs"; else sum[n] = $4; if (!(n in order)) order[n] = ++names }
        function median(a, n, k,   i, j, t, v) { for (i = 1; i <= k; i++) v[i] = a[n, i]
            for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
            return v[int(k / 2) + 1] }
        END { for (n in order) printf "%d %s %d %d %s\n", order[n], n, median(wall, n, count[n]), median(cpu, n, count[n]), sum[n] }' |
        sort -n | cut -d' ' -f2- >"$work/$2"
}
median_of_rounds raw raw.txt
median_of_rounds swift swift.txt

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


# Both programs must have done the same work: the same checksum for every measurement they share.
mismatch=0
while read -r name _ _ raw_checksum; do
    swift_checksum=$(field "$name" 4 "$work/swift.txt")
    if [[ "$swift_checksum" != "$raw_checksum" ]]; then
        echo "checksum mismatch in $name: raw C $raw_checksum, SQLiteStore ${swift_checksum:-missing}" >&2
        mismatch=1
    fi
done <"$work/raw.txt"
((mismatch == 0)) || exit 1

echo
echo "rows=$ROWS lookups=$LOOKUPS repetitions=$REPETITIONS rounds=$ROUNDS; medians; $(nproc) cores;" \
    "load: $(cut -d' ' -f1-3 /proc/loadavg); checksums equal"
printf '%-30s %10s %10s %10s %10s %10s %10s %8s %8s\n' "" "raw C" "" "Store" "" "CLI" "" "Store/raw" ""
printf '%-30s %10s %10s %10s %10s %10s %10s %8s %8s\n' measurement "wall/s" "cpu/s" "wall/s" "cpu/s" "wall/s" "cpu/s" wall cpu
for name in insert_one_transaction lookup_read_per_lookup lookup_missing_read_per_lookup lookup_batched_1000 \
    lookup_async_read_per_lookup lookup_while_writing; do
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
if ((callgrind)); then cat "$work/callgrind.txt"; fi
