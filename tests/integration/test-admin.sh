#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The admin role (issue 12): GIVEBACK and LEND need the memserver's --admin-key; a cluster-key
# holder gets EPERM (over the wire and through rdmaswapctl) and changes nothing, and sees only
# the sessions of its own address; the admin sees them all, withdraws capacity and lends it
# back (cancelling pending moves first). The client's data stays intact throughout.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires nbdcopy --version
requires_build memserver plugin ctl

# The memserver refuses an admin key that is the cluster key, and --admin-key with --insecure.
for bad in "--auth-key $AUTH_KEY --admin-key $AUTH_KEY" "--insecure --admin-key $ADMIN_KEY"; do
	rc=0
	# shellcheck disable=SC2086 # two words each
	out=$(timeout 10 "$MEMSERVER" --listen 127.0.0.1 --port 0 --capacity 4M --slab-size 1M \
		--transport tcp $bad 2>&1) || rc=$?
	[[ $rc -ne 0 && $rc -ne 124 ]] || fail "memserver $bad: exit $rc, expected a refusal"
	grep -q "admin-key" <<<"$out" || fail "memserver $bad: no message naming --admin-key: $out"
	log "memserver $bad refused: $(tail -1 <<<"$out")"
done

start_memserver 64M 1M
port=$MEMSERVER_PORT
start_nbdkit owner -- server="$MEMSERVER_ADDR" size=32M volume=owner-vol
head -c 32M /dev/urandom >"$tmpdir/data"
timeout 60 nbdcopy "$tmpdir/data" "$NBDKIT_URI" || fail "nbdcopy to the device failed"
[ "$(ctl_get "$port" slabs_used)" -eq 32 ] || fail "expected 32 slabs used"

# Another cluster-key holder, on 127.0.0.2, lists only its own session.
"$PYTHON" "$(dirname "$0")/helpers/admin-client.py" other 127.0.0.1 "$port" "$AUTH_KEY" 127.0.0.2 30 \
	>"$tmpdir/other.out" 2>&1 &
other_pid=$!
cleanup_pid "$other_pid"
wait_until 20 "the client on 127.0.0.2 to list sessions" grep -q '^session=' "$tmpdir/other.out"
cat "$tmpdir/other.out" >&2
other_session=$(sed -n 's/^session=//p' "$tmpdir/other.out")

# rdmaswapctl with the cluster key, from 127.0.0.1: this host's sessions only.
out=$(ctl_status "$port") || fail "rdmaswapctl status failed"
grep -qx 'sessions_listed=this-host' <<<"$out" || fail "status with the cluster key: no sessions_listed=this-host"
grep -q 'volume=owner-vol peer=127.0.0.1:' <<<"$out" || fail "status with the cluster key does not list this host's volume: $out"
! grep -q "$other_session" <<<"$out" || fail "status with the cluster key listed 127.0.0.2's session"
[ "$(sed -n 's/^sessions=//p' <<<"$out")" -eq 2 ] || fail "the capacity figures should count both sessions"
# With the admin key: every session.
out=$(timeout 10 "$RDMASWAPCTL" status server="$MEMSERVER_ADDR" admin-key="$ADMIN_KEY") ||
	fail "rdmaswapctl status admin-key= failed"
grep -qx 'sessions_listed=all' <<<"$out" || fail "status with the admin key: no sessions_listed=all"
grep -q "$other_session volume=- peer=127.0.0.2:" <<<"$out" || fail "the admin does not see 127.0.0.2's session: $out"
grep -q 'volume=owner-vol' <<<"$out" || fail "the admin does not see owner-vol"

# Without the admin key: refused on the wire (EPERM, the connection goes on), and through
# rdmaswapctl (the cluster key given as admin-key=: the memserver says no); nothing changes.
"$PYTHON" "$(dirname "$0")/helpers/admin-client.py" refused 127.0.0.1 "$port" "$AUTH_KEY" ||
	fail "the wire-level refusals (see above)"
