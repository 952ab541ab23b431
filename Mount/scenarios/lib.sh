# Shared helpers for the scenario scripts in this directory. A scenario sources it:
#
#   source "$(dirname "$0")/lib.sh"
#   scenario_start                       # temp dir, cleanup trap (unmount, daemon stopped by pid)
#   make_file report.pdf 4MiB            # a random file in the source (and a reference copy)
#   mount_source --stall-timeout 1s      # providerfs mount --source … with its own cache
#   providerfs fault add "$MNT/report.pdf" --fail-at 2MiB --times 0
#   expect_errno cat "$MNT/report.pdf" EIO 5      # cat fails with EIO within 5 s, prefix correct
#   expect_state "$MNT/report.pdf" error
#   providerfs fault clear "$MNT/report.pdf"
#   expect_content cat "$MNT/report.pdf"          # sha256 equal to the source's
#   scenario_done
#
# Readers: cat, dd (bs=1M) and python (open().read()), each run under `timeout`, so a hang is a
# failure with a clear message, never a stuck CI job. Every helper prints one line per check.
#
# Environment:
#   PROVIDERFS          the providerfs binary (default: `providerfs` on PATH)
#   READER_TIMEOUT      seconds a reader may take before it counts as hung (default 20)
#   SCENARIO_KEEP=1     keep the temp dir (source, cache, daemon log) after the scenario
#   SCENARIO_TRACE=1    trace every command with a timestamp (set -x)
#   SCENARIO_PROVIDER=webdav   mount_source serves $SRC with `rclone serve webdav` on 127.0.0.1
#                       (stopped by its PID at cleanup) and mounts it with --webdav, polling
#                       every second (default: local, --source)
#   SCENARIO_STATE      a file `run` gives: the scenario's temp dir is written to it, and each
#                       daemon's pid to $S/daemon.pids, so that `run` can clean up after a
#                       scenario its timeout killed before the cleanup trap could run
#
# Requires: bash 5, fuse3 (/dev/fuse), getfattr (attr), python3, sha256sum, timeout, cmp.

set -eEuo pipefail

PROVIDERFS="${PROVIDERFS:-providerfs}"
READER_TIMEOUT="${READER_TIMEOUT:-20}"
if [[ "${SCENARIO_TRACE:-}" == "1" ]]; then
    PS4='+ ${EPOCHREALTIME} '
    set -x
fi

# `providerfs …` in a scenario runs the binary under test, so scenarios read like a user's own.
providerfs() { "$PROVIDERFS" "$@"; }

S=""            # the scenario's temp dir
SRC=""          # the source directory (the "remote")
MNT=""          # the mount point
DAEMON_PID=""   # the mount's daemon
FAILED=""       # set once a check failed (and said so)
LAST_FAILURE="" # the last command that failed, for a scenario that set -e ends
BACKGROUND=()   # pids of background readers started with `in_background`
SCENARIO_NAME="$(basename "${0%.sh}")"
SCENARIO_STARTED="$EPOCHREALTIME"

# Tokens in access paths are masked in every line a scenario prints (logs never show a token).
mask_tokens() { sed 's#\.scoped/pfs_[a-z0-9_]*#.scoped/<token>#g'; }
say() { printf '  %s\n' "$*" | mask_tokens; }

fail() {
    trap - ERR
    FAILED=1
    printf 'FAIL (%s): %s\n' "$SCENARIO_NAME" "$*" | mask_tokens >&2
    if [[ -n "$S" && -f "$S/daemon.log" ]]; then
        echo "--- last lines of the daemon log ($S/daemon.log):" >&2
        tail -n 30 "$S/daemon.log" >&2 || true
    fi
    exit 1
}

# ---------------------------------------------------------------------------------------------
# Setup and cleanup

scenario_start() {
    S="$(mktemp -d "/tmp/providerfs-scenario-$SCENARIO_NAME.XXXXXX")"
    SRC="$S/source"
    MNT="$S/mnt"
    mkdir -p "$SRC" "$MNT" "$S/reference" "$S/out"
    # The mount's registry, control socket and log live here, not in the user's runtime dir:
    # every providerfs command of this scenario talks to this scenario's daemon only.
    export PROVIDERFS_RUNTIME_DIR="$S/run"
    trap scenario_cleanup EXIT
    # Remember the last command that failed: when set -e ends the scenario on it (not a check,
    # which says FAIL itself), the cleanup names it.
    trap 'LAST_FAILURE="line $LINENO: \"$BASH_COMMAND\" exited $?"' ERR
    trap 'exit 130' INT
    trap 'exit 143' TERM
    [[ -z "${SCENARIO_STATE:-}" ]] || echo "$S" >"$SCENARIO_STATE"
    echo "== $SCENARIO_NAME ($S)"
}

