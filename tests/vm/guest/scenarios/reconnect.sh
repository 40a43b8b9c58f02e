# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# reconnect-T: swap that survives an nbdkit restart.  /dev/nbd0 attached by `rdmaswap-nbd
# connect --connections CONNS --dead-conn-timeout REC_DEAD --timeout REC_TIMEOUT` (netlink; the tool exits, the
# kernel holds the socket), mkswap, swapon, swapload (REC_MIB MiB) in the cgroup; once pswpout
# has grown by REC_MIB*64 pages, nbdkit gets kill -9; the memservers keep the slabs (lease), a
# new nbdkit with the same arguments and socket takes them over and `rdmaswap-nbd reconnect
# --statusfile` (refuses if the new plugin reattached nothing) hands the kernel a new socket
# (NBD_CMD_RECONFIGURE).  The kernel holds the requests meanwhile.
# Checks: swapload OK (every page verified), pswpin grew after the restart, the new plugin
# reattached > 0 chunks with lost=0, no I/O error or hung task in dmesg.  REC_SKIP=1 leaves the
# reconnect out: then the run must FAIL (requests fail once the dead-connection timeout ends).
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

reconnect_run() {   # reconnect_run tcp|rdma
    _t=$1
    CUR=reconnect-$_t
    _r0=$(uptime_s)
    say "===== $CUR: swap across an nbdkit restart (kill -9, volume=$REA_VOLUME -> $REA_VOLUME2, lease=$REA_LEASE), rdmaswap-nbd connect/reconnect, $REA_SERVERS memservers ($_t) ====="
    : > /run/nbdkit.log
    _mib_saved=$MIB
    _kill_saved=$REP_KILL_AT
    MIB=$REC_MIB
    REP_KILL_AT=$((REC_MIB * 64))
    start_memservers "$REA_SERVERS" "$_t" "$REC_SIZE" "$REC_SLAB"
    _rservers=$_servers
    _rsize=$REC_SIZE
    rea_start_nbdkit "$REA_VOLUME" "$_t"
    run_bounded 60 /run/rdmaswap-nbd.log rdmaswap-nbd connect --socket "$SOCK" --device /dev/nbd0 \
        --connections "$CONNS" --block-size 4096 --dead-conn-timeout "$REC_DEAD" --timeout "$REC_TIMEOUT"
    _rc=$?
    cat /run/rdmaswap-nbd.log
    [ "$_rc" = 0 ] || fail "[$CUR] rdmaswap-nbd connect failed (exit $_rc)"
    wait_until 30 nbd_size_ok || fail "[$CUR] /dev/nbd0 has no size after rdmaswap-nbd connect"
    SWAPDEV=/dev/nbd0
    mkswap /dev/nbd0 > /run/mkswap.log 2>&1 || { cat /run/mkswap.log; fail "mkswap /dev/nbd0 failed"; }
    swapon /dev/nbd0 || fail "swapon /dev/nbd0 failed"
    swapload_until_kill
    _kout=$(($(vmstat pswpout) - _out0))
    _kin=$(($(vmstat pswpin) - _in0))
    say "[$CUR] $(elapsed "$_t0" "$(uptime_s)") s into swapload (pswpout +$_kout pswpin +$_kin): kill -9 nbdkit"
    _tk0=$(uptime_s)
    rea_kill_nbdkit
    rea_start_nbdkit "$REA_VOLUME2" "$_t"
    if [ "$REC_SKIP" = 1 ]; then
        say "[$CUR] REC_SKIP=1: no rdmaswap-nbd reconnect (this run must FAIL)"
    else
        run_bounded 90 /run/rdmaswap-nbd.log rdmaswap-nbd reconnect --socket "$SOCK" --device /dev/nbd0 \
            --connections "$CONNS" --statusfile "$STATUSFILE"
        _rc=$?
        cat /run/rdmaswap-nbd.log
        [ "$_rc" = 0 ] || fail "[$CUR] rdmaswap-nbd reconnect failed (exit $_rc)"
        say "[$CUR] reconnected $(elapsed "$_tk0" "$(uptime_s)") s after the kill"
    fi
    rea_check_takeover 1 "$_t"
    say "[$CUR] kernel: $(dmesg | grep -E 'nbd0: ' | tail -n 4 | tr '\n' ' ')"
    swapload_after_kill restart
    [ $((W_OUT - _kout)) -gt 0 ] || fail "[$CUR] nothing was swapped out after the restart"
    rmdir "$CG" 2>/dev/null
    check_dmesg
    run_bounded 180 /run/swapoff.log swapoff /dev/nbd0 \
        || { cat /run/swapoff.log; fail "swapoff /dev/nbd0 failed or hung"; }
    run_bounded 60 /run/rdmaswap-nbd.log rdmaswap-nbd disconnect --device /dev/nbd0 \
        || { cat /run/rdmaswap-nbd.log; fail "[$CUR] rdmaswap-nbd disconnect failed or hung"; }
    wait_until 30 nbd_gone || fail "[$CUR] /dev/nbd0 still has a size after rdmaswap-nbd disconnect"
    check_dmesg
    stop_nbdkit
    stop_memservers "$REA_SERVERS"
    check_dmesg
    MIB=$_mib_saved
    REP_KILL_AT=$_kill_saved
    echo "$CUR $W_SECS $W_OUT $W_IN $REC_MIB" >> /run/bench.txt
    say "[$CUR] PASS: swap survived nbdkit kill -9 + restart, reattached=$_chunks chunks," \
        "every page verified; whole run $(elapsed "$_r0" "$(uptime_s)") s"
}
