# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# twohost: VM A (server) runs the memserver on its eth0/rxe0; VM B (client) runs nbdkit with the
# plugin over RDMA, nbd-client and swap.  The VMs talk through qemu's socket netdev (the host's
# loopback).  Messages (peer_send/peer_recv): B -> A "scan" once B's swap run is done and its
# pages are still in A's pool; A scans its memserver and answers "scanned N"; B tears down and
# sends "done"; A stops its memserver.  Either side sends "FAIL ..." when it fails.
# ETCD=1 (run-vm-test.sh --etcd): A also runs a single-member etcd on $ETCD_URL, its memserver
# registers there (--etcd --advertise), and B's plugin gets etcd= and no server=: it must find
# the donor through etcd.
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

# etcdctl_run ARGS...: etcdctl against A's etcd, bounded; its output in /run/etcdctl.out
etcdctl_run() {
    run_bounded 20 /run/etcdctl.out etcdctl --endpoints "$ETCD_URL" --dial-timeout=2s \
        --command-timeout=5s "$@"
}
# etcd_donor_listed: the only key under <prefix>donors/ is the memserver's, its addr its own
etcd_donor_listed() {
    etcdctl_run get --prefix "${ETCD_PREFIX}donors/" || return 1
    [ "$(wc -l < /run/etcdctl.out)" = 2 ] && [ "$(sed -n 1p /run/etcdctl.out)" = "$DONOR_KEY" ] \
        && sed -n 2p /run/etcdctl.out | grep -qF "\"addr\":\"$ADDR:$PORT\""
}
etcd_ready() { alive "$ETCD_PID" && etcdctl_run endpoint health; }

start_etcd() {
    say "[server] starting etcd $(etcd --version 2>/dev/null | sed -n 's/^etcd Version: //p') on $ETCD_URL"
    etcd --name vm-a --data-dir /run/etcd --listen-client-urls "$ETCD_URL" \
        --advertise-client-urls "$ETCD_URL" --listen-peer-urls "http://$ADDR:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://$ADDR:$ETCD_PEER_PORT" \
        --initial-cluster "vm-a=http://$ADDR:$ETCD_PEER_PORT" --initial-cluster-state new \
        --heartbeat-interval 100 --election-timeout 500 --logger zap --log-level warn \
        > /run/etcd.log 2>&1 &
    ETCD_PID=$!
    _t0=$(uptime_s)
    wait_secs "$ETCD_WAIT" eval 'etcd_ready || ! alive $ETCD_PID' \
        || fail "[server] etcd did not answer on $ETCD_URL within $ETCD_WAIT s"
    alive "$ETCD_PID" || fail "[server] etcd exited during start-up"
    say "[server] etcd healthy after $(elapsed "$_t0" "$(uptime_s)") s (pid $ETCD_PID)"
}

