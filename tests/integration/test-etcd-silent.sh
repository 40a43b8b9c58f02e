#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 26, S6: start-up probes run in parallel under one overall deadline. With a real etcd on
# loopback listing one real donor and 12 silent addresses (listening sockets held by this test
# that accept and never answer), nbdkit timeout=2:
# 1. A first start (every donor may hold slabs, so every one is probed) is serving within
#    timeout= plus a small margin (5 s here), not 12 x timeout= (c230031 probed one at a time:
#    10 silent addresses took 20.4 s at timeout=2), and serves from the real donor.
# 2. A restart (the holders record names the real donor only) is as quick, and the silent
#    addresses, extra candidates, do not fail it.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires etcdctl version
requires_build memserver plugin

start_etcd_cluster 1
prefix=/rdmaswap-silent-test/
ectl() { timeout 10 etcdctl --endpoints "$ETCD_ENDPOINTS" --dial-timeout=2s --command-timeout=5s "$@"; }
registered() { [[ -n $(ectl get --print-value-only "${prefix}donors/$1") ]]; }
reg_args=(--etcd "$ETCD_ENDPOINTS" --advertise @ADDR@ --etcd-prefix "$prefix")
donor_is() { grep -q "^donor\.[0-9]*=$1 state=$2 " "$tmpdir/status" 2>/dev/null; }

# 12 listening sockets that never accept: a connect succeeds (the kernel's backlog), the
# handshake is never answered.
"$PYTHON" -c '
import socket, sys, time
socks = []
for _ in range(12):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    socks.append(s)
with open(sys.argv[1] + ".new", "w") as f:
    f.write(" ".join("127.0.0.1:%d" % s.getsockname()[1] for s in socks) + "\n")
import os
os.rename(sys.argv[1] + ".new", sys.argv[1])
time.sleep(600)' "$tmpdir/silent" &
cleanup_pid $!
wait_until 10 "the silent sockets" test -s "$tmpdir/silent"
read -r -a silent <"$tmpdir/silent"
timeout 30 "$PYTHON" "$(dirname "$0")/helpers/etcd-junk.py" "${ETCD_CLIENT_URLS[0]}" "$prefix" addrs "${silent[@]}" ||
    fail "cannot register the silent addresses"
start_memserver 16M 1M "${reg_args[@]}"
addr=$MEMSERVER_ADDR
wait_until 10 "registration of $addr" registered "$addr"

timed_start() {
    local t0 t1
    rm -f "$tmpdir/status"
    t0=$(date +%s%N)
    start_nbdkit "$1" -- etcd="$ETCD_ENDPOINTS" etcd-prefix="$prefix" size=8M replicas=1 \
        timeout=2 lease=60 statusfile="$tmpdir/status"
    t1=$(date +%s%N)
    took_ms=$(((t1 - t0) / 1000000))
    log "$1 start with ${#silent[@]} silent addresses registered: $took_ms ms"
    ((took_ms <= 5000)) || fail "the $1 start took $took_ms ms (timeout=2)"
    wait_until 10 "donor $addr in use" donor_is "$addr" ok
}

timed_start first
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"\x17" * (1 << 20), 0)' || fail "the write failed"
stop_nbdkit_clean
timed_start second
nbdsh_run -u "$NBDKIT_URI" -c 'assert h.pread(1 << 20, 0) == b"\x17" * (1 << 20)' ||
    fail "reading back after the restart failed"
stop_nbdkit_clean
log "PASS"
