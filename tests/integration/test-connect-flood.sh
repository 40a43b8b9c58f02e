#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A reconnect flood from one address must not starve another: conn-flood connects from
# 127.0.0.3 as fast as it can (aiming at 10 k/s; each of its 2 threads keeps its last 200
# connections open, like clients reconnecting in a loop) while a legitimate key holder from
# 127.0.0.2 opens 200 connections (20 a second), each doing AUTH + HELLO within 3 s. At least
# 90 % of them must succeed (--connect-rate and --max-peer-connections, defaults), the
# memserver must say how many connections it dropped from 127.0.0.3, in a bounded number of
# lines, and it must still answer afterwards. Before these limits, 16-27 % got through (the
# flood filled --max-connections and the accept loop fell behind: the flood reached only
# 765-1132 connects/s).
# FLOOD_ARGS: extra memserver arguments (--connect-rate 0: only --max-peer-connections);
# FLOOD_HOLD: connections each flood thread keeps open (default 200; 0: close at once).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires_build memserver ctl
here=$(cd "$(dirname "$0")" && pwd)
flood="$RDMASWAP_BUILD/tests/integration/conn-flood"
[[ -x $flood ]] || fail "not built: $flood"
"$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.3", 0))' 2>/dev/null ||
    skip "cannot bind 127.0.0.3 (loopback is not 127.0.0.0/8 here)"

# shellcheck disable=SC2086 # FLOOD_ARGS is a list of words
start_memserver 64M 1M ${FLOOD_ARGS:-}
cpu0=$(awk '{ print $14 + $15 }' "/proc/$MEMSERVER_PID/stat")
"$flood" 127.0.0.3 127.0.0.1 "$MEMSERVER_PORT" 16 10000 2 "${FLOOD_HOLD:-200}" >"$tmpdir/flood.out" 2>&1 &
flooder=$!
cleanup_pid $flooder
sleep 2 # the flood is at full speed
"$PYTHON" "$here/helpers/limits-client.py" legit 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" \
    127.0.0.2 200 20 3 >"$tmpdir/legit.out" 2>&1 || { cat "$tmpdir/legit.out" >&2; fail "legit client"; }
kill -0 $flooder 2>/dev/null || fail "the flood ended before the legitimate client did: $(cat "$tmpdir/flood.out")"
wait $flooder || fail "conn-flood failed: $(cat "$tmpdir/flood.out")"
cpu1=$(awk '{ print $14 + $15 }' "/proc/$MEMSERVER_PID/stat")
cat "$tmpdir/flood.out" "$tmpdir/legit.out" >&2
log "memserver CPU during the flood: $(((cpu1 - cpu0) * 1000 / $(getconf CLK_TCK))) ms"
rate=$(sed -n 's/^flood: .*(\([0-9]*\)\/s).*/\1/p' "$tmpdir/flood.out")
ok=$(sed -n 's/^legit: \([0-9]*\) of .*/\1/p' "$tmpdir/legit.out")
[[ -n $rate && -n $ok ]] || fail "no result from the flood or the legitimate client"
# On a machine too busy to flood, the test proves nothing.
((rate >= 2000)) || fail "the flood reached only $rate connects/s (want 10000, at least 2000)"
((ok >= 180)) || fail "only $ok of 200 legitimate connections got through a flood of $rate/s"

kill -0 "$MEMSERVER_PID" 2>/dev/null || fail "memserver died"
wait_until 10 "rdmaswapctl status after the flood" ctl_status "$MEMSERVER_PORT"
grep -E 'refused [0-9]+ connections? .*from 127\.0\.0\.3.*--connect-rate' "$MEMSERVER_LOG" >&2 ||
    fail "no log line counting the connections dropped from 127.0.0.3"
lines=$(wc -l <"$MEMSERVER_LOG")
log "memserver log: $lines lines"
((lines <= 60)) || fail "$lines log lines during a flood: not rate-limited"
