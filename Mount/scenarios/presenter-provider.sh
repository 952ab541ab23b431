#!/usr/bin/env bash
# Presenters hear the provider (issue 24 item 5, D-403): `providerfs present` processes on a file
# and on its directory in a mount hear, within 1 s each (2 s over WebDAV, whose changes come by a
# 1 s poll), what is done to the file in the SOURCE
# directory (nothing through the mount): a rewrite (presentedItemDidChange /
# presentedSubitemDidChange), a rename within the directory (presentedItemDidMove /
# presentedSubitemDidMove), a delete (accommodatePresentedItemDeletion /
# accommodatePresentedSubitemDeletion). A write through the mount reaches a presenter through its
# publish claims only, and a rename and a delete through the mount once each, not again when the
# mount sees its own change at the source.
source "$(dirname "$0")/lib.sh"
scenario_start

make_file docs/a.txt 4KiB
make_file docs/b.txt 1KiB
mount_source
ls "$MNT/docs" >/dev/null  # listed once: the mount watches the source directory from then on

# start_presenter NAME PATH: a `providerfs present PATH` writing its events to $S/out/NAME.
start_presenter() {
    in_background "$PROVIDERFS" present "$2" >"$S/out/$1"
    local deadline=$(( $(micros) + 10000000 ))
    until grep -q '"event":"ready"' "$S/out/$1" 2>/dev/null; do
        (( $(micros) < deadline )) || fail "presenter $1 did not say ready within 10 s"
        sleep 0.02
    done
}

# expect_event NAME STARTED PATTERN…: every PATTERN (a fixed string) shows up in presenter NAME's
# output within 1 s of $EPOCHREALTIME STARTED (over WebDAV 2 s: the mount learns of a change at
# the server by its poll, every 1 s here, so an event comes up to one interval later); says how
# long it took.
within_us=1000000
[[ "${SCENARIO_PROVIDER:-local}" != webdav ]] || within_us=2000000
expect_event() {
    local name="$1" started="$2" pattern
    shift 2
    local deadline=$(( $(micros "$started") + within_us ))
    for pattern in "$@"; do
        until grep -qF -- "$pattern" "$S/out/$name"; do
            (( $(micros) < deadline )) \
                || fail "presenter $name did not hear $pattern within $(( within_us / 1000000 )) s: $(cat "$S/out/$name")"
            sleep 0.01
        done
    done
    say "ok: presenter $name heard $* after $(elapsed_since "$started") s"
}

start_presenter file "$MNT/docs/a.txt"
start_presenter dir "$MNT/docs"

# A rewrite in the source.
started="$EPOCHREALTIME"
printf 'rewritten at the source\n' >>"$SRC/docs/a.txt"
expect_event file "$started" '"event":"presentedItemDidChange"'
expect_event dir "$started" "{\"event\":\"presentedSubitemDidChange\",\"path\":\"$MNT/docs/a.txt\"}"
cmp -s "$MNT/docs/a.txt" "$SRC/docs/a.txt" || fail "the mount does not show the rewritten bytes"
say "ok: the mount shows the new bytes"

# A rename in the source (one directory: the local provider sees the same file under a new name).
started="$EPOCHREALTIME"
mv "$SRC/docs/a.txt" "$SRC/docs/a2.txt"
expect_event file "$started" \
    "{\"event\":\"presentedItemDidMove\",\"path\":\"$MNT/docs/a.txt\",\"to\":\"$MNT/docs/a2.txt\"}"
expect_event dir "$started" \
    "{\"event\":\"presentedSubitemDidMove\",\"path\":\"$MNT/docs/a.txt\",\"to\":\"$MNT/docs/a2.txt\"}"

# A delete in the source: the file's presenter (now at the new name) and the directory's hear.
started="$EPOCHREALTIME"
rm "$SRC/docs/a2.txt"
expect_event file "$started" "{\"event\":\"accommodatePresentedItemDeletion\",\"path\":\"$MNT/docs/a2.txt\"}"
expect_event dir "$started" \
    "{\"event\":\"accommodatePresentedSubitemDeletion\",\"path\":\"$MNT/docs/a2.txt\"}"
[[ ! -e "$MNT/docs/a2.txt" ]] || fail "the mount still shows the deleted file"

# A write through the mount: the presenter of b.txt hears didChange from the publish claim; the
# upload's own inotify events at the source must not tell it again.
start_presenter b "$MNT/docs/b.txt"
started="$EPOCHREALTIME"
printf 'appended through the mount\n' >>"$MNT/docs/b.txt"
expect_event b "$started" '"event":"presentedItemDidChange"'
deadline=$(( $(micros) + 10000000 ))
until cmp -s "$MNT/docs/b.txt" "$SRC/docs/b.txt"; do
    (( $(micros) < deadline )) || fail "the write through the mount did not reach the source within 10 s"
    sleep 0.02
done
# The upload's events are seen once a later change in the same directory is (inotify keeps
# order): a marker file's creation reaches the directory presenter, so the mount has refreshed
# past the upload by then.
started="$EPOCHREALTIME"
printf 'marker\n' >"$SRC/docs/marker.txt"
expect_event dir "$started" "{\"event\":\"presentedSubitemDidChange\",\"path\":\"$MNT/docs/marker.txt\"}"
# Every didChange b heard came with a write claim of the mount's (relinquishToWriter before it);
# one the provider's side sent would come alone. (Today a plain write takes two publish claims,
# at flush and at close, each ending with didChange: that count is the write claims' business.)
changes="$(grep -c '"event":"presentedItemDidChange"' "$S/out/b")"
claims="$(grep -c '"event":"relinquishToWriter"' "$S/out/b")"
[[ "$changes" == "$claims" ]] \
    || fail "b heard $changes didChange for $claims write claims: one came from the provider side: $(cat "$S/out/b")"
say "ok: the write through the mount reached the presenter through its claims only ($changes didChange, $claims claims)"

# A rename and a delete through the mount take one claim each: b's presenter hears each once,
# not again when the mount sees them at the source.
started="$EPOCHREALTIME"
mv "$MNT/docs/b.txt" "$MNT/docs/b2.txt"
expect_event b "$started" "{\"event\":\"presentedItemDidMove\",\"path\":\"$MNT/docs/b.txt\",\"to\":\"$MNT/docs/b2.txt\"}"
started="$EPOCHREALTIME"
rm "$MNT/docs/b2.txt"
expect_event b "$started" "{\"event\":\"accommodatePresentedItemDeletion\",\"path\":\"$MNT/docs/b2.txt\"}"
[[ ! -e "$SRC/docs/b2.txt" && ! -e "$SRC/docs/b.txt" ]] || fail "the rename and delete through the mount did not reach the source"
started="$EPOCHREALTIME"
printf 'marker\n' >"$SRC/docs/marker2.txt"
expect_event dir "$started" "{\"event\":\"presentedSubitemDidChange\",\"path\":\"$MNT/docs/marker2.txt\"}"
for event in presentedItemDidMove accommodatePresentedItemDeletion; do
    count="$(grep -c "\"event\":\"$event\"" "$S/out/b")"
    [[ "$count" == 1 ]] || fail "b heard $event $count times: $(cat "$S/out/b")"
done
say "ok: a rename and a delete through the mount reached the presenter once each"

scenario_done
