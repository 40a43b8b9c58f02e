#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Slow clients cannot take the memserver's /metrics from a scraper (issue 26, S12). Ten clients
# at 127.0.0.1 trickle requests they never finish and reconnect whenever closed, while a
# scraper at 127.0.0.2 fetches /metrics twelve times: every scrape must succeed within 2 s
# (before the fix, 8 slow connections took all 8 slots: scrapes were refused). The server holds
# at most 2 connections per address, and a client at 127.0.0.3 trickling one byte every 0.2 s
# must be cut at the 2 s request deadline (before, every byte restarted a 10 s idle timeout:
# it was never cut). The memserver's own port keeps answering meanwhile. About 10 s.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires_build memserver ctl
ip -4 addr show lo 2>/dev/null | grep -q '127.0.0.1/8' || skip "no 127.0.0.0/8 on lo (needs 127.0.0.2, 127.0.0.3)"

start_memserver 16M 1M --metrics-listen 127.0.0.1:0
wait_until 10 "the memserver's metrics line" grep -q 'serving metrics on http://' "$MEMSERVER_LOG"
mport=$(sed -n 's|.*serving metrics on http://127\.0\.0\.1:\([0-9]*\)/metrics.*|\1|p' "$MEMSERVER_LOG")
[[ -n $mport ]] || fail "no metrics port in the memserver's log"

timeout 60 "$PYTHON" "$(dirname "$0")/helpers/metrics-slow-client.py" "$mport" 10 12 2 \
    >"$tmpdir/slow.out" 2>"$tmpdir/slow.err" &
client=$!
cleanup_pid "$client"
# The data side is unaffected: rdmaswapctl status answers while the slow clients run.
sleep 2
ctl_status "$MEMSERVER_PORT" >/dev/null || fail "the memserver's port did not answer during the slow clients"
wait "$client" || { cat "$tmpdir/slow.err" >&2; fail "the slow-client script failed"; }
cat "$tmpdir/slow.out" >&2
val() { sed -n "s/^$1=//p" "$tmpdir/slow.out"; }

ok=$(val scrapes_ok) held=$(val slow_held_max) cut=$(val trickler_closed_after)
[[ $ok == 12 ]] || { cat "$tmpdir/slow.err" >&2; fail "$ok of 12 scrapes from 127.0.0.2 succeeded within 2 s beside 10 slow clients at 127.0.0.1"; }
[[ $held -ge 1 && $held -le 2 ]] || fail "the slow clients at 127.0.0.1 held $held connections at once (the limit per address is 2)"
[[ $cut =~ ^[0-9.]+$ ]] || fail "the trickler at 127.0.0.3 was not cut at the request deadline: $cut"
awk -v t="$cut" 'BEGIN { exit !(t >= 1.5 && t <= 3.5) }' ||
    fail "the trickler was cut after $cut s, not at the 2 s request deadline"
grep -q 'ERROR\|error\]' "$MEMSERVER_LOG" && { cat "$MEMSERVER_LOG" >&2; fail "errors in the memserver's log"; }
lines=$(grep -c '\[metrics\]' "$MEMSERVER_LOG" || true)
((lines <= 12)) || fail "$lines metrics log lines: the library's refusals are not rate-limited"
log "12 of 12 scrapes (slowest $(val scrape_max) s), slow clients held $held at once, trickler cut after $cut s, $lines metrics log lines"
