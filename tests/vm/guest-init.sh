#!/bin/sh
# SPDX-License-Identifier: MIT
# /init of the rdmaswap test VM (PID 1; busybox ash, POSIX sh).  run-vm-test.sh copies this file into
# the initramfs as /init and writes its settings to /etc/rdmaswap-vm.conf.
#
# Every wait is bounded.  The script ends with exactly one line
#   RDMASWAP-VM-RESULT: PASS
#   RDMASWAP-VM-RESULT: FAIL <reason of the first failed check>
# and powers the VM off (the host script reads that line from the serial console).

PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
umask 022

# Defaults; /etc/rdmaswap-vm.conf overrides them.
MODE=memory            # memory | tcp | rdma | kill | bench
BENCH_MODES="rdma tcp memory"
MIB=256                # swapload working set
PASSES=2               # swapload verify passes
SWAPLOAD_ARGS=""       # extra swapload arguments
MIN_PSWPOUT=""         # pswpout pages required (default MIB*200)
CG_MAX=64M             # memory.max of the workload cgroup
CONNS=1                # nbd-client -C
ADDR=10.77.0.1
PORT=7471
CAPACITY=768M          # memserver --capacity
SLAB=64M               # memserver --slab-size
NBD_SIZE=768M          # plugin size=
MEMPLUGIN_SIZE=1G      # nbdkit memory plugin size (memory mode)
NBDKIT_STATS=0         # 1: add nbdkit's stats filter and print its report
SERVER_WAIT=60         # seconds to wait for the memserver to answer rdmaswapctl
WORK_TIMEOUT=420       # seconds allowed for one swapload run
KILL_WAIT=60           # kill mode: seconds a dd may take to fail
RDMA_TESTS_TIMEOUT=300 # seconds allowed for rdmaswap-rdma-tests
KILL_MIB=8             # kill mode: MiB written before the memserver is killed
KILL_TRANSPORT=rdma    # kill mode: transport of the memserver and the plugin
[ -r /etc/rdmaswap-vm.conf ] && . /etc/rdmaswap-vm.conf
[ -n "$MIN_PSWPOUT" ] || MIN_PSWPOUT=$((MIB * 200))

SOCK=/run/nbd.sock
# Debian's static busybox runs its own applets before searching PATH (FEATURE_SH_STANDALONE):
# iproute2's ip must be called by path (busybox's ip cannot create veth pairs).
IP=/usr/sbin/ip
NBDKIT_PIDFILE=/run/nbdkit.pid
CG=/sys/fs/cgroup/swaptest
MS_PID=""
NBDKIT_PID=""
CUR=""                 # label of the current run (memory/tcp/rdma/kill)
RDMA_OK=0

say() { echo "vm: $*"; }

uptime_s() {
    read -r _up _idle < /proc/uptime
    echo "$_up"
}

# seconds between two uptime_s values, two decimals
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

poweroff_now() {
    poweroff -n -f 2>/dev/null
    echo o > /proc/sysrq-trigger 2>/dev/null
    sleep 10
    exit 1   # PID 1 exits: kernel panics, panic=-1 reboots, qemu -no-reboot stops
}

finish() {
    dmesg -n 1 2>/dev/null   # keep kernel messages from splitting the marker line
    echo "RDMASWAP-VM-RESULT: $*"
    poweroff_now
}

file_tail() {   # file_tail FILE N LABEL
    if [ -s "$1" ]; then
        echo "----- $3 (last $2 lines of $1) -----"
        tail -n "$2" "$1"
        echo "----- end $3 -----"
    fi
}

diagnostics() {
    file_tail /run/memserver.log 40 "memserver log"
    file_tail /run/nbdkit.log 40 "nbdkit log"
    file_tail /run/swapload.out 20 "swapload output"
    file_tail /run/ctl.out 30 "rdmaswapctl status"
    if [ -r "$CG/memory.events" ]; then
        echo "----- $CG/memory.events -----"
        cat "$CG/memory.events"
    fi
    echo "----- /proc/swaps -----"
    cat /proc/swaps
    grep -E '^(MemTotal|MemFree|MemAvailable|Mlocked|SwapTotal|SwapFree):' /proc/meminfo
    echo "----- dmesg (last 60 lines) -----"
    dmesg | tail -n 60
    echo "----- end dmesg -----"
}

