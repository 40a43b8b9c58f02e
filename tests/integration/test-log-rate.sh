#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Session churn cannot flood the memserver's log: 2000 sessions opened and closed as fast as
# one key holder can (--connect-rate 0, so that only the log limit is tested) give at most 20
# "new session" / "ended" lines per 10 s for its address, and when a window ends one line
# that says how many were suppressed.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires_build memserver ctl
here=$(cd "$(dirname "$0")" && pwd)

start_memserver 16M 1M --connect-rate 0
t0=$SECONDS
"$PYTHON" "$here/helpers/limits-client.py" churn 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" 2000 \
    >"$tmpdir/churn.out" 2>&1 || { cat "$tmpdir/churn.out" >&2; fail "churn client"; }
took=$((SECONDS - t0))
cat "$tmpdir/churn.out" >&2
lines=$(grep -Ec 'new session|session [0-9a-f]+ ended' "$MEMSERVER_LOG" || true)
# At most 20 lines per started 10 s window (+ one window of slack for the clock).
max=$((20 * (took / 10 + 2)))
log "churn of 2000 sessions in $took s: $lines session lines in the memserver log (at most $max)"
((lines >= 20)) || fail "only $lines session lines: are sessions logged at all?"
((lines <= max)) || fail "$lines session lines for 2000 sessions in $took s: not rate-limited"
# When the window ends, one line says how many were suppressed; with the lines let through,
# that is every one of the 4000 (a "new session" and an "ended" per session).
wait_until 15 "a line that counts the suppressed session lines" \
    grep -Eq '[0-9]+ more session messages about clients at 127\.0\.0\.1 suppressed' "$MEMSERVER_LOG"
grep -E 'suppressed' "$MEMSERVER_LOG" >&2
counted=$(grep -Eo '[0-9]+ more session messages about clients at 127\.0\.0\.1 suppressed' \
    "$MEMSERVER_LOG" | awk '{ n += $1 } END { print n + 0 }')
log "$lines lines logged + $counted counted as suppressed"
((lines + counted == 4000)) || fail "$lines lines + $counted suppressed is not 4000"
