# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# reattach-T and persist-T: nbdkit killed (-9) and restarted with the same volume= within the
# lease; the new plugin takes the slabs over from the memservers (RDMA: re-registered in the new
# session's PD).  REA_SERVERS memservers over T (ports PORT, PORT+1, ...), the plugin with
# volume=REA_VOLUME lease=REA_LEASE replicas=REA_SERVERS statusfile=; the restarted nbdkit gets
# volume=REA_VOLUME2 (default the same; another name must make the run FAIL, as must lease=0).
#   reattach-T: block level.  nbd-client (no swap) writes REA_MIB MiB of random data with
#     conv=fsync, nbdkit is killed, /dev/nbd0 disconnected, the memservers must show the
#     session detached, a new nbdkit starts, its status must say reattached=<every written
#     chunk> lost=0, the memservers the volume's session live again, nbd-client connects again
#     and every byte read back (page cache dropped) must match.
#   persist-T: swap with `nbd-client -swap -persist -nonetlink` (-persist does nothing in
#     nbd-client's default netlink mode: it exits once the kernel has the socket), the cgroup
#     workload, nbdkit killed once pswpout has grown by MIB*64 pages, a new one started on the
#     same socket: nbd-client must reconnect the kernel's device and swapload must verify every
#     page.  Kept as a run to show what this kernel and nbd-client do (README); not in CI.
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

rea_detached() { ctl_port "$(rep_port "$1")" && [ "$(ctl_port_value "$(rep_port "$1")" sessions_detached)" = 1 ]; }
rea_no_session() { ctl_port "$(rep_port "$1")" && ! grep -q '^session\.' "/run/ctl-$(rep_port "$1").out"; }
# rea_session_line I: the session line of volume $REA_VOLUME2 on memserver I
rea_session_line() { grep -E "^session\.[0-9]+=.* volume=$REA_VOLUME2 " "/run/ctl-$(rep_port "$1").out" | head -n 1; }
rea_status_ready() { [ -s "$STATUSFILE" ] && [ -n "$(status_value reattached)" ]; }

# rea_start_nbdkit VOLUME T
rea_start_nbdkit() {
    rm -f "$STATUSFILE"
    # shellcheck disable=SC2086
    start_nbdkit rdmaswap $_rservers "size=$_rsize" "transport=$2" "replicas=$REA_SERVERS" \
        "volume=$1" "lease=$REA_LEASE" "statusfile=$STATUSFILE" "auth-key=$AUTH_KEY" $PLUGIN_ARGS
}

# rea_kill_nbdkit: SIGKILL, and every memserver must show the dead plugin's session detached
rea_kill_nbdkit() {
    _kp=$NBDKIT_PID
    kill -9 "$_kp"
    wait "$_kp" 2>/dev/null
    NBDKIT_PID=""
    _tk=$(uptime_s)
    _i=1
    while [ "$_i" -le "$REA_SERVERS" ]; do
        if [ "$REA_LEASE" = 0 ]; then
            # lease=0: the memservers free the slabs at once (the run must then FAIL below)
            wait_until 30 rea_no_session "$_i" \
                || { cat "/run/ctl-$(rep_port "$_i").out"; fail "[$CUR] lease=0: memserver $_i still holds the killed plugin's session after 30 s"; }
        else
            wait_until 30 rea_detached "$_i" \
                || { cat "/run/ctl-$(rep_port "$_i").out"; fail "[$CUR] memserver $_i does not show the killed plugin's session detached within 30 s"; }
        fi
        _i=$((_i + 1))
    done
    _what="its session detached"
    [ "$REA_LEASE" = 0 ] && _what="no session (lease=0: freed)"
    say "[$CUR] nbdkit (pid $_kp) killed -9; every memserver shows $_what after" \
        "$(elapsed "$_tk" "$(uptime_s)") s: $(grep -E '^session\.' "/run/ctl-$(rep_port 1).out" | head -n 1)"
}

