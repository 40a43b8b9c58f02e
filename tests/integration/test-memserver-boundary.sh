#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 29: no exception reaches std::terminate in the memserver either (docs/architecture.md,
# "Exception boundaries"), proved with its test hook RDMASWAP_TEST_THROW:
# - "lease": the lease thread's body throws three times. One error line; the memserver serves
#   on (a client writes and reads back), and the thread, started again, still expires a
#   detached session at the end of its lease.
# - "loop": an event loop throws at its first new connection. Without it the memserver cannot
#   serve: it stops cleanly (connections closed, workers finished, as at SIGTERM) and exits
#   with status 1, one error line naming the loop (and one saying why it exits), never an
#   abort.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

no_abort() {
    ! grep -q 'terminate called' "$1" || fail "$2 aborted: $(grep -A1 'terminate called' "$1")"
}

# ---- The lease thread: logged once, started again, the memserver serves on ----
RDMASWAP_TEST_THROW=lease start_memserver 32M 1M
wait_until 10 "the lease thread's failure logged" grep -q 'the lease thread failed' "$MEMSERVER_LOG"
start_nbdkit lease -- server="$MEMSERVER_ADDR" size=8M volume=boundary lease=1
nbdsh_run -u "$NBDKIT_URI" -c '
import os
data = os.urandom(1 << 20)
h.pwrite(data, 1 << 20)
assert h.pread(1 << 20, 1 << 20) == data, "the bytes read back differ"
' || fail "the memserver did not serve after its lease thread failed"
used=$(ctl_get "$MEMSERVER_PORT" slabs_used)
((used >= 1)) || fail "no slab in use after the write"
stop_nbdkit_clean # the session detaches: its slabs are kept for lease=1 s, then freed
expired() { [[ $(ctl_get "$MEMSERVER_PORT" slabs_used) == 0 && $(ctl_get "$MEMSERVER_PORT" sessions) == 0 ]]; }
wait_until 15 "the detached session expired by the restarted lease thread" expired
n=$(grep -c 'the lease thread failed' "$MEMSERVER_LOG" || true)
[[ $n == 1 ]] || fail "the lease thread's failures were logged $n times at the default level, expected once"
grep -q 'error \[memserver\] the lease thread failed: test fault (RDMASWAP_TEST_THROW=lease); it starts again in 1 s' "$MEMSERVER_LOG" ||
    fail "the failure was not logged as an error naming the thread: $(grep 'lease thread' "$MEMSERVER_LOG")"
kill -0 "$MEMSERVER_PID" 2>/dev/null || fail "the memserver exited"
no_abort "$MEMSERVER_LOG" "the memserver"
log "lease thread: 3 failures logged once; served, and expired a detached session after"

# ---- An event loop: a clean stop, exit status 1 ----
port=$(free_port)
loop_log="$tmpdir/memserver-loop.log"
RDMASWAP_TEST_THROW=loop "$MEMSERVER" --listen 127.0.0.1 --port "$port" --capacity 16M \
    --slab-size 1M --transport tcp --threads 2 --auth-key "$AUTH_KEY" \
    </dev/null >"$loop_log" 2>&1 &
pid=$!
cleanup_pid "$pid"
wait_until 10 "the memserver listening" grep -q 'serving TCP' "$loop_log"
# The first connection (any client) makes its loop throw.
ctl_status "$port" >/dev/null 2>&1 || true
exited() { ! kill -0 "$pid" 2>/dev/null; }
wait_until 20 "the memserver to stop after its event loop failed" exited
rc=0
wait "$pid" || rc=$?
[[ $rc == 1 ]] || fail "the memserver exited with $rc, expected 1: $(tail -n 5 "$loop_log")"
no_abort "$loop_log" "the memserver"
grep -q 'error \[memserver\] event loop [0-9] failed: test fault (RDMASWAP_TEST_THROW=loop); the memserver stops (exit status 1)' "$loop_log" ||
    fail "the loop's failure was not logged: $(cat "$loop_log")"
grep -q 'stopped because event loop [0-9] failed' "$loop_log" ||
    fail "the exit does not say why: $(tail -n 3 "$loop_log")"
log "event loop: failure logged, clean stop, exit status 1"
log "PASS"
