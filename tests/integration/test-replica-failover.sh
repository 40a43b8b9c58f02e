#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Three memservers, replicas=2: fio writes and verifies, then one memserver dies (kill -9, or
# SIGSTOP with "stop" as $1: a hung donor, detected by the timeout); fio verifies everything
# again with zero errors, and the repair thread restores two copies of every slab on the
# survivors (their slabs_used adds up to 2 x the slabs written).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl
how=${1:-kill}

ports=() pids=()
for _ in 1 2 3; do
	start_memserver 64M 1M
	ports+=("$MEMSERVER_PORT") pids+=("$MEMSERVER_PID")
done
start_nbdkit repl -- server=127.0.0.1:${ports[0]} server=127.0.0.1:${ports[1]} \
	server=127.0.0.1:${ports[2]} size=48M replicas=2 timeout=3 statusfile="$tmpdir/status"
vol_get() { "$RDMASWAPCTL" status volume="$tmpdir/status" | sed -n "s/^$1=//p"; }

fio_args=(--ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite --bssplit=4k/50:128k/50
	  --iodepth=8 --numjobs=3 --size=16M --offset_increment=16M
	  --verify=crc32c --verify_fatal=1 --verify_state_save=0 --randseed=99 --output-format=json)
timeout 60 fio --name=write-verify --do_verify=1 "${fio_args[@]}" >"$tmpdir/fio1.json" ||
	{ cat "$tmpdir/fio1.json" >&2; fail "fio write+verify failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio1.json" $((48 << 20)) $((48 << 20)) ||
	fail "fio write+verify: see above"
total=0
for p in "${ports[@]}"; do total=$((total + $(ctl_get "$p" slabs_used))); done
[ "$total" -eq 96 ] || fail "expected 48 slabs x 2 replicas = 96 slabs used, found $total"

victim=1
if [ "$how" = stop ]; then
	sigstop "${pids[$victim]}"
	log "memserver on port ${ports[$victim]} stopped (SIGSTOP)"
else
	kill -KILL "${pids[$victim]}"
	log "memserver on port ${ports[$victim]} killed (SIGKILL)"
fi
survivors=("${ports[0]}" "${ports[2]}")

start=$SECONDS
timeout 90 fio --name=verify-only --verify_only "${fio_args[@]}" >"$tmpdir/fio2.json" ||
	{ cat "$tmpdir/fio2.json" >&2; fail "fio verify after losing a memserver failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio2.json" $((48 << 20)) ||
	fail "fio verify after losing a memserver: see above"
log "verify with one memserver gone: 0 errors in $((SECONDS - start)) s"

# Re-replication: every slab back to two copies, on the two survivors.
used_on_survivors() { echo $(($(ctl_get "${survivors[0]}" slabs_used) + $(ctl_get "${survivors[1]}" slabs_used))); }
restored() { [ "$(used_on_survivors)" -eq 96 ]; }
wait_until 90 "re-replication to 96 slabs on the survivors (have $(used_on_survivors))" restored
log "re-replication restored 2 copies of all 48 slabs in $((SECONDS - start)) s"
# The status tool agrees: nothing degraded or lost, replicas re-created and the victim failed.
# (The status file is rewritten every second: wait for one written after the repair.)
settled() { [ "$(vol_get repaired)" -ge 1 ] && [ "$(vol_get degraded)" = 0 ] &&
	    [ "$(vol_get lost)" = 0 ] && [ "$(vol_get slabs_live)" = 48 ]; }
wait_until 10 "rdmaswapctl status volume= to show re-created replicas, 48 live slabs, none degraded or lost" settled
[[ $(vol_get transport) == tcp ]] || fail "status does not say transport=tcp"
"$RDMASWAPCTL" status volume="$tmpdir/status" | grep -q "127.0.0.1:${ports[$victim]} state=failed" ||
	{ "$RDMASWAPCTL" status volume="$tmpdir/status" >&2
	  fail "status does not show the victim as failed"; }
"$RDMASWAPCTL" status volume="$tmpdir/status" >&2
grep "repair:" "$NBDKIT_LOG" | tail -1 >&2 || true

# And the data is still right, read back again after the repair.
timeout 60 fio --name=verify-again --verify_only "${fio_args[@]}" >"$tmpdir/fio3.json" ||
	{ cat "$tmpdir/fio3.json" >&2; fail "fio verify after re-replication failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio3.json" $((48 << 20)) ||
	fail "fio verify after re-replication: see above"
[ "$how" = stop ] && kill -CONT "${pids[$victim]}"
exit 0
