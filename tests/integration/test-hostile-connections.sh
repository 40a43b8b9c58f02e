#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Attacks that cost the memserver connections (slow senders that never finish the handshake,
# more idle connections than --max-connections, a storm of connects) while fio writes and
# verifies through nbdkit: fio passes every run, slow and idle peers are dropped within the
# handshake time, connections beyond the limit are closed at once, the warnings are
# rate-limited, and afterwards new clients get in.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl
here=$(cd "$(dirname "$0")" && pwd)

limit=24
start_memserver 64M 1M --max-connections $limit --handshake-timeout 1000
start_nbdkit fio -- server="$MEMSERVER_ADDR" size=24M channels=4

"$PYTHON" "$here/helpers/hostile-client.py" 127.0.0.1 "$MEMSERVER_PORT" 1 $limit \
    >"$tmpdir/hostile.out" 2>&1 &
attacker=$!
cleanup_pid $attacker

# fio write+verify, again and again, until the attacks are over (each run must pass).
fio_verify_until_done $attacker "$tmpdir/hostile.out" "under attack" \
    "the memserver did not defend itself"

kill -0 "$MEMSERVER_PID" 2>/dev/null || fail "memserver died"
wait_until 10 "rdmaswapctl status after the attacks" ctl_status "$MEMSERVER_PORT"
grep -Eq 'refused [0-9]+ connections from 127.0.0.1' "$MEMSERVER_LOG" || fail "no log line for refused connections"
grep -q 'handshake not finished' "$MEMSERVER_LOG" || fail "no log line for slow senders"
# Counted, not logged one by one: the hold phase alone had over 100 connections refused, the
# storm more; one line per kind of refusal (--max-connections, --connect-rate, ...) at most
# every 5 s, and at most 10 limit warnings per 10 s get through.
refusals=$(grep -Ec 'refused [0-9]+ connections' "$MEMSERVER_LOG" || true)
warnings=$(grep -c ' warning ' "$MEMSERVER_LOG" || true)
log "memserver log: $refusals lines about refused connections, $warnings warnings in all"
((refusals <= 20)) || fail "$refusals lines about refused connections: not rate-limited"
((warnings <= 80)) || fail "$warnings warnings: not rate-limited"