fail() {
    say "FAIL: $*"
    diagnostics
    finish "FAIL $*"
}

# alive PID: the process exists and is not a zombie
alive() {
    [ -n "$1" ] || return 1
    { read -r _p _c _st _rest < "/proc/$1/stat"; } 2>/dev/null || return 1
    [ "$_st" != Z ] && [ "$_st" != X ]
}

# run_bounded SECONDS OUTFILE CMD...: run CMD with output to OUTFILE; returns its status, or 124 if
# it did not finish in time (it is then sent SIGKILL and not waited for: it may sit in D state).
run_bounded() {
    _secs=$1
    _out=$2
    shift 2
    "$@" > "$_out" 2>&1 &
    _pid=$!
    _n=0
    _lim=$((_secs * 5))
    while alive "$_pid"; do
        if [ "$_n" -ge "$_lim" ]; then
            kill -9 "$_pid" 2>/dev/null
            return 124
        fi
        sleep 0.2
        _n=$((_n + 1))
    done
    wait "$_pid"
}

# wait_until SECONDS CMD...: poll CMD every 0.2 s; 0 when it succeeds, 1 on time-out
wait_until() {
    _secs=$1
    shift
    _n=0
    _lim=$((_secs * 5))
    while ! "$@"; do
        [ "$_n" -ge "$_lim" ] && return 1
        sleep 0.2
        _n=$((_n + 1))
    done
    return 0
}

vmstat() { sed -n "s/^$1 //p" /proc/vmstat; }

# ---------------------------------------------------------------------------------------------
# Boot

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /run /tmp
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup || fail "cannot mount cgroup2"
hostname rdmaswap-vm
exec < /dev/console > /dev/console 2>&1

say "guest up at $(uptime_s) s: kernel $(uname -r), $(nproc) CPUs," \
    "$(sed -n 's/^MemTotal: *//p' /proc/meminfo) RAM, mode=$MODE mib=$MIB"

# Kernel modules, in `modprobe --show-depends` order (the host wrote the list).
while read -r _mod _params; do
    [ -n "$_mod" ] || continue
    # shellcheck disable=SC2086
    insmod "$_mod" $_params || fail "insmod $_mod failed"
done < /etc/rdmaswap-vm/modules
say "modules loaded: $(wc -l < /etc/rdmaswap-vm/modules)"

# Network: lo, and a veth pair in the initial namespace; the single Soft-RoCE device sits on veth0
# and both the memserver and the plugin use its address (rxe loopback).
"$IP" link set lo up || fail "ip link set lo up"
"$IP" link add veth0 type veth peer name veth1 || fail "cannot create the veth pair"
"$IP" addr add "$ADDR/24" dev veth0 || fail "ip addr add $ADDR/24 dev veth0"
"$IP" link set veth0 up && "$IP" link set veth1 up || fail "cannot bring veth0/veth1 up"

port_active() { grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null; }
if rdma link add rxe0 type rxe netdev veth0 && wait_until 20 port_active \
        && [ -e /dev/infiniband/uverbs0 ] && [ -e /dev/infiniband/rdma_cm ]; then
    RDMA_OK=1
    say "Soft-RoCE: $(rdma link show rxe0/1 2>&1)"
else
    say "Soft-RoCE device rxe0 could not be set up"
    rdma link show 2>&1
    ls -l /dev/infiniband 2>&1
fi

needs_rdma=0
case "$MODE" in
    rdma) needs_rdma=1 ;;
    kill) [ "$KILL_TRANSPORT" = rdma ] && needs_rdma=1 ;;
    bench) case " $BENCH_MODES " in *" rdma "*) needs_rdma=1 ;; esac ;;
