#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Donor memory give-back during a fio verify run. Three memservers with replicas=2 (or two
# with replicas=1 when $1 is 1): while fio writes and verifies in loops, `rdmaswapctl
# giveback` asks one memserver for 56 of its 64 slabs. Its free slabs go at once, the clients
# move the used ones to the other memservers and free them, and only then are they withdrawn.
# Checks: fio 0 errors (during, and a final verify-only pass), the memserver reports 56 slabs
# withdrawn and no pending moves, its resident memory shrank by about 56 MiB, and every slab
# still has its copies on the others. Prints the time from the command to the memory freed
# and the migration throughput.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl
replicas=${1:-2}
nservers=$((replicas + 1))

ports=() pids=() servers=()
for ((i = 0; i < nservers; i++)); do
	start_memserver 64M 1M
	ports+=("$MEMSERVER_PORT") pids+=("$MEMSERVER_PID") servers+=("server=$MEMSERVER_ADDR")
done
start_nbdkit gb -- "${servers[@]}" size=48M replicas="$replicas" statusfile="$tmpdir/status"
vol_get() { "$RDMASWAPCTL" status volume="$tmpdir/status" | sed -n "s/^$1=//p"; }
victim=0
vport=${ports[$victim]} vpid=${pids[$victim]}

fio_args=(--ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite --bssplit=4k/50:128k/50
	  --iodepth=8 --numjobs=3 --size=16M --offset_increment=16M
	  --verify=crc32c --verify_fatal=1 --verify_state_save=0 --randseed=7 --output-format=json)
# fio write+verify runs back to back until the moves are done (a single run can end before the
# give-back on a fast machine): each run must pass. At most 100 runs.
fio_runs() {
	local i=0
	while [ ! -e "$tmpdir/stop-fio" ] && ((i < 100)); do
		i=$((i + 1))
		timeout 300 fio --name=write-verify --do_verify=1 --loops=4 "${fio_args[@]}" \
			>"$tmpdir/fio1-$i.json" || { echo "$i" >"$tmpdir/fio-runs"; return 1; }
	done
	echo "$i" >"$tmpdir/fio-runs"
}
fio_runs &
fio_pid=$!
cleanup_pid "$fio_pid"

# Once fio has written most of the volume (the victim holds most of its share), give back.
share=$((48 * replicas / nservers))
mostly_written() { [ "$(ctl_get "$vport" slabs_used)" -ge $((share * 9 / 10)) ]; }
wait_until 120 "fio to fill the volume" mostly_written
used=$(ctl_get "$vport" slabs_used)
rss_before=$(proc_kb "$vpid" VmRSS)
if ! kill -0 "$fio_pid" 2>/dev/null; then
	cat "$tmpdir"/fio1-*.json >&2
	fail "fio failed before the give-back"
fi
start_ns=$(date +%s%N)
out=$(ctl_giveback "$vport" 56M) || fail "rdmaswapctl giveback failed: $out"
log "giveback with $used slabs used: $(tr '\n' ' ' <<<"$out")"
now=$(sed -n 's/^withdrawn_now=//p' <<<"$out")
pending=$(sed -n 's/^pending_moves_now=//p' <<<"$out")
[ $((now + pending)) -eq 56 ] || fail "giveback of 56 slabs: $now withdrawn + $pending pending"
[ "$pending" -ge $((used - 8)) ] || fail "expected at least $((used - 8)) pending moves, got $pending"
[ "$(ctl_get "$vport" slabs_free)" -eq 0 ] || fail "free slabs left after the give-back"

done_moving() { [ "$(ctl_get "$vport" pending_moves)" -eq 0 ]; }
wait_until 120 "the clients to move the $pending wanted slabs" done_moving
secs=$(( ($(date +%s%N) - start_ns) / 1000000 ))
[ "$(ctl_get "$vport" slabs_withdrawn)" -eq 56 ] || fail "expected 56 slabs withdrawn"
[ "$(ctl_get "$vport" bytes_withdrawn)" -eq $((56 << 20)) ] || fail "expected 56 MiB withdrawn"
[ "$(ctl_get "$vport" slabs_used)" -le 8 ] || fail "more than 8 slabs used on the victim"
expect_rss_drop "$vpid" "$rss_before" 56

kill -0 "$fio_pid" 2>/dev/null || fail "fio stopped before the moves were done"
touch "$tmpdir/stop-fio"
if ! wait "$fio_pid"; then
	cat "$tmpdir/fio1-$(cat "$tmpdir/fio-runs").json" >&2
	fail "fio write+verify run $(cat "$tmpdir/fio-runs") during the give-back failed"
fi
runs=$(cat "$tmpdir/fio-runs")
for ((i = 1; i <= runs; i++)); do
	"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio1-$i.json" $((4 * 48 << 20)) \
		$((4 * 48 << 20)) || fail "fio write+verify run $i during the give-back: see above"
done
log "$runs fio write+verify runs (4 loops each) during the give-back, all clean"

# Every slab still has its copies; the moves show in the volume's status.
total=0
for p in "${ports[@]}"; do total=$((total + $(ctl_get "$p" slabs_used))); done
[ "$total" -eq $((48 * replicas)) ] || fail "expected $((48 * replicas)) slabs used in all, found $total"
moved() { [ "$(vol_get migrated)" -ge "$pending" ] && [ "$(vol_get degraded)" = 0 ] &&
	  [ "$(vol_get lost)" = 0 ] && [ "$(vol_get migrate_pending)" = 0 ]; }
wait_until 10 "status volume= to show $pending slabs migrated, none degraded or lost" moved
mbytes=$(vol_get migrate_bytes) mms=$(vol_get migrate_ms)
[ "$mbytes" -ge $((pending << 20)) ] || fail "migrate_bytes=$mbytes, expected >= $pending MiB"
log "give-back: $(vol_get migrated) slabs ($((mbytes >> 20)) MiB) moved in $mms ms of copying" \
    "($((mbytes * 1000 / (mms > 0 ? mms : 1) >> 20)) MiB/s, fio running); memory freed $secs ms" \
    "after the command (including the wait for the next repair pass)"

timeout 120 fio --name=verify-only --verify_only "${fio_args[@]}" >"$tmpdir/fio2.json" ||
	{ cat "$tmpdir/fio2.json" >&2; fail "final fio verify failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio2.json" $((48 << 20)) ||
	fail "final fio verify: see above"
exit 0