# rea_check_takeover: the new plugin reattached every chunk, the memservers say so
rea_check_takeover() {
    wait_until 20 rea_status_ready || { file_tail "$STATUSFILE" 30 "plugin statusfile"; fail "[$CUR] the new plugin wrote no reattached= to $STATUSFILE within 20 s"; }
    _chunks=$(status_value reattached)
    say "[$CUR] new plugin: reattached=$_chunks reattach_stale=$(status_value reattach_stale)" \
        "lost=$(status_value lost) degraded=$(status_value degraded) slabs_live=$(status_value slabs_live)"
    grep -h -E 'reattached|took over' /run/nbdkit.log | sed "s/^/[$CUR] nbdkit: /" | tail -n 3
    [ "$_chunks" -gt 0 ] 2>/dev/null || fail "[$CUR] the new plugin reattached no chunk (reattached=${_chunks:-missing})"
    [ -z "$1" ] || [ "$_chunks" -ge "$1" ] || fail "[$CUR] the new plugin reattached $_chunks chunks, expected >= $1"
    [ "$(status_value lost)" = 0 ] || fail "[$CUR] the new plugin reports lost=$(status_value lost)"
    _i=1
    while [ "$_i" -le "$REA_SERVERS" ]; do
        _p=$(rep_port "$_i")
        ctl_port "$_p" || fail "[$CUR] rdmaswapctl status of memserver $_i failed after the restart"
        _l=$(rea_session_line "$_i")
        say "[$CUR] memserver $_i: $_l; $(grep -h 'reattached: session' "/run/memserver-$_i.log" | tail -n 1)"
        case "$_l" in
            *" state=live "*) ;;
            *) fail "[$CUR] memserver $_i shows no live session of volume $REA_VOLUME2 after the restart" ;;
        esac
        [ "$(ctl_port_value "$_p" sessions_detached)" = 0 ] \
            || fail "[$CUR] memserver $_i still has a detached session after the restart (not taken over)"
        grep -q "volume $REA_VOLUME2 reattached: session" "/run/memserver-$_i.log" \
            || fail "[$CUR] memserver $_i did not log the take-over of volume $REA_VOLUME2"
        if [ "$2" = rdma ]; then
            case "$_l" in *" rdma") ;; *) fail "[$CUR] memserver $_i: the new session is not on RDMA" ;; esac
        fi
        _i=$((_i + 1))
    done
}