esac
if [ "$needs_rdma" = 1 ] && [ "$RDMA_OK" != 1 ]; then
    fail "Soft-RoCE device rxe0 on veth0 is not usable"
fi

# dmesg must stay clean; in kill mode I/O errors are expected.
check_dmesg() {
    if [ "$1" = allow-io-errors ]; then
        _pat='WARNING:|BUG:|blocked for more than|Oops|general protection fault'
    else
        _pat='WARNING:|BUG:|blocked for more than|Oops|general protection fault|I/O error'
    fi
    _bad=$(dmesg | grep -E "$_pat" | head -n 1)
    [ -z "$_bad" ] || fail "kernel log: $_bad"
}

# ---------------------------------------------------------------------------------------------
# Building blocks

# Soft-RoCE sanity check with perftest (if in the image): tells a broken rxe setup apart from a
# broken rdmaswap transport.
rdma_sanity() {
    if ! command -v ib_read_lat > /dev/null 2>&1; then
        say "ib_read_lat not in the image; skipping the Soft-RoCE sanity check"
        return 0
    fi
    ib_read_lat -d rxe0 -x 1 -s 4096 -n 200 > /run/ib-server.log 2>&1 &
    _srv=$!
    _try=0
    while :; do
        sleep 1
        run_bounded 60 /run/ib-client.log ib_read_lat -d rxe0 -x 1 -s 4096 -n 200 "$ADDR" && break
        _try=$((_try + 1))
        if [ "$_try" -ge 5 ] || ! alive "$_srv"; then
            file_tail /run/ib-server.log 20 "ib_read_lat server"
            file_tail /run/ib-client.log 20 "ib_read_lat client"
            kill -9 "$_srv" 2>/dev/null
            fail "Soft-RoCE sanity check (ib_read_lat over rxe0 loopback) failed"
        fi
    done
    wait_until 10 eval '! alive $_srv' || kill -9 "$_srv" 2>/dev/null
    say "Soft-RoCE sanity: 4 KiB RDMA READ latency (usec): $(awk '$1 == 4096 { print "typical", $5, "max", $4 }' /run/ib-client.log)"
}

run_rdma_tests() {
    _t=/usr/local/bin/rdmaswap-rdma-tests
    if [ ! -x "$_t" ]; then
        say "rdmaswap-rdma-tests not built; skipping them"
        return 0
    fi
    say "running rdmaswap-rdma-tests (RDMASWAP_TEST_RDMA_ADDR=$ADDR)"
    _t0=$(uptime_s)
    RDMASWAP_TEST_RDMA_ADDR=$ADDR run_bounded "$RDMA_TESTS_TIMEOUT" /run/rdma-tests.log "$_t"
    _rc=$?
    sed 's/^/rdma-tests: /' /run/rdma-tests.log | tail -n 40
    say "rdmaswap-rdma-tests exit $_rc after $(elapsed "$_t0" "$(uptime_s)") s"
    case $_rc in
        0) ;;
        77) say "rdmaswap-rdma-tests skipped themselves (77)" ;;
        124) fail "rdmaswap-rdma-tests did not finish within $RDMA_TESTS_TIMEOUT s" ;;
        *) fail "rdmaswap-rdma-tests failed (exit $_rc)" ;;
    esac
}

ctl_ok() { rdmaswapctl status "server=$ADDR:$PORT" > /run/ctl.out 2>&1; }
ms_ready() { alive "$MS_PID" && ctl_ok; }

# start_memserver TRANSPORT
start_memserver() {
    say "starting rdmaswap-memserver --transport $1 --capacity $CAPACITY --slab-size $SLAB"
    rdmaswap-memserver --listen "$ADDR" --port "$PORT" --capacity "$CAPACITY" \
        --slab-size "$SLAB" --transport "$1" > /run/memserver.log 2>&1 &
    MS_PID=$!
    echo -1000 > "/proc/$MS_PID/oom_score_adj" 2>/dev/null
    _t0=$(uptime_s)
    if ! wait_until "$SERVER_WAIT" ms_ready; then
        if alive "$MS_PID"; then
            fail "memserver did not answer rdmaswapctl status within $SERVER_WAIT s"
        fi
        wait "$MS_PID"
        fail "memserver exited (status $?) during start-up"
    fi
    say "memserver ready after $(elapsed "$_t0" "$(uptime_s)") s (pid $MS_PID)"
}

