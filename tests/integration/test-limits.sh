#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The memserver's limits on a key holder, each refused with its error and logged, while fio
# writes and verifies through nbdkit beside it: a BIND lease over --max-lease (ERANGE), an
# epoch floor over --max-floors (ENOSPC), a session over --max-peer-sessions from one address
# (EUSERS; released when a session ends). The plugin names --max-lease when its lease= is
# refused.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl
here=$(cd "$(dirname "$0")" && pwd)
"$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.4", 0))' 2>/dev/null ||
    skip "cannot bind 127.0.0.4 (loopback is not 127.0.0.0/8 here)"

start_memserver 64M 1M --max-lease 3600 --max-floors 1000 --max-peer-sessions 8
start_nbdkit fio -- server="$MEMSERVER_ADDR" size=24M channels=4

"$PYTHON" "$here/helpers/limits-client.py" refusals 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" \
    3600 1000 8 10 >"$tmpdir/limits.out" 2>&1 &
client=$!
cleanup_pid $client
fio_verify_until_done $client "$tmpdir/limits.out" "while a peer ran into its limits" \
    "a limit was not enforced"

kill -0 "$MEMSERVER_PID" 2>/dev/null || fail "memserver died"
grep -E 'BIND of volume limits-big-lease refused \(ERANGE\): lease 3601 s is over --max-lease 3600' \
    "$MEMSERVER_LOG" >&2 || fail "no log line for the refused lease"
grep -E 'SET_TAG refused \(ENOSPC\).*--max-floors 1000' "$MEMSERVER_LOG" >&2 ||
    fail "no log line for the refused floor"
grep -E 'HELLO refused \(EUSERS\): 8 sessions created from 127\.0\.0\.4.*--max-peer-sessions' \
    "$MEMSERVER_LOG" >&2 || fail "no log line for the refused session"

# The plugin: a lease= over the memserver's --max-lease is a start-up error that says so.
rc=0
timeout 30 nbdkit -f -U "$tmpdir/lease.sock" "$PLUGIN" server="$MEMSERVER_ADDR" size=4M \
    auth-key="$AUTH_KEY" volume=too-long lease=7200 </dev/null >/dev/null 2>"$tmpdir/lease.err" || rc=$?
log "nbdkit lease=7200 -> exit $rc: $(tr '\n' ' ' <"$tmpdir/lease.err")"
[[ $rc -ne 0 && $rc -ne 124 ]] || fail "nbdkit with lease=7200 did not fail at start (exit $rc)"
grep -q -- "--max-lease refused lease=7200" "$tmpdir/lease.err" ||
    fail "nbdkit's message does not name --max-lease"
