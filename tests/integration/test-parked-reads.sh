#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 25, defect 2: a connection parked on a worker (here by a FREE) whose own READ replies are
# not taken must not hold that worker. 6 connections (the memserver has 4 workers) each ALLOC a
# slab, send 8 pipelined 1 MiB READs of it and a FREE, and read nothing; a fresh client must
# still get through HELLO, ALLOC and FREE within a few seconds, the hostile connections must be
# dropped within --message-timeout, every slab must come back, and SIGTERM with such
# connections in place must end the memserver within a few seconds. parked-reads-client.py says
# what each step checks. Then, with a test hook that keeps a BIND's worker (and so its
# connection) parked longer than --message-timeout, the parked connection's queued replies must
# still go out, and time out (parked-pause-client.py).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires_build memserver ctl
here=$(cd "$(dirname "$0")" && pwd)

timeout_s=4
start_memserver 64M 1M --message-timeout $timeout_s --workers 4
"$PYTHON" "$here/helpers/parked-reads-client.py" 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" \
    "$MEMSERVER_PID" $timeout_s >"$tmpdir/client.out" 2>&1 ||
    { cat "$tmpdir/client.out" >&2; fail "parked connections held the memserver (see above)"; }
cat "$tmpdir/client.out" >&2
grep -q 'reply not taken within' "$MEMSERVER_LOG" || fail "no log line for the unread replies"
wait "$MEMSERVER_PID" || fail "the memserver exited with status $? on SIGTERM"
grep -q 'stopped' "$MEMSERVER_LOG" || fail "the memserver did not log its stop"

# A connection parked for longer than --message-timeout (a takeover paused by the test hook).
pause_ms=8000
RDMASWAP_TEST_LIFECYCLE_PAUSE_MS=$pause_ms start_memserver 64M 1M --message-timeout 3
"$PYTHON" "$here/helpers/parked-pause-client.py" 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" \
    "$MEMSERVER_LOG" "$(awk -v ms=$pause_ms 'BEGIN { print ms / 1000 }')" 3 \
    >"$tmpdir/pause.out" 2>&1 ||
    { cat "$tmpdir/pause.out" >&2; fail "a parked connection's replies were held (see above)"; }
cat "$tmpdir/pause.out" >&2
