#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What rdmaswap-memserver.service (Type=notify) relies on: with NOTIFY_SOCKET set, the
# memserver sends READY=1 once, and by then it answers on its port; SIGTERM then ends it with
# status 0. The notify socket is a Unix datagram socket in the test's directory, like systemd's.
set -euo pipefail
source "$(dirname "$0")/../integration/functions.sh"
requires_build memserver ctl

sock=$tmpdir/notify.sock
port=$(free_port)
# Listen first, then start the memserver; print each datagram as it arrives.
"$PYTHON" -u -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print("bound", flush=True)
s.settimeout(60)
while True:
    print(s.recv(4096).decode(), flush=True)
' "$sock" >"$tmpdir/notify.txt" 2>"$tmpdir/notify.err" &
cleanup_pid $!
wait_until 10 "notify listener" grep -q bound "$tmpdir/notify.txt"

NOTIFY_SOCKET=$sock "$MEMSERVER" --listen 127.0.0.1 --port "$port" --capacity 64M \
    --slab-size 1M --transport tcp --auth-key "$AUTH_KEY" </dev/null >"$tmpdir/memserver.log" 2>&1 &
pid=$!
cleanup_pid $pid
wait_until 30 "READY=1 on $sock" grep -qx READY=1 "$tmpdir/notify.txt"
# READY=1 means listening: rdmaswapctl must answer right away, with the full capacity locked.
ctl_status "$port" >"$tmpdir/status.txt" || fail "memserver did not answer right after READY=1"
grep -qx capacity=67108864 "$tmpdir/status.txt" || fail "wrong capacity after READY=1"
grep -q 'memory locked' "$tmpdir/memserver.log" || fail "memserver does not say its memory is locked"
[[ $(grep -c . "$tmpdir/notify.txt") == 2 ]] || fail "expected exactly one message:"$'\n'"$(cat "$tmpdir/notify.txt")"

kill -TERM $pid
for ((i = 0; i < 100; i++)); do
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
done
kill -0 $pid 2>/dev/null && fail "memserver still running 10 s after SIGTERM"
rc=0
wait $pid || rc=$?
[[ $rc == 0 ]] || fail "memserver exited with $rc after SIGTERM, expected 0"
log "READY=1 sent when listening; SIGTERM exit 0"
