#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Reattach after an nbdkit restart (volume=, lease=): fio writes with crc32c verify headers
# through nbdkit, nbdkit is killed with SIGKILL, a new nbdkit with the same volume id takes the
# slabs over from the memservers, and a verify-only fio on it finds 0 errors.
#   $1 = one       one memserver
#        replicas  three memservers, replicas=2
#        killed    three memservers, replicas=2; one donor killed (degraded) before the restart
#        repaired  as killed, but the restart waits until the repair restored 2 copies
#        stale     three memservers, replicas=2; one donor hangs (SIGSTOP) while everything is
#                  rewritten with another pattern, so its replicas miss writes; it comes back
#                  before the restart: the restarted plugin must not read them (their epoch is
#                  older), and fio verifies the second pattern with 0 errors
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl
mode=${1:-one}

ports=() pids=()
n=3
[ "$mode" = one ] && n=1
for ((i = 0; i < n; i++)); do
	start_memserver 64M 1M
	ports+=("$MEMSERVER_PORT") pids+=("$MEMSERVER_PID")
done
servers=()
for p in "${ports[@]}"; do servers+=("server=127.0.0.1:$p"); done
plugin_args=("${servers[@]}" size=48M volume=reattach-test lease=30 timeout=3
	     statusfile="$tmpdir/status")
[ "$n" -gt 1 ] && plugin_args+=(replicas=2)
vol_get() { "$RDMASWAPCTL" status volume="$tmpdir/status" | sed -n "s/^$1=//p"; }
used_total() {
	local t=0 p
	for p in "$@"; do t=$((t + $(ctl_get "$p" slabs_used))); done
	echo "$t"
}

start_nbdkit first -- "${plugin_args[@]}"
first_pid=$NBDKIT_PID
fio_args=(--ioengine=nbd --rw=randwrite --bssplit=4k/50:128k/50
	  --iodepth=8 --numjobs=3 --size=16M --offset_increment=16M
	  --verify=crc32c --verify_fatal=1 --verify_state_save=0 --output-format=json)
seed=7
timeout 60 fio --name=write --do_verify=0 "${fio_args[@]}" --uri="$NBDKIT_URI" --randseed=$seed \
	>"$tmpdir/fio1.json" || { cat "$tmpdir/fio1.json" >&2; fail "fio write phase failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio1.json" 0 $((48 << 20)) ||
	fail "fio write phase: see above"
want=$((48 * (n > 1 ? 2 : 1)))
[ "$(used_total "${ports[@]}")" -eq "$want" ] || fail "expected $want slabs used after the write"

victim=1
live=("${ports[@]}")
case $mode in
killed | repaired)
	kill -KILL "${pids[$victim]}"
	log "donor on port ${ports[$victim]} killed"
	live=("${ports[0]}" "${ports[2]}")
	if [ "$mode" = repaired ]; then
		# Reads find the dead donor; the repair thread restores 2 copies on the survivors.
		restored() { [ "$(used_total "${live[@]}")" -eq 96 ]; }
		timeout 60 fio --name=verify --verify_only "${fio_args[@]}" \
		--uri="$NBDKIT_URI" --randseed=$seed >"$tmpdir/fio-mid.json" || fail "verify before the restart failed"
		wait_until 90 "re-replication to 96 slabs on the survivors" restored
	fi
	;;
stale)
	# Placement decides how many chunks have a replica on the victim (about a third of 96).
	on_victim=$(used_total "${ports[$victim]}")
	[ "$on_victim" -gt 0 ] || fail "placement put no replica on the donor to hang"
	sigstop "${pids[$victim]}"
	log "donor on port ${ports[$victim]} hung (SIGSTOP); rewriting everything"
	seed=8
	timeout 90 fio --name=rewrite --do_verify=0 "${fio_args[@]}" \
		--uri="$NBDKIT_URI" --randseed=$seed >"$tmpdir/fio1b.json" ||
		{ cat "$tmpdir/fio1b.json" >&2; fail "fio rewrite with a hung donor failed"; }
	"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio1b.json" 0 $((48 << 20)) ||
		fail "fio rewrite: see above"
	# Every chunk with a replica on the hung donor was written: its epoch went up.
	raised_all() { [ "$(vol_get epoch_raises)" -ge "$on_victim" ]; }
	raised_all || sleep 2 # the status file is rewritten every second
	raised_all || { cat "$tmpdir/status" >&2; fail "epochs not raised while a donor missed writes"; }
	raised=$(vol_get epoch_raises)
	log "epoch raised on $raised chunks while the donor holding $on_victim of them was hung"
	;;
esac

kill -KILL "$first_pid"
wait "$first_pid" 2>/dev/null || true
log "nbdkit killed (SIGKILL)"
if [ "$mode" = stale ]; then
	kill -CONT "${pids[$victim]}"
	log "hung donor resumed: it still holds replicas that missed the rewrite"
fi
# The memservers keep the slabs of the dead plugin's sessions, detached.
for p in "${live[@]}"; do
	det() { ctl_status "$1" | grep -q "^sessions_detached=1$"; }
	wait_until 20 "memserver $p to show the dead plugin's session detached" det "$p"
done
ctl_status "${live[0]}" | grep '^session\.' >&2

rm -f "$tmpdir/status"
start_nbdkit second -- "${plugin_args[@]}"
wait_until 10 "the new plugin's status file" test -s "$tmpdir/status"
chunks=$(vol_get reattached) stale=$(vol_get reattach_stale)
log "the new plugin reattached $chunks chunks, gave back $stale stale replicas"
[ "$chunks" -eq 48 ] || fail "the new plugin reattached $chunks chunks, not 48"
[ "$(vol_get lost)" = 0 ] || fail "the new plugin reports lost chunks"
if [ "$mode" = stale ]; then
	[ "$stale" -gt 0 ] || fail "the restarted plugin found no stale replica to discard"
else
	[ "$stale" -eq 0 ] || fail "the restarted plugin discarded $stale replicas as stale"
fi
timeout 90 fio --name=verify --verify_only "${fio_args[@]}" --uri="$NBDKIT_URI" --randseed=$seed \
	>"$tmpdir/fio2.json" || { cat "$tmpdir/fio2.json" >&2; fail "fio verify after the restart failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio2.json" $((48 << 20)) ||
	fail "fio verify after the restart: see above"
log "verify after the restart ($mode): 0 errors"
if [ "$n" -gt 1 ]; then
	# The new plugin holds 2 copies again (degraded chunks repaired, stale ones given back).
	two_copies() { [ "$(used_total "${live[@]}")" -eq 96 ]; }
	wait_until 90 "2 copies of 48 slabs after the restart (have $(used_total "${live[@]}"))" two_copies
fi
exit 0
