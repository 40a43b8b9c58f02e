#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# --reserve: the memserver watches MemAvailable (here a fake meminfo file, through the test
# hook RDMASWAP_MEMINFO) and gives slabs back while it is below the reserve: exactly enough
# free slabs for a small shortfall; everything, including the used slabs (which the client
# moves to a second memserver), when MemAvailable drops to 0; and it takes them back once
# MemAvailable is well above the reserve again. The data survives (fio verify).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl

meminfo=$tmpdir/meminfo
set_avail() { printf 'MemTotal:       99999999 kB\nMemAvailable:   %d kB\n' "$1" >"$meminfo.new"
	      mv "$meminfo.new" "$meminfo"; }
set_avail $((500 * 1024))
RDMASWAP_MEMINFO=$meminfo start_memserver 64M 1M --reserve 100M
port=$MEMSERVER_PORT pid=$MEMSERVER_PID res_log=$MEMSERVER_LOG
start_memserver 64M 1M
other=$MEMSERVER_PORT
start_nbdkit res -- server=127.0.0.1:$port server=127.0.0.1:$other size=32M replicas=1 \
	statusfile="$tmpdir/status"
vol_get() { "$RDMASWAPCTL" status volume="$tmpdir/status" | sed -n "s/^$1=//p"; }

fio_args=(--ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite --bs=64k --iodepth=8 --numjobs=2
	  --size=16M --offset_increment=16M --verify=crc32c --verify_fatal=1
	  --verify_state_save=0 --randseed=5 --output-format=json)
fio_ok() { # NAME ARGS...: run fio, require a clean verify of the whole volume
	local name=$1
	shift
	timeout 120 fio --name="$name" "$@" "${fio_args[@]}" >"$tmpdir/$name.json" ||
		{ cat "$tmpdir/$name.json" >&2; fail "fio $name failed"; }
	"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/$name.json" $((32 << 20)) ||
		fail "fio $name: see above"
}
fio_ok write --do_verify=1
used=$(ctl_get "$port" slabs_used)
log "memserver with --reserve holds $used slabs"
[ "$used" -gt 0 ] || fail "no slab on the memserver with --reserve: nothing to move"
sleep 2 # a few readings above the reserve: nothing happens
[ "$(ctl_get "$port" slabs_withdrawn)" -eq 0 ] || fail "slabs withdrawn above the reserve"

# 2.5 MiB short of the reserve: 3 free slabs go.
set_avail $((100 * 1024 - 2560))
three() { [ "$(ctl_get "$port" slabs_withdrawn)" -ge 3 ]; }
wait_until 20 "3 slabs withdrawn" three
set_avail $((100 * 1024 + 1024)) # as the kernel would now show it (not enough to take back)
[ "$(ctl_get "$port" slabs_withdrawn)" -eq 3 ] || fail "expected exactly 3 slabs withdrawn"
[ "$(ctl_get "$port" pending_moves)" -eq 0 ] || fail "free slabs sufficed, yet moves are pending"
sleep 3
[ "$(ctl_get "$port" slabs_withdrawn)" -eq 3 ] || fail "withdrawn count changed within the hysteresis"
# And it says so, once, with the figures (the log of the memserver with --reserve).
said="--reserve: MemAvailable $(((100 * 1024 - 2560) * 1024)) below $((100 << 20)): 3 free slabs"
said+=" withdrawn, 0 granted slabs wanted back (3 withdrawn in all)"
[ "$(grep -cF -- "$said" "$res_log")" -eq 1 ] ||
	{ grep -- --reserve "$res_log" >&2; fail "the memserver did not log once: $said"; }

# Nothing available: every slab goes; the used ones move to the other memserver first.
rss_before=$(proc_kb "$pid" VmRSS)
set_avail 0
all_gone() { [ "$(ctl_get "$port" slabs_withdrawn)" -eq 64 ]; }
wait_until 60 "all 64 slabs withdrawn (the used ones moved away)" all_gone
[ "$(ctl_get "$port" slabs_used)" -eq 0 ] || fail "slabs still used on the memserver"
[ "$(ctl_get "$other" slabs_used)" -eq 32 ] || fail "the other memserver should hold all 32 slabs"
expect_rss_drop "$pid" "$rss_before" 61
rss_low=$(proc_kb "$pid" VmRSS)
moved() { [ "$(vol_get migrated)" -eq "$used" ]; }
wait_until 10 "status volume= to show $used slabs migrated" moved
fio_ok verify1 --verify_only

# Plenty available again: the slabs come back, free, populated and locked.
set_avail $((10 * 1024 * 1024))
back() { [ "$(ctl_get "$port" slabs_withdrawn)" -eq 0 ] && [ "$(ctl_get "$port" slabs_free)" -eq 64 ]; }
wait_until 30 "the slabs taken back" back
# The 64 slabs taken back are resident again (compared with the low point, not with before:
# an ASan build's own heap shrinks meanwhile).
rss_back=$(proc_kb "$pid" VmRSS)
log "pid $pid VmRSS $rss_low kB -> $rss_back kB after the slabs were taken back (expected ~64 MiB more)"
((rss_back - rss_low >= 64 * 1024 * 9 / 10)) || fail "memory not populated again"
fio_ok write2 --do_verify=1 --randseed=6
exit 0
