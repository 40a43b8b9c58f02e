#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Give-back with nowhere to move (a single memserver): only the free slabs are withdrawn; the
# used ones stay, keep their data and go on being served (fio verify and write+verify clean),
# and both the memserver and the volume's status say the moves are pending.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl

start_memserver 64M 1M
port=$MEMSERVER_PORT pid=$MEMSERVER_PID
start_nbdkit one -- server="$MEMSERVER_ADDR" size=32M statusfile="$tmpdir/status"
vol_get() { "$RDMASWAPCTL" status volume="$tmpdir/status" | sed -n "s/^$1=//p"; }

fio_args=(--ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite --bs=64k --iodepth=8 --numjobs=2
	  --size=16M --offset_increment=16M --verify=crc32c --verify_fatal=1
	  --verify_state_save=0 --randseed=11 --output-format=json)
timeout 120 fio --name=write --do_verify=1 "${fio_args[@]}" >"$tmpdir/fio1.json" ||
	{ cat "$tmpdir/fio1.json" >&2; fail "fio write+verify failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio1.json" $((32 << 20)) $((32 << 20)) ||
	fail "fio write+verify: see above"
[ "$(ctl_get "$port" slabs_used)" -eq 32 ] || fail "expected 32 slabs used"

# Bad usage and a wrong key change nothing.
rc=0; timeout 10 "$RDMASWAPCTL" giveback server="$MEMSERVER_ADDR" admin-key="$ADMIN_KEY" >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "giveback without size= exited $rc, expected 2"
rc=0; timeout 10 "$RDMASWAPCTL" giveback server="$MEMSERVER_ADDR" size=0 admin-key="$ADMIN_KEY" >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "giveback size=0 exited $rc, expected 2"
make_key "$tmpdir/other.key"
rc=0; out=$(timeout 10 "$RDMASWAPCTL" giveback server="$MEMSERVER_ADDR" size=56M admin-key="$tmpdir/other.key") || rc=$?
[ "$rc" -eq 1 ] || fail "giveback with a wrong key exited $rc, expected 1: $out"
[ "$(ctl_get "$port" slabs_withdrawn)" -eq 0 ] || fail "a giveback with a wrong key withdrew slabs"

rss_before=$(proc_kb "$pid" VmRSS)
out=$(ctl_giveback "$port" 56M) || fail "rdmaswapctl giveback failed: $out"
log "giveback: $(tr '\n' ' ' <<<"$out")"
grep -qx 'withdrawn_now=32' <<<"$out" || fail "expected the 32 free slabs withdrawn at once"
grep -qx 'pending_moves_now=24' <<<"$out" || fail "expected 24 used slabs wanted back"

# The client finds nowhere to move them: they stay, and the status says so.
stuck() { [ "$(vol_get migrate_pending)" = 24 ]; }
wait_until 20 "status volume= to show 24 moves pending" stuck
[ "$(vol_get migrated)" = 0 ] || fail "slabs reported moved with nowhere to go"
grep -q "cannot move" "$NBDKIT_LOG" || fail "the plugin did not log the stuck moves"
[ "$(grep -c "cannot move" "$NBDKIT_LOG")" -eq 1 ] || fail "the stuck moves were logged more than once"
[ "$(ctl_get "$port" pending_moves)" -eq 24 ] || fail "memserver does not report 24 pending moves"
[ "$(ctl_get "$port" slabs_withdrawn)" -eq 32 ] || fail "memserver does not report 32 withdrawn"
[ "$(ctl_get "$port" slabs_used)" -eq 32 ] || fail "used slabs changed"
expect_rss_drop "$pid" "$rss_before" 32

# The data is intact and the slabs still take writes.
timeout 120 fio --name=verify --verify_only "${fio_args[@]}" >"$tmpdir/fio2.json" ||
	{ cat "$tmpdir/fio2.json" >&2; fail "fio verify after the give-back failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio2.json" $((32 << 20)) ||
	fail "fio verify after the give-back: see above"
timeout 120 fio --name=rewrite --do_verify=1 --randseed=12 "${fio_args[@]}" >"$tmpdir/fio3.json" ||
	{ cat "$tmpdir/fio3.json" >&2; fail "fio write+verify after the give-back failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio3.json" $((32 << 20)) $((32 << 20)) ||
	fail "fio write+verify after the give-back: see above"
[ "$(ctl_get "$port" pending_moves)" -eq 24 ] || fail "pending moves changed"
exit 0