reattach_run() {   # reattach_run block|swap tcp|rdma
    _kind=$1
    _t=$2
    [ "$_kind" = block ] && CUR=reattach-$_t || CUR=persist-$_t
    _r0=$(uptime_s)
    say "===== $CUR: nbdkit killed -9 and restarted (volume=$REA_VOLUME -> $REA_VOLUME2, lease=$REA_LEASE), $REA_SERVERS memservers ($_t), $_kind level ====="
    : > /run/nbdkit.log
    # the swap workload needs the repkill runs' sizes (256M device, 16M slabs)
    _rcap=$REA_CAPACITY
    _rslab=$REA_SLAB
    _rsize=$REA_SIZE
    if [ "$_kind" = swap ]; then
        _rcap=$REP_CAPACITY
        _rslab=$REP_SLAB
        _rsize=$REP_SIZE
    fi
    start_memservers "$REA_SERVERS" "$_t" "$_rcap" "$_rslab"
    _rservers=$_servers
    rea_start_nbdkit "$REA_VOLUME" "$_t"
    if [ "$_kind" = block ]; then
        nbd_connect
        dd if=/dev/urandom of=/run/pattern bs=1M count="$REA_MIB" 2> /dev/null
        _t0=$(uptime_s)
        run_bounded 120 /run/dd-write.log dd if=/run/pattern of=/dev/nbd0 bs=1M conv=fsync \
            || { cat /run/dd-write.log; fail "[$CUR] writing $REA_MIB MiB to /dev/nbd0 failed"; }
        _t1=$(uptime_s)
        # the status file is rewritten every second
        wait_until 5 eval '[ "$(status_value slabs_live)" -gt 0 ] 2>/dev/null' \
            || fail "[$CUR] the plugin's status shows no live slab after the write (slabs_live=$(status_value slabs_live))"
        say "[$CUR] $REA_MIB MiB of random data written in $(elapsed "$_t0" "$_t1") s;" \
            "plugin: slabs_live=$(status_value slabs_live)"
        rea_kill_nbdkit
        # the kernel's socket is dead: take the device down (nbd-client in netlink mode cannot
        # reconnect it), as a restart script would, and connect it again to the new nbdkit
        nbd_disconnect
        rea_start_nbdkit "$REA_VOLUME2" "$_t"
        # every slab-sized chunk the pattern touched
        _slabk=$(size_kib "$_rslab")
        rea_check_takeover $(((REA_MIB * 1024 + _slabk - 1) / _slabk)) "$_t"
        nbd_connect
        echo 3 > /proc/sys/vm/drop_caches
        _t0=$(uptime_s)
        run_bounded 120 /run/dd-read.log dd if=/dev/nbd0 of=/run/readback bs=1M count="$REA_MIB" \
            || { cat /run/dd-read.log; fail "[$CUR] reading /dev/nbd0 after the restart failed"; }
        if ! cmp /run/pattern /run/readback > /run/cmp.out 2>&1; then
            _z="not all zeros"
            [ "$(tr -d '\000' < /run/readback | head -c 1 | wc -c)" = 0 ] && _z="all zeros"
            fail "[$CUR] /dev/nbd0 read back different bytes after the restart ($(head -n 1 /run/cmp.out); what was read is $_z)"
        fi
        say "[$CUR] all $REA_MIB MiB read back intact through the restarted nbdkit in" \
            "$(elapsed "$_t0" "$(uptime_s)") s"
        rm -f /run/pattern /run/readback
        nbd_disconnect
    else
        swap_on_persist
        swapload_until_kill
        _kout=$(($(vmstat pswpout) - _out0))
        _kin=$(($(vmstat pswpin) - _in0))
        say "[$CUR] $(elapsed "$_t0" "$(uptime_s)") s into swapload (pswpout +$_kout pswpin +$_kin): kill -9 nbdkit"
        rea_kill_nbdkit
        rea_start_nbdkit "$REA_VOLUME2" "$_t"
        rea_check_takeover 1 "$_t"
        sleep 3   # nbd-client -persist retries once a second
        _st=running
        alive "$NBDC_PID" || { wait "$NBDC_PID"; _st="exited with status $?"; }
        say "[$CUR] nbd-client (pid $NBDC_PID) $_st; its output: $(tr '\n' ' ' < /run/nbd-client-persist.log)"
        say "[$CUR] kernel: $(dmesg | grep -E 'nbd0: (Dead connection|shutting down|Receive control failed)' | head -n 3 | tr '\n' ' ')"
        swapload_after_kill restart
        rmdir "$CG" 2>/dev/null
        check_dmesg
        run_bounded 180 /run/swapoff.log swapoff /dev/nbd0 \
            || { cat /run/swapoff.log; fail "swapoff /dev/nbd0 failed or hung"; }
        run_bounded 60 /run/nbd-client-d.log nbd-client -nonetlink -d /dev/nbd0 \
            || { cat /run/nbd-client-d.log; fail "nbd-client -nonetlink -d /dev/nbd0 failed or hung"; }
        wait_until 30 nbd_gone || fail "/dev/nbd0 still has a size after nbd-client -d"
        wait_until 30 eval '! alive $NBDC_PID' || fail "[$CUR] nbd-client -persist still runs 30 s after nbd-client -d"
        wait "$NBDC_PID" 2>/dev/null
    fi
    check_dmesg
    stop_nbdkit
    stop_memservers "$REA_SERVERS"
    check_dmesg
    if [ "$_kind" = block ]; then
        echo "$CUR $(elapsed "$_r0" "$(uptime_s)") 0 0 $REA_MIB" >> /run/bench.txt
    else
        echo "$CUR $W_SECS $W_OUT $W_IN $MIB" >> /run/bench.txt
    fi
    say "[$CUR] PASS: nbdkit killed -9 and restarted, reattached=$_chunks chunks," \
        "content intact; whole run $(elapsed "$_r0" "$(uptime_s)") s"
}

# swap_on_persist: nbd-client in ioctl mode with -persist (it stays, and is to reconnect the
# device when its socket dies), in the foreground (-nofork) as a background job, so that its
# messages land in /run/nbd-client-persist.log; mkswap, swapon
NBDC_PID=""
swap_on_persist() {
    nbd-client -unix "$SOCK" /dev/nbd0 -b 4096 -swap -persist -nonetlink -nofork \
        > /run/nbd-client-persist.log 2>&1 &
    NBDC_PID=$!
    wait_until 30 nbd_size_ok || { cat /run/nbd-client-persist.log; fail "[$CUR] nbd-client -persist -nonetlink: /dev/nbd0 has no size after 30 s"; }
    say "[$CUR] nbd-client -swap -persist -nonetlink -nofork: pid $NBDC_PID, /dev/nbd0" \
        "$(($(cat /sys/block/nbd0/size) / 2048)) MiB"
    SWAPDEV=/dev/nbd0
    mkswap /dev/nbd0 > /run/mkswap.log 2>&1 || { cat /run/mkswap.log; fail "mkswap /dev/nbd0 failed"; }
    swapon /dev/nbd0 || fail "swapon /dev/nbd0 failed"
}
