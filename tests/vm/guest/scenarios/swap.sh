# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# swap runs [pressure-][crypt-]memory|tcp|rdma: swap over NBD through the real kernel.  The
# workload (swapload, every page verified) runs in the memory-limited cgroup, or (pressure-) on
# the whole VM, whose memory is then short (nbdkit and the memserver must be locked and
# SCHED_RR); the swap device is /dev/nbd0, or (crypt-) dm-crypt over it, and then no plaintext
# page may reach the memserver.  Over tcp|rdma the memserver must hold slabs, and over RDMA it
# must have moved no page with its CPU (one-sided).
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

meminfo_line() {
    echo "MemTotal $(meminfo_kib MemTotal) MemFree $(meminfo_kib MemFree)" \
        "MemAvailable $(meminfo_kib MemAvailable) Mlocked $(meminfo_kib Mlocked)" \
        "SwapFree $(meminfo_kib SwapFree) (kB)"
}

# pressure_workload LABEL: memory pressure on the whole VM (no cgroup).  The memserver's pool is
# allocated and locked by now (checked), nbdkit runs with --swap; swapload then needs
# MemAvailable + PRESSURE_EXTRA MiB, so at least PRESSURE_EXTRA MiB must go to swap.
# Sets W_SECS, W_OUT, W_IN, W_MIB.
pressure_workload() {
    if [ -n "$MS_PID" ]; then
        _lck=$(proc_status_kib "$MS_PID" VmLck)
        _cap=$(size_kib "$CAPACITY")
        say "[$1] memserver VmLck ${_lck:-?} kB (capacity $_cap kB)," \
            "nbdkit VmLck $(proc_status_kib "$NBDKIT_PID" VmLck) kB"
        [ "${_lck:-0}" -ge "$_cap" ] \
            || fail "[$1] the memserver's pool is not locked: VmLck ${_lck:-?} kB < capacity $_cap kB"
        _nrt=$(not_realtime "$MS_PID")
        [ "$REALTIME" = 0 ] || [ -z "$_nrt" ] \
            || fail "[$1] memserver threads not SCHED_RR (tid:policy): $_nrt"
    fi
    # The plugin's realtime=1 (default): nbdkit's threads may use the reserve below the min
    # watermark, which swapload cannot (README, "A second cycle").
    _nrt=$(not_realtime "$NBDKIT_PID")
    if [ "$REALTIME" = 1 ]; then
        [ -z "$_nrt" ] || fail "[$1] nbdkit threads not SCHED_RR (tid:policy): $_nrt"
        say "[$1] every nbdkit${MS_PID:+ and memserver} thread is SCHED_RR"
    else
        say "[$1] --no-realtime: nbdkit and memserver at normal priority (diagnostic run)"
    fi
    _avail=$(meminfo_kib MemAvailable)
    W_MIB=$((_avail / 1024 + PRESSURE_EXTRA))
    _min=$((PRESSURE_EXTRA * 128))   # half of the overflow, in pages
    say "[$1] $(meminfo_line); min_free_kbytes $(cat /proc/sys/vm/min_free_kbytes)"
    _out0=$(vmstat pswpout)
    _in0=$(vmstat pswpin)
    say "[$1] swapload --mib $W_MIB (MemAvailable + $PRESSURE_EXTRA MiB) --passes $PASSES," \
        "no cgroup: the whole VM is short of memory"
    _t0=$(uptime_s)
    _ncpu0=$(cpu_s "$NBDKIT_PID")
    _mcpu0=$(cpu_s "${MS_PID:-0}")
    # shellcheck disable=SC2086
    run_bounded "$WORK_TIMEOUT" /run/swapload.out \
        swapload --mib "$W_MIB" --passes "$PASSES" --seed "$SEED" $SWAPLOAD_ARGS
    _rc=$?
    _t1=$(uptime_s)
    say "[$1] CPU seconds during swapload: nbdkit $(echo "$(cpu_s "$NBDKIT_PID") $_ncpu0" | awk '{ print $1 - $2 }')${MS_PID:+, memserver $(echo "$(cpu_s "$MS_PID") $_mcpu0" | awk '{ print $1 - $2 }')}"
    W_OUT=$(($(vmstat pswpout) - _out0))
    W_IN=$(($(vmstat pswpin) - _in0))
    W_SECS=$(elapsed "$_t0" "$_t1")
    cat /run/swapload.out
    say "[$1] swapload exit $_rc in $W_SECS s: pswpout +$W_OUT pswpin +$W_IN pages;" \
        "swap used $(swap_used_kib) KiB now; $(meminfo_line)"
    [ "$_rc" = 124 ] && fail "[$1] swapload did not finish within $WORK_TIMEOUT s (whole-VM pressure: hang?)"
    alive "$NBDKIT_PID" || fail "[$1] nbdkit died during the pressure run"
    [ -z "$MS_PID" ] || alive "$MS_PID" || fail "[$1] the memserver died during the pressure run"
    [ "$_rc" = 137 ] && fail "[$1] swapload was killed (OOM?): $(dmesg | grep -m1 -E 'Killed process|oom-kill')"
    grep -q '^swapload: OK pages=' /run/swapload.out \
        || fail "[$1] $(grep -m1 'MISMATCH' /run/swapload.out || echo "exit $_rc, no OK line")"
    [ "$_rc" = 0 ] || fail "[$1] swapload exit status $_rc"
    [ "$W_OUT" -ge "$_min" ] || fail "[$1] pswpout grew by $W_OUT pages, expected >= $_min"
    [ "$W_IN" -gt 0 ] || fail "[$1] pswpin did not grow"
}