# Runs on every exit path: readers killed, the mount unmounted, the daemon stopped BY ITS PID
# (never by name), the temp dir removed.
scenario_cleanup() {
    local status=$?
    trap - ERR
    set +e
    if [[ $status -ne 0 && -z "$FAILED" ]]; then
        printf 'FAIL (%s): %s\n' "$SCENARIO_NAME" "${LAST_FAILURE:-exit status $status}" >&2
    fi
    local pid
    for pid in "${BACKGROUND[@]}"; do
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    if [[ -n "$MNT" ]] && grep -qs " $MNT " /proc/self/mounts; then
        timeout -k 2 15 "$PROVIDERFS" unmount "$MNT" --timeout 10s >/dev/null 2>&1 \
            || fusermount3 -uz "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null
    fi
    # Only while that pid is still a providerfs mount daemon (not a reused pid).
    if [[ -n "$DAEMON_PID" ]] && tr '\0' ' ' <"/proc/$DAEMON_PID/cmdline" 2>/dev/null | grep -q "providerfs.* mount "; then
        kill -TERM "$DAEMON_PID" 2>/dev/null
        local _
        for _ in $(seq 50); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$DAEMON_PID" 2>/dev/null
    fi
    if [[ -n "$MNT" ]] && grep -qs " $MNT " /proc/self/mounts; then
        fusermount3 -uz "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null
    fi
    if [[ -n "$S" && "${SCENARIO_KEEP:-}" != "1" ]]; then rm -rf "$S"; fi
    if [[ -n "$S" && "${SCENARIO_KEEP:-}" == "1" ]]; then echo "kept $S" >&2; fi
    exit "$status"
}

# size_bytes 4MiB → 4194304 (also KiB, GiB, plain bytes)
size_bytes() {
    local n="$1"
    case "$n" in
        *GiB) echo $(( ${n%GiB} << 30 )) ;;
        *MiB) echo $(( ${n%MiB} << 20 )) ;;
        *KiB) echo $(( ${n%KiB} << 10 )) ;;
        *) echo $(( n )) ;;
    esac
}

# make_file NAME SIZE: random bytes in the source, and a copy kept as the reference that partial
# output is compared with (the source may change later in a scenario; the reference does not).
make_file() {
    local name="$1" size
    size="$(size_bytes "$2")"
    mkdir -p "$(dirname "$SRC/$name")" "$(dirname "$S/reference/$name")"
    head -c "$size" /dev/urandom >"$SRC/$name"
    cp "$SRC/$name" "$S/reference/$name"
}

# mount_source [MOUNT OPTIONS…]: mounts $SRC at $MNT with its own cache and log, records the
# daemon's pid (printed by `providerfs mount --json`).
mount_source() {
    local out source=(--source "$SRC")
    if [[ "${SCENARIO_PROVIDER:-local}" == webdav ]]; then
        [[ -n "$WEBDAV_URL" ]] || start_webdav_server
        source=(--webdav "$WEBDAV_URL" --poll-interval 1s)
    fi
    out="$(providerfs mount "${source[@]}" "$MNT" --cache "$S/cache" --log "$S/daemon.log" --json "$@")" \
        || fail "providerfs mount failed"
    DAEMON_PID="$(sed -n 's/.*"pid" *: *\([0-9]*\).*/\1/p' <<<"$out")"
    [[ "$DAEMON_PID" =~ ^[0-9]+$ ]] || fail "no daemon pid in: $out"
    echo "$DAEMON_PID" >>"$S/daemon.pids"
    say "mounted $SRC at $MNT (daemon pid $DAEMON_PID${*:+, $*})"
}

