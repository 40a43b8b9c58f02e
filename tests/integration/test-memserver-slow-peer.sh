#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Per-message deadlines on the memserver (--message-timeout 2): a key holder that starts a
# WRITE and trickles its payload, or that does not read its READ replies, loses its connection
# within the timeout; the release of the slab it held waits asleep (the memserver's CPU stays
# low) and then succeeds; and a client doing verified I/O meanwhile (a wire-level verifier,
# then fio write+verify through nbdkit) sees no error. slow-peer-client.py says what each
# mode checks.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl
here=$(cd "$(dirname "$0")" && pwd)

timeout_s=2
start_memserver 64M 1M --message-timeout $timeout_s
client() {
    "$PYTHON" "$here/helpers/slow-peer-client.py" 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" \
        "$MEMSERVER_PID" $timeout_s "$@"
}

# 1. A trickling WRITE while another connection frees its slab, with a verifier beside.
client free >"$tmpdir/free.out" 2>&1 || { cat "$tmpdir/free.out" >&2; fail "mode free (see above)"; }
cat "$tmpdir/free.out" >&2

# 2. Tricklers and a slow reader while fio writes and verifies through nbdkit.
start_nbdkit fio -- server="$MEMSERVER_ADDR" size=24M channels=4
client attack >"$tmpdir/attack.out" 2>&1 &
attacker=$!
cleanup_pid $attacker
fio_verify_until_done $attacker "$tmpdir/attack.out" "beside slow peers" \
    "slow peers were not dropped in time"

kill -0 "$MEMSERVER_PID" 2>/dev/null || fail "memserver died"
grep -q 'WRITE not received whole within 2000 ms' "$MEMSERVER_LOG" || fail "no log line for a trickling WRITE"
grep -q 'READ reply not taken within 2000 ms' "$MEMSERVER_LOG" || fail "no log line for a slow reader"
