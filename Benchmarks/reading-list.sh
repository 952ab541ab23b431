#!/usr/bin/env bash
# Benchmarks a reading-list import against `cp` + `qpdf --check` of the same file (issue 13:
# "importing a 100 MB PDF from a materialized item: the whole import within 2x of cp + qpdf
# --check of the same file, measured in the same run").
#   Benchmarks/reading-list.sh [SIZE_MIB] [REPETITIONS]      (defaults 100 and 7)
#   Benchmarks/reading-list.sh --many [COUNT] [REPETITIONS]  (defaults 200 and 3)
# --many (issue 28: start-up): COUNT small PDFs (one page, < 1 KiB), each imported by a process of
# its own, against `cp` + `qpdf --check` of each; target <= 2x. Also prints the start-up cost
# (`reading-list --version`, and `list` and `reconcile` of the library the imports made).
# READING_LIST_COMPARE=BINARY (with --many): another reading-list binary (say, one built from main)
# imports the same files in the same rounds, alternating, and gets its own rows: an A/B in one run.
# Builds the release binaries, writes a PDF of SIZE_MIB in a source directory, mounts it with
# providerfs, materializes it, then alternates the two commands REPETITIONS times and prints
# each run and the medians and their ratio. Both read the same materialized item through the
# mount; cp writes to a fresh file, the import to the app's staging file (which it fsyncs,
# validates with libqpdf and moves into its library). Every mount and process it starts is
# cleaned up on exit, by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
MANY=""
if [[ "${1:-}" == "--many" ]]; then
    MANY="${2:-200}"
    REPETITIONS="${3:-3}"
    SIZE_MIB=0
else
    SIZE_MIB="${1:-100}"
    REPETITIONS="${2:-7}"
fi

Scripts/install-deps
echo "== release build" >&2
swift build -c release --product providerfs -Xswiftc -warnings-as-errors >&2
swift build -c release --product reading-list -Xswiftc -warnings-as-errors >&2
bin="$(swift build -c release -Xswiftc -warnings-as-errors --show-bin-path)"

