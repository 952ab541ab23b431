#!/usr/bin/env bash
# A slow provider (2 MiB/s). Nothing fails: readers get every byte, the item shows `downloading`
# with growing progress while it comes in, and `providerfs download` draws a progress bar.
# A slow but progressing download never hits the stall deadline (here 1 s).
source "$(dirname "$0")/lib.sh"
scenario_start

make_file video.bin 4MiB
make_file song.bin 2MiB
mount_source --stall-timeout 1s
providerfs fault add "$MNT" --slow 2MiB/s --times 0   # the whole provider, until cleared

# A reader in the background; meanwhile the item shows its progress.
file="$MNT/song.bin"
in_background cat "$file" >"$S/out/song" 2>"$S/out/song.err"
reader=$!
seen=""
for _ in $(seq 50); do
    state="$(xattr "$file" state || true)"
    [[ "$state" == downloading ]] && seen="$seen $(xattr "$file" progress)"
    kill -0 "$reader" 2>/dev/null || break
    sleep 0.1
done
wait_for_pid "$reader" 20 || fail "cat of a slow item did not finish within 20 s"
wait "$reader" || fail "cat of a slow item failed: $(cat "$S/out/song.err")"
cmp -s "$S/out/song" "$SRC/song.bin" || fail "cat of a slow item delivered wrong bytes"
[[ $(wc -w <<<"$seen") -ge 2 ]] || fail "user.providerfs.state was 'downloading' in fewer than 2 samples:$seen"
say "ok: cat of song.bin correct; while it ran, state downloading with progress$seen"
expect_state "$file" materialized

# `providerfs download` on a terminal draws a bar (\r-updated); `script` gives it a terminal.
started="$EPOCHREALTIME"
timeout 20 script -qec "$PROVIDERFS download $(printf %q "$MNT/video.bin")" /dev/null >"$S/out/bar" \
    || fail "providerfs download failed: $(tr '\r' '\n' <"$S/out/bar" | tail -n 2)"
took="$(elapsed_since "$started")"
updates="$(tr '\r' '\n' <"$S/out/bar" | grep -c '%')"
[[ $updates -ge 3 ]] || fail "providerfs download drew $updates progress updates: $(tr '\r' '\n' <"$S/out/bar")"
(( $(seconds_to_micros "$took") >= 1200000 )) \
    || fail "4 MiB at 2 MiB/s took only $took s: the --slow fault did not apply"
say "ok: providerfs download drew $updates progress updates in $took s: $(tr '\r' '\n' <"$S/out/bar" | grep '%' | tail -n 1)"
expect_state "$MNT/video.bin" materialized
expect_content dd "$MNT/video.bin"

providerfs fault clear --all "$MNT"
scenario_done