# plaintext_check LABEL crypt|plain: count swapload's pages in the local memserver's memory.
# Without dm-crypt the swapped-out pages are there one for one (this also proves the scan works);
# through dm-crypt there must be none.
plaintext_check() {
    [ -n "$MS_PID" ] || return 0
    if ! command -v memscan > /dev/null 2>&1; then
        say "[$1] memscan not in the image; skipping the plaintext check"
        return 0
    fi
    run_bounded 120 /run/memscan.out memscan --pid "$MS_PID" --seed "$SEED" \
        || { cat /run/memscan.out; fail "[$1] memscan of the memserver failed"; }
    say "[$1] $(cat /run/memscan.out)"
    _n=$(sed -n 's/.* pages=\([0-9]*\) .*/\1/p' /run/memscan.out)
    [ -n "$_n" ] || fail "[$1] memscan printed no page count"
    if [ "$2" = crypt ]; then
        [ "$_n" = 0 ] || fail "[$1] the memserver holds $_n swapload pages in plaintext behind dm-crypt"
    else
        [ "$_n" -gt 0 ] || fail "[$1] memscan found no swapload page in the memserver without dm-crypt (the plaintext check cannot be trusted)"
    fi
}

# swap_run RUN: RUN is [pressure-][crypt-]memory|tcp|rdma: the workload in the memory-limited
# cgroup, or (pressure-) on the whole VM; the swap device /dev/nbd0, or (crypt-) dm-crypt over it.
# Sets up, swaps, checks, tears down.  Appends a line to /run/bench.txt.
swap_run() {
    _run=$1
    _kind=cgroup
    _crypt=plain
    case "$_run" in pressure-*) _kind=pressure; _run=${_run#pressure-} ;; esac
    case "$_run" in crypt-*) _crypt=crypt; _run=${_run#crypt-} ;; esac
    case "$_run" in memory|tcp|rdma) ;; *) fail "unknown run '$1'" ;; esac
    say "===== $1: swap over NBD ($_run, $_kind, $_crypt) ====="
    if [ "$_kind" = pressure ]; then
        MS_LOG=/dev/console
        NBDKIT_LOG=/dev/console
        # if something hangs: the hung-task reports with their stacks (KERN_INFO) on the console
        dmesg -n 7
    fi
    setup_backend "$_run"
    CUR=$1
    swap_on "$_crypt"
    if [ "$_kind" = pressure ]; then
        pressure_workload "$1"
    else
        swap_workload "$1"
    fi
    case "$_run" in tcp|rdma) check_server_stats "$_run"; plaintext_check "$1" "$_crypt" ;; esac
    check_dmesg
    swap_off
    teardown_backend
    check_dmesg
    echo "$1 $W_SECS $W_OUT $W_IN $W_MIB" >> /run/bench.txt
    MS_LOG=/run/memserver.log
    NBDKIT_LOG=/run/nbdkit.log
    dmesg -n 5
    say "[$1] PASS: $W_SECS s, pswpout +$W_OUT, pswpin +$W_IN"
}
