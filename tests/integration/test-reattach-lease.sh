#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Lease expiry: a killed plugin's slabs stay allocated (detached) for lease= seconds, then the
# memserver frees them (its free slab count returns to full) and a new plugin with the same
# volume id starts empty. With lease=0, the slabs are freed as soon as the plugin is gone.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

start_memserver 16M 1M
total=$(ctl_get "$MEMSERVER_PORT" slabs_total)
args=(server="$MEMSERVER_ADDR" size=8M volume=lease-test statusfile="$tmpdir/status")
vol_get() { "$RDMASWAPCTL" status volume="$tmpdir/status" | sed -n "s/^$1=//p"; }
write_pattern() { nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"\x5a" * (3 << 20), 1 << 20)'; }
read_is() { # read_is BYTE: the written range reads as that byte everywhere
	nbdsh_run -u "$NBDKIT_URI" -c "assert h.pread(3 << 20, 1 << 20) == bytes([$1]) * (3 << 20)"
}

# lease=2: detached for 2 s, then freed.
start_nbdkit a -- "${args[@]}" lease=2
write_pattern
[ "$(ctl_get "$MEMSERVER_PORT" slabs_used)" -eq 3 ] || fail "expected 3 slabs used"
kill -KILL "$NBDKIT_PID"
detached() { ctl_status "$MEMSERVER_PORT" | grep -Eq "^session\.0=.* slabs=3 state=detached .*lease=2 "; }
wait_until 10 "the killed plugin's session to be detached with its 3 slabs" detached
ctl_status "$MEMSERVER_PORT" | grep '^session\.' >&2
start=$SECONDS
all_free() { [ "$(ctl_get "$MEMSERVER_PORT" slabs_free)" -eq "$total" ] &&
	     [ "$(ctl_get "$MEMSERVER_PORT" sessions)" -eq 0 ]; }
wait_until 15 "the lease to expire and every slab to be free" all_free
log "lease expired: all $total slabs free after $((SECONDS - start)) s"
((SECONDS - start <= 10)) || fail "lease=2 took $((SECONDS - start)) s to expire"
grep -q "lease expired; 3 slabs freed" "$MEMSERVER_LOG" || fail "memserver did not log the expiry"

# A new plugin with the same volume id starts empty (and says so).
rm -f "$tmpdir/status"
start_nbdkit b -- "${args[@]}" lease=2
read_is 0 || fail "a plugin started after the lease expired does not read zeros"
grep -q "starts EMPTY" "$NBDKIT_LOG" || fail "the plugin did not log that the volume starts empty"
wait_until 10 "status file" test -s "$tmpdir/status"
[ "$(vol_get reattached)" = 0 ] || fail "status says chunks were reattached"

# lease=0: nothing is kept once the plugin is gone.
write_pattern
kill -KILL "$NBDKIT_PID"
wait_until 15 "lease=2 of plugin b to expire" all_free
start_nbdkit c -- "${args[@]}" lease=0
write_pattern
kill -KILL "$NBDKIT_PID"
freed_now() { all_free && ! ctl_status "$MEMSERVER_PORT" | grep -q "state=detached"; }
wait_until 5 "lease=0: slabs freed as soon as the plugin is gone" freed_now
exit 0