# start_webdav_server: `rclone serve webdav` of $SRC on a free port of 127.0.0.1, in the background
# (the cleanup kills it by pid); sets WEBDAV_URL once it accepts connections.
# Again after stop_webdav_server: the same port (the mount's URL), WEBDAV_PID the new server's.
WEBDAV_URL=""
WEBDAV_PORT=""
WEBDAV_PID=""
start_webdav_server() {
    local port="$WEBDAV_PORT"
    [[ -n "$port" ]] \
        || port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    in_background rclone serve webdav --addr "127.0.0.1:$port" --dir-cache-time 0s "$SRC"
    WEBDAV_PID="$!"
    local _
    for _ in $(seq 100); do
        if python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2)" 2>/dev/null; then
            WEBDAV_URL="http://127.0.0.1:$port/"
            WEBDAV_PORT="$port"
            say "serving $SRC over WebDAV at $WEBDAV_URL (rclone pid $WEBDAV_PID)"
            return 0
        fi
        sleep 0.1
    done
    fail "rclone serve webdav did not start"
}

# stop_webdav_server: the server started by start_webdav_server (a child of this shell) ends on
# SIGTERM, by its pid, and is waited for; its port refuses connections afterwards.
stop_webdav_server() {
    [[ -n "$WEBDAV_PID" ]] || fail "no WebDAV server to stop"
    kill -TERM "$WEBDAV_PID" 2>/dev/null
    wait "$WEBDAV_PID" 2>/dev/null || true  # 143: ended by the SIGTERM
    say "stopped the WebDAV server (rclone pid $WEBDAV_PID)"
    WEBDAV_PID=""
}

# in_background CMD…: starts CMD in the background; cleanup kills it by pid. $! is its pid. CMD must
# be a program, not a shell function (a function runs in a forked subshell, and killing $! would
# leave its child running): "$PROVIDERFS", not providerfs.
in_background() {
    "$@" &
    BACKGROUND+=("$!")
}

# background_read PATH RESULT: a python reader of PATH in the background (pid in $!, killed by the
# cleanup) that writes "read BYTES" or "errno NAME" to RESULT when it ends.
background_read() {
    in_background python3 -c '
import errno, sys
try:
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    result = f"read {len(data)}"
except OSError as e:
    result = f"errno {errno.errorcode.get(e.errno, e.errno)}"
with open(sys.argv[2], "w") as out:
    out.write(result)
' "$1" "$2"
}

# wait_for_pid PID SECONDS: waits for a process that is not our child (or is), at most SECONDS
wait_for_pid() { timeout "$2" tail -s 0.02 --pid="$1" -f /dev/null; }

# wait_for_progress PATH BYTES [SECONDS]: until at least BYTES of PATH are present (default 10 s);
# sets PRESENT to the bytes present then.
wait_for_progress() {
    local deadline=$(( $(micros) + $(seconds_to_micros "${3:-10}") ))
    while :; do
        PRESENT="$(xattr "$1" progress || echo 0/0)"
        PRESENT="${PRESENT%/*}"
        (( PRESENT >= $2 )) && return 0
        (( $(micros) < deadline )) || fail "$1: only $PRESENT bytes present after ${3:-10} s, waited for $2"
        sleep 0.05
    done
}

scenario_done() {
    local elapsed
    elapsed="$(elapsed_since "$SCENARIO_STARTED")"
    echo "PASS $SCENARIO_NAME (${elapsed} s)"
}

# ---------------------------------------------------------------------------------------------
# Readers

# Times in microseconds from bash itself (starting python for arithmetic costs ~0.5 s on a busy
# machine). elapsed_since STARTED → "1.23" seconds since $EPOCHREALTIME was STARTED.
micros() { local t="${1:-$EPOCHREALTIME}"; echo $(( 10#${t%.*} * 1000000 + 10#${t#*.} )); }
elapsed_since() {
    local us=$(( $(micros) - $(micros "$1") ))
    printf '%d.%02d' $(( us / 1000000 )) $(( us % 1000000 / 10000 ))
}
# seconds_to_micros 1.5 → 1500000
seconds_to_micros() {
    local whole="${1%.*}" fraction=""
    [[ "$1" == *.* ]] && fraction="${1#*.}"
    fraction="${fraction}000000"
    echo $(( 10#${whole:-0} * 1000000 + 10#${fraction:0:6} ))
}

# errno_message EIO → "Input/output error" (what cat and dd print, strerror)
errno_message() {
    case "$1" in
        EIO) echo "Input/output error" ;;
        ETIMEDOUT) echo "Connection timed out" ;;
        ESTALE) echo "Stale file handle" ;;
        ENETUNREACH) echo "Network is unreachable" ;;
        EACCES) echo "Permission denied" ;;
        ENOENT) echo "No such file or directory" ;;
        ENOTCONN) echo "Transport endpoint is not connected" ;;
        ECONNABORTED) echo "Software caused connection abort" ;;
        *) python3 -c 'import errno,os,sys; print(os.strerror(getattr(errno, sys.argv[1])))' "$1" ;;
    esac
}