stop_memserver() {
    [ -n "$MS_PID" ] || return 0
    kill -TERM "$MS_PID" 2>/dev/null
    if ! wait_until 30 eval '! alive $MS_PID'; then
        kill -9 "$MS_PID" 2>/dev/null
        fail "memserver did not exit within 30 s of SIGTERM"
    fi
    wait "$MS_PID"
    _rc=$?
    MS_PID=""
    [ "$_rc" = 0 ] || fail "memserver exited with status $_rc after SIGTERM (contract: 0)"
    say "memserver stopped"
}

# start_nbdkit PLUGIN ARGS...: nbdkit --swap backgrounds itself; its pid comes from the pidfile
start_nbdkit() {
    rm -f "$NBDKIT_PIDFILE" "$SOCK"
    _filters=""
    _fargs=""
    if [ "$NBDKIT_STATS" = 1 ]; then
        _filters="--filter=stats"     # filter parameters go after the plugin's
        _fargs="statsfile=/run/nbdkit-stats.txt statsappend=true"
    fi
    say "starting nbdkit --swap${_filters:+ $_filters} $*${_fargs:+ $_fargs}"
    # Smaller thread stacks: --swap locks every thread's whole stack.
    # shellcheck disable=SC3045  # busybox ash has ulimit -s
    # shellcheck disable=SC2086
    (ulimit -s 1024; exec nbdkit --swap --log=stderr -P "$NBDKIT_PIDFILE" -U "$SOCK" $_filters "$@" $_fargs) \
        >> /run/nbdkit.log 2>&1
    _rc=$?
    [ "$_rc" = 0 ] || fail "nbdkit failed to start (exit $_rc)"
    wait_until 30 test -s "$NBDKIT_PIDFILE" || fail "nbdkit wrote no pidfile within 30 s"
    NBDKIT_PID=$(cat "$NBDKIT_PIDFILE")
    echo -1000 > "/proc/$NBDKIT_PID/oom_score_adj" 2>/dev/null
    wait_until 30 test -S "$SOCK" || fail "nbdkit socket $SOCK missing"
    alive "$NBDKIT_PID" || fail "nbdkit exited right after start"
}

stop_nbdkit() {
    [ -n "$NBDKIT_PID" ] || return 0
    kill -TERM "$NBDKIT_PID" 2>/dev/null
    if ! wait_until 30 eval '! alive $NBDKIT_PID'; then
        kill -9 "$NBDKIT_PID" 2>/dev/null
        fail "nbdkit did not exit within 30 s of SIGTERM"
    fi
    NBDKIT_PID=""
    if [ "$NBDKIT_STATS" = 1 ] && [ -s /run/nbdkit-stats.txt ]; then
        sed "s/^/nbdkit-stats[$CUR]: /" /run/nbdkit-stats.txt
        rm -f /run/nbdkit-stats.txt
    fi
    say "nbdkit stopped"
}

nbd_size_ok() { _s=$(cat /sys/block/nbd0/size 2>/dev/null); [ -n "$_s" ] && [ "$_s" != 0 ]; }
nbd_gone() { _s=$(cat /sys/block/nbd0/size 2>/dev/null); [ -z "$_s" ] || [ "$_s" = 0 ]; }

