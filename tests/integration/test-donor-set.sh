#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Bounded donor sets and lazy connections (spread=, issue 14), over TCP on loopback:
# - 4 memservers of 16 slabs, nbdkit with spread=2: only the 2 members of its donor set keep a
#   session from it (the status file lists 2 donors; the first start, with no holders record,
#   asks all 4 what they kept and leaves the 2 others), and 14 MiB written land on them alone;
# - nbdkit stopped and started again: the restart contacts only the donors of the holders
#   record (the others' sessions of the volume stay as the first start left them), reattaches
#   14 chunks and verifies them;
# - writing on past what the members hold makes new members join (the full ones stay for the
#   slabs they hold): 48 MiB written and verified, no write fails, all 4 donors used;
# - idle donors (idle-disconnect=2): the whole device trimmed, the two donors outside the set
#   hold nothing and are disconnected within a few seconds (state=closed; their sessions of
#   the volume detached, the members' live), the holders record drops them, and 16 MiB
#   written again land on the members only and verify.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl

ports=()
for _ in 1 2 3 4; do
	start_memserver 16M 1M
	ports+=("$MEMSERVER_PORT")
done
servers=()
for p in "${ports[@]}"; do servers+=("server=127.0.0.1:$p"); done
status="$tmpdir/status"
plugin_args=("${servers[@]}" size=48M replicas=1 spread=2 volume=donor-set-test lease=60
	     timeout=5 statusfile="$status" idle-disconnect=2)
donors() { grep -c '^donor' "$status"; }
used() { ctl_get "$1" slabs_used; }
# live_sessions PORT: sessions of our volume with live connections on that memserver.
live_sessions() { ctl_status "$1" | grep -c 'volume=donor-set-test .*state=live' || true; }
# sessions_of PORT: its sessions of our volume, as "session-id state" lines.
sessions_of() { ctl_status "$1" | grep 'volume=donor-set-test' | sed 's/^session\.[0-9]*=\([0-9a-f]*\) .*state=\([a-z]*\).*/\1 \2/'; }

start_nbdkit one -- "${plugin_args[@]}"
wait_until 10 "the status file" test -s "$status"
[ "$(donors)" -eq 2 ] || { cat "$status" >&2; fail "spread=2: expected 2 donors connected, status lists $(donors)"; }
members=() others=()
for p in "${ports[@]}"; do
	if [ "$(live_sessions "$p")" -gt 0 ]; then members+=("$p"); else others+=("$p"); fi
done
[ "${#members[@]}" -eq 2 ] || fail "expected 2 memservers with a live session of the volume, have ${#members[@]}"
log "members: ${members[*]}; left at start: ${others[*]}"

fio_args=(--ioengine=nbd --rw=write --bs=64k --iodepth=4 --verify=crc32c --verify_fatal=1
	  --verify_state_save=0 --output-format=json)
