#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 25, defect 6: handshakes never wait behind the release and zeroing of slabs. With one
# worker (--workers 1), a prober's handshakes are timed while ended sessions' slabs are zeroed,
# and while a FREE's release waits for a connection's unread READ replies (counted by
# rdmaswap_memserver_slabs_zeroing); handshake-zeroing-client.py says what each phase checks.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires_build memserver ctl
here=$(cd "$(dirname "$0")" && pwd)

timeout_s=6
mport=$(free_port)
start_memserver 256M 16M --workers 1 --message-timeout $timeout_s \
    --metrics-listen "127.0.0.1:$mport"
"$PYTHON" "$here/helpers/handshake-zeroing-client.py" 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" \
    "http://127.0.0.1:$mport/metrics" $timeout_s >"$tmpdir/client.out" 2>&1 ||
    { cat "$tmpdir/client.out" >&2; fail "handshakes waited behind zeroing (see above)"; }
cat "$tmpdir/client.out" >&2
kill -0 "$MEMSERVER_PID" 2>/dev/null || fail "memserver died"