# nbd_connect [extra nbd-client args]
nbd_connect() {
    _c=""
    [ "$CONNS" -gt 1 ] && _c="-C $CONNS"
    # shellcheck disable=SC2086
    run_bounded 60 /run/nbd-client.log nbd-client -unix "$SOCK" /dev/nbd0 -b 4096 $_c "$@"
    _rc=$?
    cat /run/nbd-client.log
    [ "$_rc" = 0 ] || fail "nbd-client failed to connect /dev/nbd0 (exit $_rc)"
    wait_until 30 nbd_size_ok || fail "/dev/nbd0 has no size after nbd-client"
    say "/dev/nbd0: $(($(cat /sys/block/nbd0/size) / 2048)) MiB," \
        "logical block $(cat /sys/block/nbd0/queue/logical_block_size)"
}

nbd_disconnect() {
    run_bounded 60 /run/nbd-client-d.log nbd-client -d /dev/nbd0 \
        || { cat /run/nbd-client-d.log; fail "nbd-client -d /dev/nbd0 failed or hung"; }
    wait_until 30 nbd_gone || fail "/dev/nbd0 still has a size after nbd-client -d"
}

# setup_backend LABEL: server(s) + nbdkit for memory | tcp | rdma
setup_backend() {
    CUR=$1
    : > /run/nbdkit.log
    case "$1" in
        memory)
            start_nbdkit memory "$MEMPLUGIN_SIZE" allocator=malloc,mlock=true
            ;;
        tcp|rdma)
            start_memserver "$1"
            start_nbdkit rdmaswap "server=$ADDR:$PORT" "size=$NBD_SIZE" "transport=$1"
            ;;
    esac
}

teardown_backend() {
    stop_nbdkit
    stop_memserver
}

swap_on() {
    nbd_connect -swap
    mkswap /dev/nbd0 > /run/mkswap.log 2>&1 || { cat /run/mkswap.log; fail "mkswap /dev/nbd0 failed"; }
    swapon /dev/nbd0 || fail "swapon /dev/nbd0 failed"
    grep -q '^/dev/nbd0 ' /proc/swaps || fail "/dev/nbd0 not in /proc/swaps after swapon"
}

swap_off() {
    run_bounded 180 /run/swapoff.log swapoff /dev/nbd0 \
        || { cat /run/swapoff.log; fail "swapoff /dev/nbd0 failed or hung"; }
    nbd_disconnect
}

ctl_value() { sed -n "s/^$1=//p" /run/ctl.out | head -n 1; }

# A new shell so that $$ is the workload's own pid (in a subshell $$ would be PID 1).
in_cgroup_swapload() {
    # shellcheck disable=SC2016,SC2086
    sh -c 'echo $$ > "$1/cgroup.procs" || exit 3; shift; exec swapload "$@"' \
        sh "$CG" --mib "$MIB" --passes "$PASSES" $SWAPLOAD_ARGS
}

# swap_workload LABEL: runs swapload in the memory-limited cgroup and checks the results.
# Sets W_SECS, W_OUT, W_IN.
swap_workload() {
    echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    [ -d "$CG" ] || mkdir "$CG" || fail "cannot create cgroup $CG"
    echo "$CG_MAX" > "$CG/memory.max" || fail "cannot set $CG/memory.max (memory controller?)"
    _out0=$(vmstat pswpout)
    _in0=$(vmstat pswpin)
    say "[$1] swapload --mib $MIB --passes $PASSES${SWAPLOAD_ARGS:+ $SWAPLOAD_ARGS} in a cgroup with memory.max=$CG_MAX"
    _t0=$(uptime_s)
    run_bounded "$WORK_TIMEOUT" /run/swapload.out in_cgroup_swapload
    _rc=$?
    _t1=$(uptime_s)
    W_OUT=$(($(vmstat pswpout) - _out0))
    W_IN=$(($(vmstat pswpin) - _in0))
    W_SECS=$(elapsed "$_t0" "$_t1")
    cat /run/swapload.out
    say "[$1] swapload exit $_rc in $W_SECS s: pswpout +$W_OUT pswpin +$W_IN pages;" \
        "swap used $(awk '$1 == "/dev/nbd0" { print $4 }' /proc/swaps) KiB now"
    [ "$_rc" = 124 ] && fail "[$1] swapload did not finish within $WORK_TIMEOUT s"
    [ "$_rc" = 137 ] && fail "[$1] swapload was killed (OOM?): $(tr '\n' ' ' < "$CG/memory.events")"
    grep -q '^swapload: OK pages=' /run/swapload.out \
        || fail "[$1] $(grep -m1 'MISMATCH' /run/swapload.out || echo "exit $_rc, no OK line")"
    [ "$_rc" = 0 ] || fail "[$1] swapload exit status $_rc"
    [ "$W_OUT" -ge "$MIN_PSWPOUT" ] \
        || fail "[$1] pswpout grew by $W_OUT pages, expected >= $MIN_PSWPOUT"
    [ "$W_IN" -gt 0 ] || fail "[$1] pswpin did not grow"
    rmdir "$CG" 2>/dev/null
}