# 14 MiB: within what the two members hold before they count as full (an eighth of each is
# kept back while a replacement connects), so nothing may land elsewhere.
timeout 60 fio --name=first --do_verify=0 "${fio_args[@]}" --size=14M --uri="$NBDKIT_URI" \
	>"$tmpdir/fio1.json" || { cat "$tmpdir/fio1.json" >&2; fail "fio (first 14 MiB) failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio1.json" 0 $((14 << 20)) || fail "fio (first 14 MiB): see above"
for p in "${others[@]}"; do
	[ "$(used "$p")" -eq 0 ] || fail "memserver $p outside the set holds $(used "$p") slabs"
done
[ "$(( $(used "${members[0]}") + $(used "${members[1]}") ))" -eq 14 ] || fail "expected 14 slabs on the members"

# A clean stop, then a restart: it contacts the record's donors only.
holders=$(ls "$STATE_DIRECTORY"/volume.key.*.holders)
log "holders record: $(cat "$holders")"
for p in "${others[@]}"; do
	grep -q "127.0.0.1:$p" "$holders" && fail "the holders record names $p, which holds nothing"
done
declare -A left
for p in "${others[@]}"; do left[$p]=$(sessions_of "$p"); done
kill -TERM "$NBDKIT_PID"
wait_until 30 "nbdkit to exit" bash -c "! kill -0 $NBDKIT_PID"
start_nbdkit two -- "${plugin_args[@]}"
wait_until 10 "the status file" grep -q '^reattached=14$' "$status"
[ "$(donors)" -eq 2 ] || { cat "$status" >&2; fail "after the restart: expected 2 donors, status lists $(donors)"; }
for p in "${others[@]}"; do
	[ "$(sessions_of "$p")" = "${left[$p]}" ] ||
		fail "memserver $p (not in the record) was contacted by the restart: ${left[$p]} -> $(sessions_of "$p")"
done
timeout 60 fio --name=first --verify_only "${fio_args[@]}" --size=14M --uri="$NBDKIT_URI" \
	>"$tmpdir/fio2.json" || { cat "$tmpdir/fio2.json" >&2; fail "verify after the restart failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio2.json" 0 0 || fail "verify after the restart: see above"

# The whole device: 48 slabs, more than the two members hold: new members join.
timeout 120 fio --name=all "${fio_args[@]}" --size=48M --uri="$NBDKIT_URI" \
	>"$tmpdir/fio3.json" || { cat "$tmpdir/fio3.json" >&2; cat "$NBDKIT_LOG" >&2; fail "fio (48 MiB) failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio3.json" 0 $((48 << 20)) || fail "fio (48 MiB): see above"
total=0
for p in "${ports[@]}"; do total=$((total + $(used "$p"))); done
[ "$total" -eq 48 ] || fail "expected 48 slabs used in all, have $total"
# (The status file is written every second.)
four_donors() { [ "$(donors)" -eq 4 ]; }
wait_until 5 "all 4 donors connected once the first members filled (status file)" four_donors

# Idle donors: everything trimmed, so no donor holds anything of the volume; the two outside
# the set are closed after 2 s idle (the membership looks every 2 s), the members stay.
nbdsh_run -u "$NBDKIT_URI" -c 'h.trim(48 << 20, 0); h.flush()'
for p in "${ports[@]}"; do
	wait_until 10 "memserver $p to hold nothing after the trim" test "$(used "$p")" -eq 0
done
state_count() { grep -c "^donor\.[0-9]*=.* state=$1 " "$status" || true; }
two_closed() { [ "$(state_count closed)" -eq 2 ]; }
wait_until 15 "2 idle donors closed (status file)" two_closed
[ "$(state_count ok)" -eq 2 ] || { cat "$status" >&2; fail "expected the 2 members still connected (state=ok)"; }
closed_ports=() member_ports=()
for p in "${ports[@]}"; do
	if grep -q "^donor\.[0-9]*=127.0.0.1:$p state=closed " "$status"; then closed_ports+=("$p"); else member_ports+=("$p"); fi
done
log "closed: ${closed_ports[*]}; members: ${member_ports[*]}"
for p in "${closed_ports[@]}"; do
	[ "$(live_sessions "$p")" -eq 0 ] || fail "memserver $p was closed but still has a live session of the volume"
done
for p in "${member_ports[@]}"; do
	[ "$(live_sessions "$p")" -eq 1 ] || fail "member $p has no live session of the volume"
done
no_closed_in_record() {
	local p
	for p in "${closed_ports[@]}"; do grep -q "127.0.0.1:$p" "$holders" && return 1; done
	return 0
}
wait_until 5 "the holders record to drop the closed donors" no_closed_in_record
timeout 60 fio --name=again "${fio_args[@]}" --size=16M --uri="$NBDKIT_URI" \
	>"$tmpdir/fio4.json" || { cat "$tmpdir/fio4.json" >&2; fail "fio (16 MiB after the trim) failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio4.json" 0 $((16 << 20)) || fail "fio (16 MiB after the trim): see above"
for p in "${closed_ports[@]}"; do
	[ "$(used "$p")" -eq 0 ] || fail "memserver $p was closed but holds $(used "$p") slabs"
done
log "OK"
