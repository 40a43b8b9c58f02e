# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# kill (MODE=kill, after its --extra-runs): a memserver killed -9 under a live /dev/nbd0 (no
# swap; over KILL_TRANSPORT): KILL_MIB MiB written and read back intact before the kill; after
# it a read and a write of /dev/nbd0 must fail (EIO) within KILL_WAIT s instead of hanging, the
# kernel log must show the I/O error and nbdkit must stay up.
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

dd_fails_in_time() {   # dd_fails_in_time LABEL dd-args...
    _l=$1
    shift
    _t0=$(uptime_s)
    run_bounded "$KILL_WAIT" "/run/dd-$_l.log" dd "$@"
    _rc=$?
    _dt=$(elapsed "$_t0" "$(uptime_s)")
    say "[kill] dd ($_l) exit $_rc after $_dt s: $(tr '\n' ' ' < "/run/dd-$_l.log")"
    [ "$_rc" = 124 ] && fail "[kill] dd $_l of /dev/nbd0 still blocked $KILL_WAIT s after the memserver died"
    [ "$_rc" = 0 ] && fail "[kill] dd $_l of /dev/nbd0 succeeded after the memserver died (expected EIO)"
    return 0
}

kill_test() {
    CUR="kill"
    say "===== kill ($KILL_TRANSPORT): memserver killed under a live /dev/nbd0 ====="
    setup_backend "$KILL_TRANSPORT"
    CUR="kill"
    nbd_connect
    dd if=/dev/urandom of=/run/pattern bs=1M count="$KILL_MIB" 2> /dev/null
    run_bounded 120 /run/dd-write.log dd if=/run/pattern of=/dev/nbd0 bs=1M conv=fsync \
        || { cat /run/dd-write.log; fail "[kill] writing $KILL_MIB MiB to /dev/nbd0 failed"; }
    sync
    echo 3 > /proc/sys/vm/drop_caches
    run_bounded 120 /run/dd-read.log dd if=/dev/nbd0 of=/run/readback bs=1M count="$KILL_MIB" \
        || { cat /run/dd-read.log; fail "[kill] reading back /dev/nbd0 failed"; }
    cmp /run/pattern /run/readback || fail "[kill] /dev/nbd0 read back different bytes before the kill"
    say "[kill] $KILL_MIB MiB written and read back intact; kill -9 memserver (pid $MS_PID)"
    kill -9 "$MS_PID"
    wait "$MS_PID" 2>/dev/null
    MS_PID=""
    echo 3 > /proc/sys/vm/drop_caches
    dd_fails_in_time read if=/dev/nbd0 of=/dev/null bs=64K count=16
    dd_fails_in_time write if=/run/pattern of=/dev/nbd0 bs=64K count=16 conv=fsync
    dmesg | grep -q 'I/O error' || fail "[kill] no I/O error in the kernel log"
    say "[kill] kernel: $(dmesg | grep -m1 'I/O error')"
    alive "$NBDKIT_PID" || fail "[kill] nbdkit died after the memserver was lost (expected EIO replies)"
    check_dmesg allow-io-errors
    nbd_disconnect
    stop_nbdkit
    check_dmesg allow-io-errors
    say "[kill] PASS"
}