twohost_server() {
    CUR=server
    [ "$ETCD" = 1 ] && start_etcd
    _ib=""
    if command -v ib_read_lat > /dev/null 2>&1; then
        ib_read_lat -d rxe0 -x 1 -s 4096 -n 50 > /run/ib-server.log 2>&1 &
        _ib=$!
    fi
    [ "$ETCD" = 1 ] && MS_ARGS="--etcd $ETCD_URL --advertise $ADDR:$PORT --etcd-prefix $ETCD_PREFIX"
    start_memserver rdma
    if [ "$ETCD" = 1 ]; then
        wait_secs "$ETCD_WAIT" etcd_donor_listed \
            || fail "[server] the memserver is not registered in etcd: no key $DONOR_KEY with addr $ADDR:$PORT (and no other) under ${ETCD_PREFIX}donors/ within $ETCD_WAIT s"
        say "[server] etcd: $(sed -n 1p /run/etcdctl.out) = $(sed -n 2p /run/etcdctl.out)"
    fi
    say "[server] waiting up to $PEER_WAIT s for the client"
    _msg=$(peer_recv "$PEER_WAIT")
    [ -z "$_ib" ] || kill -9 "$_ib" 2>/dev/null
    case "$_msg" in
        scan) ;;
        FAIL*) PEER_TOLD=1; fail "[server] the client failed: ${_msg#FAIL }" ;;
        *) fail "[server] no scan request from the client within $PEER_WAIT s (got '${_msg}')" ;;
    esac
    ctl_ok && sed 's/^/[server] status: /' /run/ctl.out
    run_bounded 120 /run/memscan.out memscan --pid "$MS_PID" --seed "$SEED"
    _rc=$?
    say "[server] $(cat /run/memscan.out)"
    _scanned=$(sed -n 's/.* pages=\([0-9]*\) .*/\1/p' /run/memscan.out)
    peer_send "$CLIENT_ADDR" "scanned ${_scanned:-none}" || fail "[server] cannot reach the client"
    [ "$_rc" = 0 ] && [ -n "$_scanned" ] || fail "[server] memscan of the memserver failed (exit $_rc)"
    [ "$_scanned" -gt 0 ] || fail "[server] none of the client's swapped pages is in this memserver's pool"
    _msg=$(peer_recv "$PEER_WAIT")
    case "$_msg" in
        "done PASS") ;;
        FAIL*) PEER_TOLD=1; fail "[server] the client failed: ${_msg#FAIL }" ;;
        *) fail "[server] no done message from the client within $PEER_WAIT s (got '${_msg}')" ;;
    esac
    PEER_TOLD=1
    ctl_ok || fail "[server] rdmaswapctl status failed at the end"
    _rb=$(ctl_value tcp_read_bytes)
    _wb=$(ctl_value tcp_write_bytes)
    [ "$_rb" = 0 ] && [ "$_wb" = 0 ] \
        || fail "[server] memserver CPU moved pages: tcp_read_bytes=${_rb:-missing} tcp_write_bytes=${_wb:-missing}"
    stop_memserver
    if [ "$ETCD" = 1 ]; then
        # a clean stop deletes the key before the memserver exits (docs/deployment.md)
        etcdctl_run get --prefix "${ETCD_PREFIX}donors/" \
            || fail "[server] etcdctl get --prefix ${ETCD_PREFIX}donors/ failed at the end"
        [ ! -s /run/etcdctl.out ] \
            || fail "[server] etcd still lists $(head -n 1 /run/etcdctl.out) after the memserver's clean stop"
        kill -TERM "$ETCD_PID" 2>/dev/null
        wait_until 20 eval '! alive $ETCD_PID' || kill -9 "$ETCD_PID" 2>/dev/null
        say "[server] the key left etcd with the memserver; etcd stopped"
    fi
    check_dmesg
    say "[server] PASS: the client's $_scanned swapped pages were in this pool, no TCP data bytes"
}