# read_file READER PATH: reads PATH whole with cat, dd bs=1M or python, under `timeout`.
# Sets READ_STATUS, READ_ERROR (stderr), READ_SECONDS, READ_BYTES and READ_OUT (what it delivered;
# python delivers nothing when read() raises, as in a real program).
read_file() {
    local reader="$1" path="$2" started
    READ_OUT="$S/out/$reader.$(basename "$path")"
    rm -f "$READ_OUT"
    started="$EPOCHREALTIME"
    READ_STATUS=0
    case "$reader" in
        cat) timeout -k 2 "$READER_TIMEOUT" cat "$path" >"$READ_OUT" 2>"$S/out/stderr" || READ_STATUS=$? ;;
        dd) timeout -k 2 "$READER_TIMEOUT" dd if="$path" of="$READ_OUT" bs=1M status=none 2>"$S/out/stderr" \
            || READ_STATUS=$? ;;
        python)
            timeout -k 2 "$READER_TIMEOUT" python3 - "$path" "$READ_OUT" 2>"$S/out/stderr" <<'EOF' || READ_STATUS=$?
import errno, sys
try:
    with open(sys.argv[1], "rb") as f:
        data = f.read()
except OSError as e:
    print(f"OSError errno={errno.errorcode.get(e.errno, e.errno)}: {e.strerror}", file=sys.stderr)
    sys.exit(1)
with open(sys.argv[2], "wb") as out:
    out.write(data)
EOF
            ;;
        *) fail "unknown reader '$reader' (cat, dd or python)" ;;
    esac
    READ_SECONDS="$(elapsed_since "$started")"
    READ_ERROR="$(cat "$S/out/stderr")"
    touch "$READ_OUT"
    READ_BYTES="$(stat -c %s "$READ_OUT")"
    if [[ $READ_STATUS -eq 124 || $READ_STATUS -eq 137 ]]; then
        fail "$reader $path HUNG: killed by timeout after $READER_TIMEOUT s ($READ_BYTES bytes delivered)"
    fi
}

# reference_of PATH: the reference copy of a file in the mount (also through an access path that
# grant_token printed)
reference_of() {
    local access
    for access in "${!ACCESS_ITEM[@]}"; do
        if [[ "$1" == "$access" || "$1" == "$access/"* ]]; then
            echo "$S/reference/${ACCESS_ITEM[$access]}${1#"$access"}"
            return
        fi
    done
    echo "$S/reference/${1#"$MNT"/}"
}

# expect_prefix_correct READER PATH: the bytes the reader got are the start of the reference
# file, and fewer than all of it (a failed read never looks complete).
expect_prefix_correct() {
    local reader="$1" path="$2" reference size
    reference="$(reference_of "$path")"
    size="$(stat -c %s "$reference")"
    if [[ $READ_BYTES -gt 0 ]] && ! cmp -s -n "$READ_BYTES" "$READ_OUT" "$reference"; then
        fail "$reader $path delivered WRONG BYTES: $(cmp -n "$READ_BYTES" "$READ_OUT" "$reference" 2>&1 | head -1)"
    fi
    if [[ $READ_BYTES -ge $size ]]; then
        fail "$reader $path failed but delivered all $size bytes (short data dressed as complete?)"
    fi
}

# expect_errno READER PATH ERRNO [MAX_SECONDS]: the reader fails with ERRNO (cat/dd: its message
# on stderr and a non-zero exit; python: OSError.errno), within MAX_SECONDS, and every byte it got
# before the error is correct.
expect_errno() {
    local reader="$1" path="$2" name="$3" max="${4:-}" message
    message="$(errno_message "$name")"
    read_file "$reader" "$path"
    [[ $READ_STATUS -ne 0 ]] || fail "$reader $path succeeded ($READ_BYTES bytes), expected $name"
    case "$reader" in
        python) [[ "$READ_ERROR" == *"errno=$name:"* ]] \
            || fail "python $path: expected OSError errno $name, got: $READ_ERROR" ;;
        *) [[ "$READ_ERROR" == *": $message"* ]] \
            || fail "$reader $path: expected '$message' ($name), got (exit $READ_STATUS): $READ_ERROR" ;;
    esac
    if [[ -n "$max" ]] && (( $(seconds_to_micros "$READ_SECONDS") > $(seconds_to_micros "$max") )); then
        fail "$reader $path: $name came after $READ_SECONDS s, more than $max s"
    fi
    expect_prefix_correct "$reader" "$path"
    say "ok: $reader → $name ($message), exit $READ_STATUS after $READ_SECONDS s, $READ_BYTES correct bytes before it"
}