for op in giveback lend; do
	rc=0
	out=$(CTL_ADMIN="admin-key=$AUTH_KEY" "ctl_$op" "$port" 16M) || rc=$?
	[ "$rc" -eq 1 ] || fail "rdmaswapctl $op with the cluster key: exit $rc, expected 1: $out"
	grep -q "^error=refused: $op needs the memserver's admin key" <<<"$out" ||
		fail "rdmaswapctl $op with the cluster key: no refusal line: $out"
	rc=0
	out=$(timeout 10 "$RDMASWAPCTL" "$op" server="$MEMSERVER_ADDR" size=16M auth-key="$AUTH_KEY" 2>&1) || rc=$?
	[ "$rc" -eq 2 ] || fail "rdmaswapctl $op auth-key=: exit $rc, expected 2 (needs admin-key=): $out"
done
grep -q "GIVEBACK refused: it needs the admin key" "$MEMSERVER_LOG" || fail "the memserver did not log the refused GIVEBACK"
grep -q "LEND refused: it needs the admin key" "$MEMSERVER_LOG" || fail "the memserver did not log the refused LEND"
[ "$(ctl_get "$port" slabs_withdrawn)" -eq 0 ] || fail "a refused give-back withdrew slabs"
[ "$(ctl_get "$port" slabs_free)" -eq 32 ] || fail "a refused op changed the free slabs"

# The admin gives back 40 MiB: the 32 free slabs at once, 8 used ones wanted back (there is
# nowhere to move them); then lends 40 MiB: the 8 moves are cancelled, the 32 slabs return.
out=$(ctl_giveback "$port" 40M) || fail "giveback with the admin key: $out"
log "giveback: $(tr '\n' ' ' <<<"$out")"
grep -qx 'withdrawn_now=32' <<<"$out" || fail "expected 32 free slabs withdrawn"
grep -qx 'pending_moves_now=8' <<<"$out" || fail "expected 8 moves pending"
[ "$(ctl_get "$port" slabs_free)" -eq 0 ] || fail "free slabs left after the give-back"
out=$(ctl_lend "$port" 40M) || fail "lend with the admin key: $out"
log "lend: $(tr '\n' ' ' <<<"$out")"
grep -qx 'moves_cancelled=8' <<<"$out" || fail "expected the 8 pending moves cancelled"
grep -qx 'lent_now=32' <<<"$out" || fail "expected 32 slabs lent again"
grep -qx 'slabs_withdrawn=0' <<<"$out" || fail "slabs still withdrawn after the lend"
[ "$(ctl_get "$port" pending_moves)" -eq 0 ] || fail "moves still pending after the lend"
[ "$(ctl_get "$port" slabs_free)" -eq 32 ] || fail "the lent slabs are not free"
grep -q "lend of 41943040 bytes: 8 pending moves cancelled, 32 withdrawn slabs offered again" \
	"$MEMSERVER_LOG" || fail "the memserver did not log the lend"

# The client's bytes are intact, and the lent slabs take a second device's writes.
timeout 60 nbdcopy "$NBDKIT_URI" "$tmpdir/back" || fail "nbdcopy from the device failed"
cmp "$tmpdir/data" "$tmpdir/back" || fail "the device's bytes changed"
start_nbdkit second -- server="$MEMSERVER_ADDR" size=32M volume=second-vol
head -c 32M /dev/urandom >"$tmpdir/data2"
timeout 60 nbdcopy "$tmpdir/data2" "$NBDKIT_URI" || fail "writing the lent slabs failed"
timeout 60 nbdcopy "$NBDKIT_URI" "$tmpdir/back2" || fail "reading the lent slabs failed"
cmp "$tmpdir/data2" "$tmpdir/back2" || fail "the lent slabs returned other bytes"
[ "$(ctl_get "$port" slabs_free)" -eq 0 ] || fail "expected every slab in use"
log "ok"
