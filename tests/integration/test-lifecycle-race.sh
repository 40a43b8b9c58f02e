#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Session transitions on the memserver happen in one step: with a test hook that pauses inside
# the detach of a session and inside a takeover (RDMASWAP_TEST_LIFECYCLE_PAUSE_MS), a client
# that rejoins its session, or a new client that takes its volume over, during the pause keeps
# every slab with its bytes, and an ended session cannot be joined (lifecycle-client.py says
# what each case checks).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires_build memserver ctl
here=$(cd "$(dirname "$0")" && pwd)

pause_ms=1500
RDMASWAP_TEST_LIFECYCLE_PAUSE_MS=$pause_ms start_memserver 4M 64K
"$PYTHON" "$here/helpers/lifecycle-client.py" 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" "$MEMSERVER_LOG" \
    "$(awk -v ms=$pause_ms 'BEGIN { print ms / 1000 }')" >"$tmpdir/client.out" 2>&1 || {
    cat "$tmpdir/client.out" >&2
    fail "a session transition was interleaved (see above)"
}
cat "$tmpdir/client.out" >&2
kill -0 "$MEMSERVER_PID" 2>/dev/null || fail "memserver died"
grep -q 'took over 3 slabs' "$MEMSERVER_LOG" || fail "no log line for the takeover of 3 slabs"
