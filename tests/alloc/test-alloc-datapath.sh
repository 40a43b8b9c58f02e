#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The data paths make no heap allocation in steady state.
#
# Usage: test-alloc-datapath.sh [REPLICAS]   (default 1; with 2, two memservers and replicas=2)
#
# The allocation-counting shim (alloc_counter.c) is preloaded into each memserver (TCP) and into
# nbdkit running the plugin, so each count covers a whole process: nbdkit itself, the plugin and
# its threads. drive.py writes every slab once and warms up, then all processes count over
# REQUESTS (default 120000) random 4 KiB / 128 KiB reads and writes on 4 connections, 16 in
# flight each. Every count must be 0; on failure the first allocations' backtraces are shown.
# A control round then checks that the shim does count: a new NBD connection makes nbdkit
# allocate, and rdmaswapctl status makes each memserver allocate.
# The RDMA data path needs Soft-RoCE: tests/vm's alloc-rdma run uses this same shim there.
set -euo pipefail
source "$(dirname "$0")/../integration/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl
requires nbdinfo --version
: "${ALLOC_COUNTER_LIB:?set ALLOC_COUNTER_LIB to the built librdmaswap-alloc-counter.so}"
[[ -f $ALLOC_COUNTER_LIB ]] || fail "not built: $ALLOC_COUNTER_LIB"
replicas=${1:-1}
requests=${REQUESTS:-120000}
size=64M
size_bytes=$((64 * 1024 * 1024))

# with_counter KEY PROGRAM COMMAND...: run COMMAND with the shim preloaded, counting only in
# the process running PROGRAM, controlled through $tmpdir/KEY.ctl, counts in KEY.count,
# backtraces in KEY.trace.
counters=()
with_counter() {
    local key=$1 prog=$2
    shift 2
    mkfifo "$tmpdir/$key.ctl"
    counters+=("$key")
    LD_PRELOAD=$ALLOC_COUNTER_LIB ALLOC_COUNTER_COMM=$prog ALLOC_COUNTER_CTL=$tmpdir/$key.ctl \
        ALLOC_COUNTER_OUT=$tmpdir/$key.count ALLOC_COUNTER_TRACE=$tmpdir/$key.trace "$@"
}
# allocs KEY: the allocation count in KEY.count.
allocs() { sed -n 's/^allocs=\([0-9]*\) .*/\1/p' "$tmpdir/$1.count"; }
# counting 0|1: stop or start counting in every process, and wait until each has answered.
counting() {
    local key want=counting i
    [[ $1 == 0 ]] && want=allocs=
    for key in "${counters[@]}"; do
        echo -n "$1" >"$tmpdir/$key.ctl"
    done
    for key in "${counters[@]}"; do
        for ((i = 0; i < 100; i++)); do
            grep -q "^$want" "$tmpdir/$key.count" 2>/dev/null && break
            sleep 0.1
        done
        grep -q "^$want" "$tmpdir/$key.count" || fail "$key did not answer '$1' within 10 s"
    done
}

# Slabs of 1M so that 128 KiB requests also cross slab boundaries.
servers=()
ports=()
pids=()
for ((i = 1; i <= replicas; i++)); do
    with_counter "memserver$i" rdmaswap-memserver start_memserver "$size" 1M
    servers+=("server=$MEMSERVER_ADDR")
    ports+=("$MEMSERVER_PORT")
    pids+=("$MEMSERVER_PID")
done
with_counter nbdkit nbdkit start_nbdkit alloc -- \
    "${servers[@]}" size="$size" transport=tcp channels=8 replicas="$replicas"
pids+=("$NBDKIT_PID")
# The shim must be in every process, or the counts below prove nothing.
for pid in "${pids[@]}"; do
    grep -q librdmaswap-alloc-counter "/proc/$pid/maps" || fail "shim not loaded in pid $pid"
done

# tcp_ops: data operations all memservers have served so far.
tcp_ops() {
    local port n=0
    for port in "${ports[@]}"; do
        n=$((n + $(ctl_get "$port" tcp_read_ops) + $(ctl_get "$port" tcp_write_ops)))
    done
    echo $n
}
ops_before=$(tcp_ops)
ctl=()
for key in "${counters[@]}"; do
    ctl+=("$tmpdir/$key.ctl:$tmpdir/$key.count")
done
timeout 240 "$PYTHON" "$(dirname "$0")/drive.py" "$NBDKIT_URI" "$size_bytes" "$requests" \
    "$(IFS=,; echo "${ctl[*]}")" || fail "drive.py failed"
ops_after=$(tcp_ops)
kill -0 "${pids[@]}" || fail "a server died during the run"

rc=0
for key in "${counters[@]}"; do
    log "$key: $(cat "$tmpdir/$key.count") over $requests requests"
    n=$(allocs "$key")
    if [[ $n != 0 ]]; then
        echo "FAIL: $key made $n heap allocations in steady state; first backtraces:" >&2
        head -n 200 "$tmpdir/$key.trace" >&2 || true
        rc=1
    fi
done
# Counted outside the window (so the memservers allocate nothing meanwhile), warm-up included.
# Every request reaches at least one memserver (a write reaches every replica, a read one).
served=$((ops_after - ops_before))
log "memservers served $served TCP data operations during the run"
((served >= requests)) || fail "memservers served only $served operations, expected >= $requests"

# Control: the shim does see allocations where there must be some.
counting 1
timeout 20 nbdinfo --size "$NBDKIT_URI" >/dev/null || fail "nbdinfo failed"
for port in "${ports[@]}"; do
    ctl_status "$port" >/dev/null || fail "rdmaswapctl status failed"
done
counting 0
for key in "${counters[@]}"; do
    n=$(allocs "$key")
    ((n > 0)) || fail "control: $key counted no allocation for a new connection: the shim is blind"
    log "control: $key counted $n allocations for a new connection"
done
exit $rc
