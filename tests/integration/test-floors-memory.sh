#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Memory goes back to the system when a session with many epoch floors expires: two detached
# sessions with 500,000 floors each (--max-floors 1000000) raise the memserver's resident
# memory by some 30 MB; once their lease has expired it must be back within 10 % of that
# above where it started. (The memserver's heap is locked, so malloc_trim alone could not do
# it: the floors live in mappings of their own, unmapped with them; memserver/floors.h.)
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires_build memserver ctl
here=$(cd "$(dirname "$0")" && pwd)

start_memserver 16M 1M --max-floors 1000000
r0=$(proc_kb "$MEMSERVER_PID" VmRSS)
"$PYTHON" "$here/helpers/limits-client.py" floors 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" 2 500000 2 \
    >"$tmpdir/floors.out" 2>&1 || { cat "$tmpdir/floors.out" >&2; fail "floors client"; }
r1=$(proc_kb "$MEMSERVER_PID" VmRSS)
expired() { (($(grep -c 'lease expired' "$MEMSERVER_LOG" || true) >= 2)); }
wait_until 20 "both leases expired" expired
sleep 0.5
r2=$(proc_kb "$MEMSERVER_PID" VmRSS)
log "memserver VmRSS: $r0 kB at start, $r1 kB with 1,000,000 floors in 2 detached sessions, $r2 kB after they expired"
((r1 - r0 >= 20000)) || fail "the floors took only $((r1 - r0)) kB: nothing to measure"
if [[ ${RDMASWAP_SANITIZER:-} == thread ]]; then
    log "ThreadSanitizer build: resident memory not checked"
    exit 0
fi
((r2 - r0 <= (r1 - r0) / 10)) ||
    fail "$((r2 - r0)) kB of the floors' $((r1 - r0)) kB still resident after they expired"
