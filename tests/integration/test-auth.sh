#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Authentication: the memserver refuses to start without a key (or --insecure) and with a key
# others can read; nbdkit and rdmaswapctl need the key too; a wrong key or none gets nothing (no
# stats, no session) and is logged with the peer's address, rate-limited; a memserver given two
# keys (a rotation) serves clients of either; --insecure / insecure=true work together, warn, and
# a client with a key refuses an --insecure server.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

# memserver_refuses REGEX ARGS...: the memserver must exit non-zero at once, saying REGEX.
memserver_refuses() {
    local regex=$1 rc=0
    shift
    timeout 20 "$MEMSERVER" --listen 127.0.0.1 --port 0 --capacity 4M --slab-size 1M \
        --transport tcp "$@" </dev/null >"$tmpdir/refused.log" 2>&1 || rc=$?
    log "memserver $* -> exit $rc: $(tr '\n' ' ' <"$tmpdir/refused.log")"
    [[ $rc -ne 0 && $rc -ne 124 ]] || fail "memserver $* did not refuse to start (exit $rc)"
    grep -Eq -- "$regex" "$tmpdir/refused.log" || fail "memserver $*: no message matching /$regex/"
}
memserver_refuses '--auth-key.*--insecure'
cp "$AUTH_KEY" "$tmpdir/open.key" && chmod 644 "$tmpdir/open.key"
memserver_refuses 'other users.*chmod 600' --auth-key "$tmpdir/open.key"
printf 'short\n' >"$tmpdir/short.key" && chmod 600 "$tmpdir/short.key"
memserver_refuses 'too short' --auth-key "$tmpdir/short.key"
memserver_refuses 'exclude' --auth-key "$AUTH_KEY" --insecure

start_memserver 16M 1M
other="$tmpdir/other.key"
make_key "$other"

# rdmaswapctl: no key is a usage error; a wrong key gets no stats.
rc=0
"$RDMASWAPCTL" status "server=$MEMSERVER_ADDR" >"$tmpdir/ctl.out" 2>&1 || rc=$?
[[ $rc -eq 2 ]] && grep -q 'auth-key' "$tmpdir/ctl.out" || fail "rdmaswapctl without a key: exit $rc: $(cat "$tmpdir/ctl.out")"
rc=0
"$RDMASWAPCTL" status "server=$MEMSERVER_ADDR" auth-key="$other" >"$tmpdir/ctl.out" 2>&1 || rc=$?
[[ $rc -eq 1 ]] || fail "rdmaswapctl with another key: exit $rc"
grep -q '^error=authentication failed' "$tmpdir/ctl.out" || fail "rdmaswapctl with another key: $(cat "$tmpdir/ctl.out")"
grep -q '^capacity=' "$tmpdir/ctl.out" && fail "rdmaswapctl got stats with another key"
rc=0
"$RDMASWAPCTL" status "server=$MEMSERVER_ADDR" insecure=true >"$tmpdir/ctl.out" 2>&1 || rc=$?
grep -q '^error=authentication failed' "$tmpdir/ctl.out" || fail "rdmaswapctl insecure=true: $(cat "$tmpdir/ctl.out")"

# nbdkit: a key is required; a wrong key or none fails at startup with a message.
nbdkit_fails() {
    local regex=$1 rc=0
    shift
    timeout 30 nbdkit -f -U "$tmpdir/bad.sock" "$PLUGIN" server="$MEMSERVER_ADDR" size=4M "$@" \
        </dev/null >/dev/null 2>"$tmpdir/bad.err" || rc=$?
    log "nbdkit $* -> exit $rc: $(tr '\n' ' ' <"$tmpdir/bad.err")"
    [[ $rc -ne 0 && $rc -ne 124 && $rc -lt 128 ]] || fail "nbdkit $*: exit $rc"
    grep -Eq -- "$regex" "$tmpdir/bad.err" || fail "nbdkit $*: no message matching /$regex/"
}
nbdkit_fails 'auth-key=FILE is required'
nbdkit_fails 'authentication failed' auth-key="$other"
nbdkit_fails 'authentication failed' insecure=true
nbdkit_fails 'other users' auth-key="$tmpdir/open.key"
nbdkit_fails 'exclude' auth-key="$AUTH_KEY" insecure=true
# The memserver logged the failures with the peer's address, and handed out nothing.
grep -q '127.0.0.1:[0-9]*: authentication failed: unknown key' "$MEMSERVER_LOG" ||
    fail "memserver did not log the failed authentication with the peer address"
grep -q 'STATS before authentication' "$MEMSERVER_LOG" ||
    fail "memserver did not log a request before authentication"
[[ $(ctl_get "$MEMSERVER_PORT" sessions) -eq 0 ]] || fail "a session exists after failed logins"

# Rate-limited: 60 failed logins make at most 10 log lines per 10 s.
"$PYTHON" - "$MEMSERVER_PORT" "$other" <<'PY'
import os, sys
sys.path.insert(0, os.environ["RDMASWAP_SOURCE"] + "/tests/integration/helpers")
import rdmaswap_wire as wire
port, key = int(sys.argv[1]), wire.load_key(sys.argv[2])
for _ in range(60):
    s = wire.connect("127.0.0.1", port)
    assert wire.authenticate(s, key) == wire.EACCES
    s.close()
PY
lines=$(grep -c 'authentication failed' "$MEMSERVER_LOG")
log "after 60 more failed logins the memserver log has $lines lines about failed logins"
((lines <= 20)) || fail "failed logins are not rate-limited ($lines lines)"

# Rotation: a memserver with the old and the new key serves clients of both.
stop_pid() { kill "$1"; wait "$1" 2>/dev/null || true; }
stop_pid "$MEMSERVER_PID"
start_memserver 16M 1M --auth-key "$AUTH_KEY" --auth-key "$other"
grep -q '2 auth key(s)' "$MEMSERVER_LOG" || fail "memserver does not say it has two keys"
start_nbdkit old -- server="$MEMSERVER_ADDR" size=4M auth-key="$AUTH_KEY"
old_uri=$NBDKIT_URI
start_nbdkit new -- server="$MEMSERVER_ADDR" size=4M auth-key="$other"
for uri in "$old_uri" "$NBDKIT_URI"; do
    nbdsh_run -u "$uri" -c '
data = bytes(range(256)) * 4096
h.pwrite(data, 4096)
assert h.pread(len(data), 4096) == data
' || fail "read/write through $uri during a key rotation failed"
done
[[ $(ctl_get "$MEMSERVER_PORT" sessions) -eq 2 ]] || fail "expected two sessions (old and new key)"
CTL_AUTH="auth-key=$other" ctl_status "$MEMSERVER_PORT" >/dev/null || fail "rdmaswapctl with the new key"

# --insecure: warned about, works with insecure=true, and a client with a key refuses it.
stop_pid "$MEMSERVER_PID"
CTL_AUTH=insecure=true
start_memserver 16M 1M --insecure
grep -q 'authentication is OFF' "$MEMSERVER_LOG" || fail "memserver --insecure does not warn"
start_nbdkit insecure -- server="$MEMSERVER_ADDR" size=4M insecure=true
grep -q 'insecure=true' "$NBDKIT_LOG" || fail "plugin insecure=true does not warn"
nbdsh_run -u "$NBDKIT_URI" -c '
h.pwrite(b"\x42" * 65536, 0)
assert h.pread(65536, 0) == b"\x42" * 65536
' || fail "read/write without authentication failed"
nbdkit_fails 'runs without authentication' auth-key="$AUTH_KEY"
log "authentication OK"