twohost_client() {
    CUR=client
    _t0=$(uptime_s)
    wait_until "$SERVER_WAIT_PEER" ctl_ok \
        || fail "[client] the memserver on $ADDR did not answer within $SERVER_WAIT_PEER s"
    say "[client] memserver on $ADDR answers after $(elapsed "$_t0" "$(uptime_s)") s"
    if [ "$ETCD" = 1 ]; then
        # the plugin lists etcd once, at its start: wait until the donor is registered
        wait_secs "$SERVER_WAIT_PEER" etcd_donor_listed \
            || fail "[client] etcd on $ETCD_URL does not list the memserver ($DONOR_KEY) within $SERVER_WAIT_PEER s"
        say "[client] etcd lists $DONOR_KEY after $(elapsed "$_t0" "$(uptime_s)") s"
    fi
    if command -v ib_read_lat > /dev/null 2>&1; then
        run_bounded 60 /run/ib-client.log ib_read_lat -d rxe0 -x 1 -s 4096 -n 50 "$ADDR" \
            || { cat /run/ib-client.log; fail "[client] ib_read_lat to $ADDR over rxe0 failed (Soft-RoCE between the VMs)"; }
        say "[client] Soft-RoCE between the VMs: 4 KiB RDMA READ latency (usec):" \
            "$(awk '$1 == 4096 { print "typical", $5, "max", $4 }' /run/ib-client.log)"
    fi
    : > /run/nbdkit.log
    if [ "$ETCD" = 1 ]; then
        # no server=: the donor can come from etcd only (there is no donor cache yet, and the
        # cache is written only after a listing in etcd that gave donors)
        ls "$STATE_DIRECTORY"/*.donors > /dev/null 2>&1 \
            && fail "[client] a donor cache exists before nbdkit started: $(ls "$STATE_DIRECTORY"/*.donors)"
        # shellcheck disable=SC2086
        start_nbdkit rdmaswap "etcd=$ETCD_URL" "etcd-prefix=$ETCD_PREFIX" "statusfile=$STATUSFILE" \
            "size=$NBD_SIZE" transport=rdma "auth-key=$AUTH_KEY" $PLUGIN_ARGS
        _cache=$(ls "$STATE_DIRECTORY"/*.donors 2>/dev/null)
        [ -n "$_cache" ] && [ "$(echo "$_cache" | wc -l)" = 1 ] \
            || fail "[client] the plugin wrote no donor cache in $STATE_DIRECTORY: it did not list the donors in etcd"
        grep -qF "\"donors\":[\"$ADDR:$PORT\"]" "$_cache" && grep -qF "\"prefix\":\"$ETCD_PREFIX\"" "$_cache" \
            || fail "[client] the plugin's donor cache $_cache does not list $ADDR:$PORT under $ETCD_PREFIX: $(cat "$_cache")"
        say "[client] the plugin found the donor in etcd: its donor cache $_cache says $(cat "$_cache")"
    else
        # shellcheck disable=SC2086
        start_nbdkit rdmaswap "server=$ADDR:$PORT" "size=$NBD_SIZE" transport=rdma \
            "auth-key=$AUTH_KEY" $PLUGIN_ARGS
    fi

    # plain block I/O first: a few MiB written, read back after dropping the page cache
    nbd_connect
    dd if=/dev/urandom of=/run/pattern bs=1M count="$DD_MIB" 2> /dev/null
    _t0=$(uptime_s)
    run_bounded 300 /run/dd-write.log dd if=/run/pattern of=/dev/nbd0 bs=1M conv=fsync \
        || { cat /run/dd-write.log; fail "[client] writing $DD_MIB MiB to /dev/nbd0 failed"; }
    _t1=$(uptime_s)
    echo 3 > /proc/sys/vm/drop_caches
    run_bounded 300 /run/dd-read.log dd if=/dev/nbd0 of=/run/readback bs=1M count="$DD_MIB" \
        || { cat /run/dd-read.log; fail "[client] reading back /dev/nbd0 failed"; }
    _t2=$(uptime_s)
    cmp /run/pattern /run/readback || fail "[client] /dev/nbd0 read back different bytes"
    rm -f /run/pattern /run/readback
    say "[client] $DD_MIB MiB written in $(elapsed "$_t0" "$_t1") s and read back intact in" \
        "$(elapsed "$_t1" "$_t2") s"
    if [ "$ETCD" = 1 ]; then
        # the donor etcd gave holds the slabs (the status file is rewritten every second)
        wait_secs 15 grep -qE "^donor\.[0-9]+=$ADDR:$PORT state=ok slabs=[1-9]" "$STATUSFILE" \
            || fail "[client] the plugin's status does not show slabs on $ADDR:$PORT: $(grep '^donor' "$STATUSFILE" 2>/dev/null | tr '\n' ' ')"
        say "[client] status: $(grep '^donor' "$STATUSFILE" | tr '\n' ' ')"
    fi
    nbd_disconnect

    # then swap: the workload in a small cgroup
    swap_on plain
    swap_workload twohost
    check_server_stats rdma
    check_dmesg
    peer_send "$ADDR" scan || fail "[client] cannot reach the server to ask for the scan"
    _msg=$(peer_recv 180)
    say "[client] server: $_msg"
    case "$_msg" in
        scanned*) ;;
        FAIL*) PEER_TOLD=1; fail "[client] the server failed: ${_msg#FAIL }" ;;
        *) fail "[client] no answer to the scan request within 180 s" ;;
    esac
    swap_off
    stop_nbdkit
    check_dmesg
    PEER_TOLD=1
    peer_send "$ADDR" "done PASS" || fail "[client] cannot tell the server that it is done"
    say "[client] PASS: $W_SECS s, pswpout +$W_OUT, pswpin +$W_IN"
}