# expect_content READER PATH [REFERENCE]: the reader succeeds and its sha256 is the source file's
# (or REFERENCE's).
expect_content() {
    local reader="$1" path="$2" reference="${3:-$SRC/${2#"$MNT"/}}" want got
    read_file "$reader" "$path"
    [[ $READ_STATUS -eq 0 ]] || fail "$reader $path failed (exit $READ_STATUS): $READ_ERROR"
    want="$(sha256sum <"$reference" | cut -d' ' -f1)"
    got="$(sha256sum <"$READ_OUT" | cut -d' ' -f1)"
    [[ "$got" == "$want" ]] || fail "$reader $path: sha256 $got, expected $want ($READ_BYTES bytes)"
    say "ok: $reader → sha256 ${got:0:16}… equal to the source's, $READ_BYTES bytes in $READ_SECONDS s"
}

# ---------------------------------------------------------------------------------------------
# Access tokens (issue 12)

declare -A ACCESS_ITEM=()   # access path → the item's path relative to the mount (reference_of)

# grant_token PATH [GRANT OPTIONS…]: `providerfs token grant PATH … --json`; sets ACCESS (the access
# path) and TOKEN_ID. The token itself is in ACCESS only: never printed by a check.
grant_token() {
    local path="$1" out
    out="$(providerfs token grant "$@" --json)" || fail "providerfs token grant $* failed"
    ACCESS="$(sed -n 's/.*"accessPath":"\([^"]*\)".*/\1/p' <<<"$out")"
    TOKEN_ID="$(sed -n 's/.*"id":"\([0-9a-f]*\)".*/\1/p' <<<"$out")"
    [[ "$ACCESS" == "$MNT/.scoped/"* && -n "$TOKEN_ID" ]] \
        || fail "token grant $*: no access path or id in its output (withheld: it holds the token)"
    ACCESS_ITEM["$ACCESS"]="${path#"$MNT"/}"
    say "granted token $TOKEN_ID on ${path#"$MNT"/}${2:+ (${*:2})}"
}

# token_events ID: the events of token ID in `providerfs token log --json`, oldest first, one per
# line ("grant", "use", "denial expired", …: a denial with its reason).
token_events() {
    local line log event
    log="$(timeout -k 2 10 "$PROVIDERFS" token log "$MNT" --json)" || fail "providerfs token log failed"
    while IFS= read -r line; do
        [[ "$line" == *"\"tokenID\":\"$1\""* && "$line" =~ \"event\":\"([a-zA-Z]+)\" ]] || continue
        event="${BASH_REMATCH[1]}"
        [[ "$line" =~ \"reason\":\"([a-zA-Z]+)\" ]] && event="$event ${BASH_REMATCH[1]}"
        echo "$event"
    done <<<"$log"
}

# expect_token_events ID EVENT…: token ID's log holds each EVENT ("grant", "denial expired", …)
expect_token_events() {
    local id="$1" events wanted
    shift
    events="$(token_events "$id")"
    for wanted in "$@"; do
        grep -qx "$wanted" <<<"$events" \
            || fail "token log of $id has no '$wanted' entry; it has: $(tr '\n' ',' <<<"$events")"
    done
    say "ok: token log of $id has $(printf "'%s' " "$@")(all: $(sort <<<"$events" | uniq -c | awk '{ $1 = $1 "×"; print }' | paste -sd, -))"
}

# expect_token_state ID STATE: `providerfs token list --all` shows token ID as STATE (live shows
# its expiry: "expires …", "no expiry"; ended: "expired …", "revoked …", "used up …")
expect_token_state() {
    local line
    line="$(timeout -k 2 10 "$PROVIDERFS" token list "$MNT" --all | grep "^$1 ")" \
        || fail "token list --all does not show token $1"
    [[ "$line" == *"  $2"* ]] || fail "token list --all shows '$line', expected '$2'"
    say "ok: token list --all: $line"
}

# ---------------------------------------------------------------------------------------------
# State as ordinary tools and `providerfs status` show it

xattr() { getfattr --only-values -n "user.providerfs.$2" "$1" 2>/dev/null; }

# expect_state PATH STATE: user.providerfs.state
expect_state() {
    local got
    got="$(xattr "$1" state)" || fail "getfattr -n user.providerfs.state $1 failed"
    [[ "$got" == "$2" ]] || fail "$1: user.providerfs.state is '$got', expected '$2' (progress $(xattr "$1" progress))"
    say "ok: user.providerfs.state = $got (progress $(xattr "$1" progress))"
}

# expect_error_xattr PATH ERRNO [TEXT]: user.providerfs.error starts with "ERRNO:" (and contains TEXT)
expect_error_xattr() {
    local got
    got="$(xattr "$1" error)" || fail "$1 has no user.providerfs.error (expected $2)"
    [[ "$got" == "$2:"* ]] || fail "$1: user.providerfs.error is '$got', expected $2"
    [[ -z "${3:-}" || "$got" == *"$3"* ]] || fail "$1: user.providerfs.error '$got' does not say '$3'"
    say "ok: user.providerfs.error = $got"
}

expect_no_error_xattr() {
    local got
    if got="$(xattr "$1" error)"; then fail "$1 still has user.providerfs.error = '$got'"; fi
    say "ok: no user.providerfs.error"
}

# status_json: `providerfs status MOUNTPOINT --json`, the daemon's view of the mount
status_json() { timeout -k 2 10 "$PROVIDERFS" status "$MNT" --json; }

# expect_status_error PATH ERRNO [BYTE]: `providerfs status` lists PATH among the errors, with
# ERRNO (and where it happened: at BYTE or after it; a download that starts past the fault's byte,
# for a read-ahead further on, fails where it starts)
expect_status_error() {
    local relative="${1#"$MNT"/}" json got
    json="$(status_json)" || fail "providerfs status $MNT failed"
    got="$(python3 -c '
import json, sys
status = json.loads(sys.argv[1])
for item in status.get("errors", []):
    if item["path"] == sys.argv[2]:
        error = item["error"]
        print(error["errno"], "at byte", error.get("offset"), "-", error["message"])
' "$json" "$relative")"
    [[ "$got" == "$2 "* ]] || fail "providerfs status: expected $relative in errors with $2, got '${got:-nothing}': $json"
    if [[ -n "${3:-}" ]]; then
        local at="${got#"$2 at byte "}"
        at="${at%% *}"
        [[ "$at" =~ ^[0-9]+$ ]] && (( at >= $3 && at < $(stat -c %s "$(reference_of "$1")") )) \
            || fail "providerfs status: expected the error at byte $3 or after it, got '$got'"
    fi
    say "ok: providerfs status lists $relative: $got"
}

# expect_status_clean PATH: `providerfs status` no longer lists PATH among the errors
expect_status_clean() {
    local relative="${1#"$MNT"/}" json
    json="$(status_json)" || fail "providerfs status $MNT failed"
    if python3 -c '
import json, sys
sys.exit(0 if any(i["path"] == sys.argv[2] for i in json.loads(sys.argv[1]).get("errors", [])) else 1)
' "$json" "$relative"; then
        fail "providerfs status still lists $relative in errors: $json"
    fi
    say "ok: providerfs status lists no error for $relative"
}

# expect_failure ERRNO SECONDS CMD…: CMD (ls, stat, …) fails within SECONDS, printing ERRNO's message
expect_failure() {
    local name="$1" max="$2" message started out status=0
    shift 2
    message="$(errno_message "$name")"
    started="$EPOCHREALTIME"
    out="$(timeout -k 1 "$max" "$@" 2>&1 >/dev/null)" || status=$?
    [[ $status -ne 124 && $status -ne 137 ]] || fail "'$*' HUNG: still running after $max s"
    [[ $status -ne 0 ]] || fail "'$*' succeeded, expected $name"
    [[ "$out" == *"$message"* ]] || fail "'$*': expected '$message' ($name), got (exit $status): $out"
    say "ok: '$*' → $name ($message), exit $status after $(elapsed_since "$started") s"
}

# expect_fast SECONDS CMD…: CMD succeeds within SECONDS (e.g. `ls` while another item is stalled)
expect_fast() {
    local max="$1" started elapsed
    shift
    started="$EPOCHREALTIME"
    timeout -k 1 "$max" "$@" >/dev/null || fail "'$*' failed or took more than $max s"
    elapsed="$(elapsed_since "$started")"
    say "ok: '$*' in $elapsed s"
}
