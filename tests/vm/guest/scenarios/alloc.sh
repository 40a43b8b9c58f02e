# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# alloc-T (issue 5): tests/alloc's allocation counter (LD_PRELOAD) in nbdkit with the plugin and in
# the memserver, the data path over T.  nbddrive writes the whole 64 MiB device, warms up, then
# counts over ALLOC_REQUESTS mixed 4/32/128 KiB reads and writes (4 connections, 16 in flight each);
# every count must be 0.  Control: a new NBD connection must make nbdkit allocate and rdmaswapctl
# status the memserver, or the counter is blind.
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

alloc_env() {   # alloc_env KEY PROGRAM: the command words that run PROGRAM under the counter
    mkfifo "/run/alloc-$1.ctl" || fail "mkfifo /run/alloc-$1.ctl"
    echo "env LD_PRELOAD=$ALLOC_LIB ALLOC_COUNTER_COMM=$2 ALLOC_COUNTER_CTL=/run/alloc-$1.ctl ALLOC_COUNTER_OUT=/run/alloc-$1.count ALLOC_COUNTER_TRACE=/run/alloc-$1.trace"
}
alloc_count() { sed -n 's/^allocs=\([0-9]*\) .*/\1/p' "/run/alloc-$1.count"; }
alloc_answered() { grep -q "^$2" "/run/alloc-$1.count" 2>/dev/null; }
alloc_counting() {   # alloc_counting 0|1: every counter, and wait for its answer
    _want=counting
    [ "$1" = 0 ] && _want=allocs=
    for _k in ms nbdkit; do printf '%s' "$1" > "/run/alloc-$_k.ctl"; done
    for _k in ms nbdkit; do
        wait_until 10 alloc_answered "$_k" "$_want" || fail "[$CUR] $_k did not answer '$1' within 10 s"
    done
}

alloc_run() {   # alloc_run tcp|rdma
    _t=$1
    CUR=alloc-$_t
    _r0=$(uptime_s)
    say "===== $CUR: heap allocations on the data path over $_t ($ALLOC_REQUESTS requests) ====="
    rm -f /run/alloc-*
    MS_WRAP=$(alloc_env ms rdmaswap-memserver)
    NBDKIT_WRAP=$(alloc_env nbdkit nbdkit)
    _cap=$CAPACITY
    _slab=$SLAB
    # 1 MiB slabs, as in tests/alloc: 128 KiB requests cross slab boundaries too
    CAPACITY=64M
    SLAB=1M
    : > /run/nbdkit.log
    start_memserver "$_t"
    # shellcheck disable=SC2086
    start_nbdkit rdmaswap "server=$ADDR:$PORT" size=64M "transport=$_t" "auth-key=$AUTH_KEY" \
        $PLUGIN_ARGS
    CAPACITY=$_cap
    SLAB=$_slab
    MS_WRAP=""
    NBDKIT_WRAP=""
    for _p in "$MS_PID" "$NBDKIT_PID"; do
        grep -q librdmaswap-alloc-counter "/proc/$_p/maps" \
            || fail "[$CUR] the allocation counter is not loaded in pid $_p"
    done
    ctl_ok || fail "[$CUR] rdmaswapctl status failed"
    _ops0=$(($(ctl_value tcp_read_ops) + $(ctl_value tcp_write_ops)))
    _t0=$(uptime_s)
    : > /run/nbddrive.out
    tail -f /run/nbddrive.out &   # its progress lines on the console
    _tail=$!
    run_bounded "$ALLOC_WAIT" /run/nbddrive.out nbddrive --socket "$SOCK" --requests "$ALLOC_REQUESTS" \
        --warmup 1000 --ctl /run/alloc-ms.ctl:/run/alloc-ms.count,/run/alloc-nbdkit.ctl:/run/alloc-nbdkit.count
    _rc=$?
    sleep 1
    kill "$_tail" 2>/dev/null
    wait "$_tail" 2>/dev/null
    say "[$CUR] nbddrive exit $_rc after $(elapsed "$_t0" "$(uptime_s)") s"
    [ "$_rc" = 124 ] && fail "[$CUR] nbddrive did not finish within $ALLOC_WAIT s"
    [ "$_rc" = 0 ] || fail "[$CUR] nbddrive failed (exit $_rc)"
    alive "$NBDKIT_PID" && alive "$MS_PID" || fail "[$CUR] nbdkit or the memserver died"
    _bad=""
    for _k in ms nbdkit; do
        say "[$CUR] $_k: $(cat "/run/alloc-$_k.count") over $ALLOC_REQUESTS requests"
        if [ "$(alloc_count "$_k")" != 0 ]; then
            file_tail "/run/alloc-$_k.trace" 200 "$_k: backtraces of the first allocations"
            _bad="$_bad $_k:$(alloc_count "$_k")"
        fi
    done
    [ -z "$_bad" ] || fail "[$CUR] heap allocations in steady state:$_bad"
    ctl_ok || fail "[$CUR] rdmaswapctl status failed"
    sed "s/^/[$CUR] status: /" /run/ctl.out
    _ops=$(($(ctl_value tcp_read_ops) + $(ctl_value tcp_write_ops) - _ops0))
    case "$_t" in
        rdma) [ "$_ops" = 0 ] || fail "[$CUR] the memserver served $_ops TCP data operations (expected 0: one-sided RDMA)" ;;
        tcp) [ "$_ops" -ge "$ALLOC_REQUESTS" ] || fail "[$CUR] the memserver served $_ops TCP data operations, expected >= $ALLOC_REQUESTS" ;;
    esac
    # control: the counter sees allocations where there must be some
    alloc_counting 1
    run_bounded 30 /run/nbddrive-hs.out nbddrive --socket "$SOCK" --handshake-only \
        || { cat /run/nbddrive-hs.out; fail "[$CUR] control: a new NBD connection failed"; }
    ctl_ok || fail "[$CUR] control: rdmaswapctl status failed"
    alloc_counting 0
    for _k in ms nbdkit; do
        [ "$(alloc_count "$_k")" -gt 0 ] 2>/dev/null \
            || fail "[$CUR] control: $_k counted no allocation for a new connection: the counter is blind"
        say "[$CUR] control: $_k counted $(alloc_count "$_k") allocations for a new connection"
    done
    stop_nbdkit
    stop_memserver
    check_dmesg
    say "[$CUR] PASS: 0 allocations over $ALLOC_REQUESTS requests" \
        "($(sed -n 's/^nbddrive: OK //p' /run/nbddrive.out)); whole run $(elapsed "$_r0" "$(uptime_s)") s"
}
