# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# repkill-T (issue 4): replicated swap over T with a donor killed mid-run.  REP_SERVERS memservers
# on one address and consecutive ports, the plugin with every one as server=, replicas=REP_REPLICAS
# and statusfile=; the cgroup workload swaps, and once pswpout has grown by REP_KILL_AT pages while
# swapload still runs, the memserver holding the most slabs gets SIGKILL.  Then every page must
# verify, the kernel log must show no I/O error and no hung task, and the plugin's status must get
# back to full redundancy (degraded=0 lost=0 repaired>0) within REP_WAIT s; over RDMA the survivors
# must have served no TCP data operation (one-sided data path and repair).
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

full_redundancy() {
    [ "$(status_value degraded)" = 0 ] && [ "$(status_value lost)" = 0 ] \
        && [ "$(status_value repaired)" -gt 0 ] 2>/dev/null
}

repkill_run() {   # repkill_run tcp|rdma
    _t=$1
    CUR=repkill-$_t
    _r0=$(uptime_s)
    [ -z "${REP_BACKUP:-}" ] || CUR=backupkill-$_t
    say "===== $CUR: swap over $REP_SERVERS memservers ($_t), replicas=$REP_REPLICAS${REP_BACKUP:+ backup=$REP_BACKUP}, one killed mid-run ====="
    : > /run/nbdkit.log
    start_memservers "$REP_SERVERS" "$_t" "$REP_CAPACITY" "$REP_SLAB"
    rm -f "$STATUSFILE"
    # shellcheck disable=SC2086
    start_nbdkit rdmaswap $_servers "size=$REP_SIZE" "transport=$_t" "replicas=$REP_REPLICAS" \
        "statusfile=$STATUSFILE" "auth-key=$AUTH_KEY" ${REP_BACKUP:+"backup=$REP_BACKUP"} $PLUGIN_ARGS
    swap_on plain

    swapload_until_kill
    # the victim: the memserver that holds the most slabs now
    _victim=0
    _most=0
    _i=1
    while [ "$_i" -le "$REP_SERVERS" ]; do
        ctl_port "$(rep_port "$_i")" || fail "[$CUR] rdmaswapctl status of memserver $_i failed before the kill"
        _u=$(ctl_port_value "$(rep_port "$_i")" slabs_used)
        if [ "${_u:-0}" -gt "$_most" ]; then _most=$_u; _victim=$_i; fi
        _i=$((_i + 1))
    done
    [ "$_victim" -gt 0 ] || fail "[$CUR] no memserver holds a slab after pswpout +$REP_KILL_AT"
    _kout=$(($(vmstat pswpout) - _out0))
    _kin=$(($(vmstat pswpin) - _in0))
    _vpid=$(rep_pid "$_victim")
    say "[$CUR] $(elapsed "$_t0" "$(uptime_s)") s into swapload (pswpout +$_kout pswpin +$_kin):" \
        "kill -9 memserver $_victim (port $(rep_port "$_victim"), pid $_vpid, $_most slabs);" \
        "plugin: slabs_live=$(status_value slabs_live) degraded=$(status_value degraded)"
    kill -9 "$_vpid"
    wait "$_vpid" 2>/dev/null
    eval "REP_PID$_victim="
    alive "$_wpid" || fail "[$CUR] swapload was no longer running when the memserver died"

    swapload_after_kill kill
    W_MIB=$MIB
    [ "$W_OUT" -ge "$MIN_PSWPOUT" ] || fail "[$CUR] pswpout grew by $W_OUT pages, expected >= $MIN_PSWPOUT"
    alive "$NBDKIT_PID" || fail "[$CUR] nbdkit died"
    rmdir "$CG" 2>/dev/null
    check_dmesg

    _t1=$(uptime_s)
    if [ -n "${REP_BACKUP:-}" ]; then
        # The only donor is gone: every slab is served by the backup file, none is lost.
        sed "s/^/[$CUR] plugin status: /" "$STATUSFILE"
        [ "$(status_value lost)" = 0 ] || fail "[$CUR] lost=$(status_value lost) with backup="
        [ "$(status_value backup_only)" -gt 0 ] 2>/dev/null \
            || fail "[$CUR] backup_only=$(status_value backup_only): the backup file served nothing"
        [ "$(status_value backup_errors)" = 0 ] || fail "[$CUR] backup_errors=$(status_value backup_errors)"
    else
    wait_until "$REP_WAIT" full_redundancy \
        || { sed "s/^/[$CUR] plugin status: /" "$STATUSFILE"; fail "[$CUR] not back to full redundancy within $REP_WAIT s: degraded=$(status_value degraded) lost=$(status_value lost) repaired=$(status_value repaired)"; }
    sed "s/^/[$CUR] plugin status: /" "$STATUSFILE"
    say "[$CUR] full redundancy $(elapsed "$_t1" "$(uptime_s)") s after the workload:" \
        "repaired=$(status_value repaired) repair_bytes=$(status_value repair_bytes)" \
        "server_failures=$(status_value server_failures)"
    fi
    [ "$(status_value server_failures)" -gt 0 ] 2>/dev/null \
        || fail "[$CUR] the plugin counted no donor failure after the kill"
    _i=1
    while [ "$_i" -le "$REP_SERVERS" ]; do
        if [ "$_i" != "$_victim" ]; then
            _p=$(rep_port "$_i")
            ctl_port "$_p" || fail "[$CUR] rdmaswapctl status of memserver $_i failed after the workload"
            say "[$CUR] memserver $_i: $(grep -E '^(slabs_used|tcp_(read|write)_(ops|bytes)|rdma_qps)=' "/run/ctl-$_p.out" | tr '\n' ' ')"
            if [ "$_t" = rdma ]; then
                for _k in tcp_read_ops tcp_write_ops tcp_read_bytes tcp_write_bytes; do
                    [ "$(ctl_port_value "$_p" "$_k")" = 0 ] \
                        || fail "[$CUR] memserver $_i: $_k=$(ctl_port_value "$_p" "$_k") (expected 0: one-sided RDMA)"
                done
            fi
        fi
        _i=$((_i + 1))
    done
    swap_off
    stop_nbdkit
    stop_memservers "$REP_SERVERS"
    check_dmesg
    echo "$CUR $W_SECS $W_OUT $W_IN $W_MIB" >> /run/bench.txt
    say "[$CUR] PASS: swapload $W_SECS s (whole run $(elapsed "$_r0" "$(uptime_s)") s)," \
        "pswpout +$W_OUT, pswpin +$W_IN, killed memserver $_victim mid-run"
}
