#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A memserver impostor (no key, or another key) that answers garbage, a wrong MAC, a huge length,
# half a header, nothing, or "no authentication": nbdkit refuses to start against it, within its
# timeout and with a message (never a crash or a hang). And when a real memserver is replaced by
# an impostor on the same port while nbdkit runs, reads fail with EIO (never zeros, never a
# hang) and nbdkit survives.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl
here=$(cd "$(dirname "$0")" && pwd)

# start_impostor PORT MODE: sets IMPOSTOR_PID, IMPOSTOR_PORT, IMPOSTOR_STATE.
start_impostor() {
    IMPOSTOR_STATE="$tmpdir/impostor-$2.state"
    rm -f "$IMPOSTOR_STATE"
    "$PYTHON" "$here/helpers/impostor-server.py" "$1" "$IMPOSTOR_STATE" "$2" 2>>"$tmpdir/impostor.log" &
    IMPOSTOR_PID=$!
    cleanup_pid $IMPOSTOR_PID
    wait_until 10 "impostor ($2) listening" test -s "$IMPOSTOR_STATE"
    IMPOSTOR_PORT=$(sed -n 's/^port=\([0-9]*\).*/\1/p' "$IMPOSTOR_STATE")
}
impostor_connections() { sed -n 's/.*connections=\([0-9]*\).*/\1/p' "$IMPOSTOR_STATE"; }

declare -A expect=(
    [garbage]='protocol error|Connection reset'
    [wrong-mac]='did not prove it holds our auth key'
    [huge]='protocol error'
    [truncated]='no answer within the timeout'
    [silent]='no answer within the timeout'
    [insecure]='runs without authentication'
)
for mode in garbage wrong-mac huge truncated silent insecure; do
    start_impostor 0 "$mode"
    err="$tmpdir/nbdkit-$mode.err"
    rc=0
    start=$SECONDS
    timeout 30 nbdkit -f -U "$tmpdir/$mode.sock" "$PLUGIN" server="127.0.0.1:$IMPOSTOR_PORT" \
        size=16M timeout=2 auth-key="$AUTH_KEY" </dev/null >/dev/null 2>"$err" || rc=$?
    took=$((SECONDS - start))
    log "impostor $mode: nbdkit exit $rc after ${took}s: $(tr '\n' ' ' <"$err")"
    [[ $rc -ne 124 ]] || fail "impostor $mode: nbdkit still running after 30 s (hung?)"
    [[ $rc -ne 0 ]] || fail "impostor $mode: nbdkit started against an impostor"
    [[ $rc -lt 128 ]] || fail "impostor $mode: nbdkit died of a signal (exit $rc)"
    grep -Eq -- "${expect[$mode]}" "$err" || fail "impostor $mode: no message matching /${expect[$mode]}/"
    [[ $(impostor_connections) -ge 1 ]] || fail "impostor $mode: nbdkit never connected to it"
    kill $IMPOSTOR_PID
    wait $IMPOSTOR_PID 2>/dev/null || true
done

# At run time: the real memserver dies and an impostor takes its port.
start_memserver 16M 1M
start_nbdkit swap -- server="$MEMSERVER_ADDR" size=8M timeout=2 channels=2
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"\x5a" * (2 << 20), 0)' || fail "initial write failed"
kill -KILL "$MEMSERVER_PID"
wait "$MEMSERVER_PID" 2>/dev/null || true
reached=0
for mode in wrong-mac huge garbage; do
    start_impostor "$MEMSERVER_PORT" "$mode"
    NBDSH_TIMEOUT=40 nbdsh_run -u "$NBDKIT_URI" -c '
import errno, time
for what, op in (("read", lambda: h.pread(65536, 0)),
                 ("write", lambda: h.pwrite(b"\x11" * 65536, 1 << 20))):
    for attempt in range(3):
        start = time.monotonic()
        try:
            op()
        except nbd.Error as e:
            assert e.errnum == errno.EIO, "%s failed with %s, not EIO" % (what, e)
            assert time.monotonic() - start < 15, "%s took %.1f s to fail" % (what, time.monotonic() - start)
            continue
        raise SystemExit("%s against an impostor succeeded" % what)
' || fail "impostor $mode at run time: I/O did not fail cleanly with EIO"
    kill -0 "$NBDKIT_PID" 2>/dev/null || fail "nbdkit died against impostor $mode"
    log "impostor $mode at run time: EIO, nbdkit alive ($(impostor_connections) connections reached it)"
    reached=$((reached + $(impostor_connections)))
    kill $IMPOSTOR_PID
    wait $IMPOSTOR_PID 2>/dev/null || true
done
# The plugin's reconnects (after backoff) did meet the impostors: the EIOs above are theirs.
((reached > 0)) || fail "no reconnect of the plugin reached an impostor"