check_server_stats() {   # check_server_stats tcp|rdma
    ctl_ok || { cat /run/ctl.out; fail "[$1] rdmaswapctl status failed after the workload"; }
    sed "s/^/[$1] status: /" /run/ctl.out
    _used=$(ctl_value slabs_used)
    [ -n "$_used" ] && [ "$_used" -gt 0 ] 2>/dev/null \
        || fail "[$1] rdmaswapctl status: slabs_used=${_used:-missing}, expected > 0"
    if [ "$1" = rdma ]; then
        _rb=$(ctl_value tcp_read_bytes)
        _wb=$(ctl_value tcp_write_bytes)
        [ "$_rb" = 0 ] && [ "$_wb" = 0 ] \
            || fail "[rdma] memserver CPU moved pages: tcp_read_bytes=${_rb:-missing} tcp_write_bytes=${_wb:-missing} (expected 0: one-sided RDMA)"
    fi
}

# one_swap_run LABEL: set up, swap, check, tear down.  Appends a line to /run/bench.txt.
one_swap_run() {
    say "===== $1: swap over NBD ====="
    setup_backend "$1"
    swap_on
    swap_workload "$1"
    case "$1" in tcp|rdma) check_server_stats "$1" ;; esac
    check_dmesg
    swap_off
    teardown_backend
    check_dmesg
    echo "$1 $W_SECS $W_OUT $W_IN" >> /run/bench.txt
    say "[$1] PASS: $W_SECS s, pswpout +$W_OUT, pswpin +$W_IN"
}

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

print_bench() {
    echo "RDMASWAP-VM-BENCH: mib=$MIB passes=$PASSES memory.max=$CG_MAX"
    awk '
        { mode[NR] = $1; secs[NR] = $2; out[NR] = $3; inn[NR] = $4; if ($1 == "memory") base = $2 }
        END {
            printf "RDMASWAP-VM-BENCH: %-8s %9s %9s %9s %10s\n", "mode", "seconds", "pswpout", "pswpin", "vs-memory"
            for (i = 1; i <= NR; i++) {
                r = (base > 0) ? sprintf("%.2f", secs[i] / base) : "n/a"
                printf "RDMASWAP-VM-BENCH: %-8s %9.2f %9d %9d %10s\n", mode[i], secs[i], out[i], inn[i], r
            }
        }' /run/bench.txt
}

# ---------------------------------------------------------------------------------------------
# Scenario

: > /run/bench.txt
case "$MODE" in
    memory|tcp)
        one_swap_run "$MODE"
        ;;
    rdma)
        rdma_sanity
        run_rdma_tests
        check_dmesg
        one_swap_run rdma
        ;;
    kill)
        [ "$KILL_TRANSPORT" = rdma ] && rdma_sanity
        kill_test
        ;;
    bench)
        case " $BENCH_MODES " in *" rdma "*) rdma_sanity ;; esac
        for _m in $BENCH_MODES; do
            one_swap_run "$_m"
        done
        print_bench
        ;;
    *)
        fail "unknown mode '$MODE'"
        ;;
esac
say "all checks passed at $(uptime_s) s"
finish PASS
