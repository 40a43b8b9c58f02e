#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# While fio writes and verifies through the plugin, a hostile client hammers the memserver's TCP
# port with garbage (random bytes, truncated headers, huge lengths, idle connections, requests
# without authentication or with a wrong proof, I/O on other sessions' slabs). fio's verify still passes, the memserver refuses every foreign-slab operation
# and still answers rdmaswapctl status.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl
here=$(cd "$(dirname "$0")" && pwd)

# The garbage client opens ~30 connections per round from one address, faster than
# --connect-rate allows once the memserver closes bad ones at once: the limit has its own test
# (test-connect-flood), this one is about what each connection sends.
start_memserver 64M 1M --connect-rate 0
start_nbdkit fio -- server="$MEMSERVER_ADDR" size=48M

state="$tmpdir/garbage.state" stop="$tmpdir/garbage.stop"
"$PYTHON" "$here/helpers/garbage-client.py" 127.0.0.1 "$MEMSERVER_PORT" "$state" "$stop" "$AUTH_KEY" \
    2>"$tmpdir/garbage.log" &
garbage_pid=$!
cleanup_pid "$garbage_pid"
wait_until 20 "first garbage round" test -s "$state"
rounds() { sed -n 's/^rounds=\([0-9]*\).*/\1/p' "$state"; }
before=$(rounds)

fio_args=(--ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite --bssplit=4k/50:128k/50
          --iodepth=16 --numjobs=3 --size=16M --offset_increment=16M --loops=30
          --verify=crc32c --verify_fatal=1 --verify_state_save=0 --randseed=99 --output-format=json)
# fio write+verify runs again and again (each run must pass) until the garbage client has done
# at least 3 whole rounds under it: on a fast machine one fio run may end within one round.
runs=0 deadline=$((SECONDS + 90))
while :; do
    rc=0
    timeout 50 fio --name=under-fire --do_verify=1 "${fio_args[@]}" >"$tmpdir/fio1.json" || rc=$?
    [[ $rc -eq 0 ]] || { cat "$tmpdir/fio1.json" >&2; fail "fio write+verify run $((runs + 1)) failed (exit $rc) under garbage"; }
    "$PYTHON" "$here/helpers/fio-check.py" "$tmpdir/fio1.json" $((48 * 1024 * 1024 * 9 / 10)) || fail "fio: see above"
    runs=$((runs + 1))
    (($(rounds) - before >= 3)) && break
    ((SECONDS < deadline)) || break
done
after=$(rounds)
touch "$stop"
log "garbage rounds during $runs fio runs: $((after - before)); $(cat "$state")"
((after - before >= 3)) || fail "only $((after - before)) garbage rounds completed while fio ran: too few to prove anything"

# The garbage client ends by itself after the stop file; it fails only if the server stopped
# accepting connections.
for ((i = 0; i < 200; i++)); do kill -0 "$garbage_pid" 2>/dev/null || break; sleep 0.1; done
grc=0; wait "$garbage_pid" || grc=$?
cat "$tmpdir/garbage.log" >&2
[[ $grc -eq 0 ]] || fail "garbage client exited $grc (memserver stopped accepting connections?)"
grep -q 'accepted_foreign=0 ' "$state" || fail "memserver accepted operations on slabs a session never allocated: $(cat "$state")"
grep -q 'accepted_unauth=0 ' "$state" || fail "memserver answered requests without authentication: $(cat "$state")"
grep -q 'refused=[1-9]' "$state" || fail "the hostile session never ran (no refusals): $(cat "$state")"

kill -0 "$MEMSERVER_PID" 2>/dev/null || fail "memserver died"
ctl_status "$MEMSERVER_PORT" >/dev/null || fail "memserver no longer answers rdmaswapctl status"
# The data is still there for new connections.
timeout 50 fio --name=after-fire --verify_only "${fio_args[@]}" >"$tmpdir/fio2.json" ||
    { cat "$tmpdir/fio2.json" >&2; fail "fio verify-only after the garbage failed"; }
"$PYTHON" "$here/helpers/fio-check.py" "$tmpdir/fio2.json" $((48 * 1024 * 1024 * 9 / 10)) || fail "fio: see above"