work="$(mktemp -d /tmp/providerfs-bench-reading-list.XXXXXX)"
daemon=""
cleanup() {
    set +e
    if grep -qs " $work/mnt " /proc/self/mounts; then
        "$bin/providerfs" unmount "$work/mnt" --timeout 10s >/dev/null 2>&1 || fusermount3 -uz "$work/mnt"
    fi
    if [[ -n "$daemon" ]] && tr '\0' ' ' <"/proc/$daemon/cmdline" 2>/dev/null | grep -q "providerfs.* mount "; then
        kill -TERM "$daemon"
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$work/src" "$work/mnt"
export PROVIDERFS_RUNTIME_DIR="$work/run"

if [[ -n "$MANY" ]]; then
    mkdir -p "$work/src/many"
    python3 - "$work/src/many" "$MANY" <<'PY'
import sys
directory, count = sys.argv[1], int(sys.argv[2])
for n in range(count):
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>"]
    content = "BT /F1 12 Tf 72 700 Td (document %d) Tj ET" % n
    objects.append("<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += ("%d 0 obj\n%s\nendobj\n" % (i, body)).encode()
    xref = len(out)
    out += ("xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)).encode()
    for offset in offsets:
        out += ("%010d 00000 n \n" % offset).encode()
    out += ("trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)).encode()
    open("%s/d%05d.pdf" % (directory, n), "wb").write(out)
PY
fi
python3 - "$work/src/document.pdf" "$SIZE_MIB" <<'PY'
import sys
path, mib = sys.argv[1], int(sys.argv[2])
pages = 25
padding = max(1, (mib << 20) // pages)
objects = ["<< /Type /Catalog /Pages 2 0 R >>"]
ids = [4 + 2 * i for i in range(pages)]
objects.append("<< /Type /Pages /Kids [%s] /Count %d >>" % (" ".join("%d 0 R" % p for p in ids), pages))
objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
for i in range(pages):
    objects.append("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % (ids[i] + 1))
    content = "BT /F1 24 Tf 72 700 Td (page %d) Tj ET\n%%" % (i + 1) + "x" * padding
    objects.append("<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
out = bytearray(b"%PDF-1.7\n")
offsets = []
for n, body in enumerate(objects, 1):
    offsets.append(len(out))
    out += ("%d 0 obj\n%s\nendobj\n" % (n, body)).encode()
xref = len(out)
out += ("xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)).encode()
for offset in offsets:
    out += ("%010d 00000 n \n" % offset).encode()
out += ("trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)).encode()
open(path, "wb").write(out)
PY
mounted="$("$bin/providerfs" mount --source "$work/src" "$work/mnt" --cache "$work/cache" --json)"
daemon="$(sed -n 's/.*"pid" *: *\([0-9]*\).*/\1/p' <<<"$mounted")"
"$bin/providerfs" download "$work/mnt/document.pdf" >/dev/null
seconds() { local start=$EPOCHREALTIME; "$@" >/dev/null 2>&1 || return 1; python3 -c "print(f'{$EPOCHREALTIME - $start:.3f}')"; }

if [[ -n "$MANY" ]]; then
    "$bin/providerfs" download "$work/mnt/many" >/dev/null
    echo "## reading-list: $MANY small PDFs, one process each, vs cp + qpdf --check of each ($REPETITIONS rounds, alternating)"
    echo
    binaries=("$bin/reading-list")
    [[ -n "${READING_LIST_COMPARE:-}" ]] && binaries+=("$READING_LIST_COMPARE")
    baseline=()
    imports=("" "")
    for run in $(seq "$REPETITIONS"); do
        rm -rf "$work/copies"
        mkdir -p "$work/copies"
        sync
        b="$(seconds sh -c "for f in '$work/mnt/many'/*.pdf; do cp \"\$f\" '$work/copies/' && qpdf --check \"\$f\" || exit 1; done")" \
            || { echo "cp + qpdf --check failed" >&2; exit 1; }
        baseline+=("$b")
        line="round $run: cp + qpdf --check $b s"
        for n in "${!binaries[@]}"; do
            exe="${binaries[$n]}"
            rm -rf "$work/app$n"
            sync
            i="$(seconds sh -c "for f in '$work/mnt/many'/*.pdf; do '$exe' import \"\$f\" --data-dir '$work/app$n' || exit 1; done")" \
                || { echo "an import failed: $("$exe" report --data-dir "$work/app$n" --limit 1)" >&2; exit 1; }
            imported="$("$exe" list --json --data-dir "$work/app$n" | grep -c .)"
            [[ "$imported" -eq "$MANY" ]] || { echo "the library holds $imported documents, not $MANY" >&2; exit 1; }
            imports[n]+=" $i"
            line+=", imports ($exe) $i s"
        done
        echo "$line"
    done
    # The start-up alone, each binary with the library its imports made (4 x 5 runs, alternating).
    startup=("" "")
    for round in 1 2 3 4; do
        for n in "${!binaries[@]}"; do
            exe="${binaries[$n]}"
            v="$(seconds sh -c "for n in 1 2 3 4 5; do '$exe' --version || exit 1; done")"
            l="$(seconds sh -c "for n in 1 2 3 4 5; do '$exe' list --data-dir '$work/app$n' || exit 1; done")"
            r="$(seconds sh -c "for n in 1 2 3 4 5; do '$exe' reconcile --data-dir '$work/app$n' || exit 1; done")"
            startup[n]+=" $v,$l,$r"
        done
    done
    verdict=0
    python3 - "$MANY" "${baseline[*]}" "${binaries[@]}" -- "${imports[@]:0:${#binaries[@]}}" -- \
        "${startup[@]:0:${#binaries[@]}}" <<'PY' || verdict=$?
import statistics, sys
count, baseline = int(sys.argv[1]), [float(x) for x in sys.argv[2].split()]
rest = sys.argv[3:]
first = rest.index("--")
names = rest[:first]
imports = [[float(x) for x in r.split()] for r in rest[first + 1:first + 1 + len(names)]]
startups = rest[first + 2 + len(names):]
b = statistics.median(baseline)
print()
print("| | median, whole round | per file | / (cp + qpdf --check) |")
print("|---|---|---|---|")
print(f"| cp + qpdf --check | {b:.3f} s | {b / count * 1000:.1f} ms | 1.00 |")
ratios = []
for name, rounds in zip(names, imports):
    i = statistics.median(rounds)
    ratios.append(i / b)
    print(f"| reading-list import ({name}) | {i:.3f} s | {i / count * 1000:.1f} ms | {i / b:.2f} |")
for name, row in zip(names, startups):
    samples = [[float(x) for x in s.split(",")] for s in row.split()]
    v, l, r = (statistics.median(column) / 5 * 1000 for column in zip(*samples))
    print(f"| start-up ({name}): --version / list / reconcile of {count} documents, per process | | "
          f"{v:.1f} / {l:.1f} / {r:.1f} ms | |")
print()
ratio = ratios[0]
print(f"import / (cp + qpdf --check) = {ratio:.2f} (target: <= 2.00): {'met' if ratio <= 2.0 else 'MISSED'}")
sys.exit(0 if ratio <= 2.0 else 3)
PY
    [[ $verdict -eq 0 ]] || { echo "reading-list: small imports are more than 2x cp + qpdf --check (issue 28 target)" >&2; exit 1; }
    exit 0
fi
state="$(getfattr --only-values -n user.providerfs.state "$work/mnt/document.pdf")"
[[ "$state" == materialized ]] || { echo "the item is $state, not materialized" >&2; exit 1; }
size="$(stat -c %s "$work/src/document.pdf")"
echo "## reading-list import vs cp + qpdf --check ($size bytes, materialized, $REPETITIONS runs each, alternating)"
echo

baseline=()
imports=()
for run in $(seq "$REPETITIONS"); do
    rm -f "$work/copy.pdf"
    sync
    b="$(seconds sh -c "cp '$work/mnt/document.pdf' '$work/copy.pdf' && qpdf --check '$work/copy.pdf'")" \
        || { echo "cp + qpdf --check failed" >&2; exit 1; }
    i="$(seconds "$bin/reading-list" import "$work/mnt/document.pdf" --data-dir "$work/app")" \
        || { echo "the import failed: $("$bin/reading-list" report --data-dir "$work/app" --limit 1)" >&2; exit 1; }
    baseline+=("$b")
    imports+=("$i")
    echo "run $run: cp + qpdf --check $b s, import $i s"
    # Keep the library from growing across runs.
    for id in $("$bin/reading-list" list --json --data-dir "$work/app" | python3 -c 'import json,sys; [print(json.loads(l)["id"]) for l in sys.stdin if l.strip()]'); do
        "$bin/reading-list" remove "$id" --data-dir "$work/app" >/dev/null
    done
done
verdict=0
python3 - "${baseline[*]}" "${imports[*]}" <<'PY' || verdict=$?
import statistics, sys
baseline = [float(x) for x in sys.argv[1].split()]
imports = [float(x) for x in sys.argv[2].split()]
b, i = statistics.median(baseline), statistics.median(imports)
print()
print("| | median | min | max |")
print("|---|---|---|---|")
print(f"| cp + qpdf --check | {b:.3f} s | {min(baseline):.3f} | {max(baseline):.3f} |")
print(f"| reading-list import | {i:.3f} s | {min(imports):.3f} | {max(imports):.3f} |")
print()
ratio = i / b
print(f"import / (cp + qpdf --check) = {ratio:.2f} (target: <= 2.00): {'met' if ratio <= 2.0 else 'MISSED'}")
sys.exit(0 if ratio <= 2.0 else 3)
PY
"$bin/reading-list" report --data-dir "$work/app" --limit 1 | sed -n '/access/,+1p'
[[ $verdict -eq 0 ]] || { echo "reading-list: the import is more than 2x cp + qpdf --check (issue 13 target)" >&2; exit 1; }
