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
MODE=memory            # memory | tcp | rdma | kill | bench | pressure | runs | twohost
RUNS=""                # swap runs, in order: [pressure-][crypt-]memory|tcp|rdma (default: $MODE)
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
NBD_SIZE=""            # plugin size= (default: $CAPACITY)
PRESSURE_EXTRA=256     # pressure runs: swapload --mib = MemAvailable (MiB) + this
SEED=0x544e4c50414d4452  # swapload --seed ("RDMAPLNT"); memscan looks for it in the memserver
CRYPT_NAME=cswap       # crypt runs: /dev/mapper/$CRYPT_NAME over /dev/nbd0
ROLE=""                # twohost: server | client (rdmaswap.role= on the kernel command line)
PEER_PORT=7999         # twohost: the VMs' message port (busybox nc)
CLIENT_ADDR=10.77.0.2  # twohost: VM B's address (VM A, the server, has $ADDR)
PEER_WAIT=600          # twohost: seconds the server waits for each message of the client
SERVER_WAIT_PEER=240   # twohost: seconds the client waits for the server's memserver
DD_MIB=4               # twohost: MiB written to /dev/nbd0 and read back before swapping
ETCD=0                 # twohost: 1 = VM A runs etcd, its memserver registers there and VM B's
                       # plugin finds it with etcd= alone (no server=)
ETCD_PORT=2379         # twohost etcd: client port on $ADDR (peer port: ETCD_PEER_PORT)
ETCD_PEER_PORT=2380
ETCD_PREFIX=/vmtest/   # twohost etcd: --etcd-prefix / etcd-prefix=
ETCD_WAIT=120          # twohost etcd: seconds allowed for etcd to answer, and for the donor's key
PREFILL=0              # 1: write all of /dev/nbd0 before mkswap (see prefill())
PLUGIN_ARGS=""         # extra rdmaswap plugin parameters (e.g. timeout=2)
REALTIME=1             # 0: plugin realtime=0, memservers without --realtime (diagnostic)
MEMPLUGIN_SIZE=1G      # nbdkit memory plugin size (memory mode)
NBDKIT_STATS=0         # 1: add nbdkit's stats filter and print its report
SERVER_WAIT=60         # seconds to wait for the memserver to answer rdmaswapctl
WORK_TIMEOUT=420       # seconds allowed for one swapload run
KILL_WAIT=60           # kill mode: seconds a dd may take to fail
RDMA_TESTS_TIMEOUT=300 # seconds allowed for rdmaswap-rdma-tests
KILL_MIB=8             # kill mode: MiB written before the memserver is killed
KILL_TRANSPORT=rdma    # kill mode: transport of the memserver and the plugin
REP_SERVERS=3          # repkill runs: memservers (ports PORT, PORT+1, ...)
REP_REPLICAS=2         # repkill runs: the plugin's replicas=
REP_CAPACITY=256M      # repkill runs: each memserver's --capacity
REP_SLAB=16M           # repkill runs: each memserver's --slab-size
REP_SIZE=256M          # repkill runs: the plugin's size=
REP_KILL_AT=""         # repkill runs: pswpout pages before the kill (default MIB*64: 1/4 of it)
REP_WAIT=120           # repkill runs: seconds allowed to get back to full redundancy
STATUSFILE=/run/rdmaswap.status  # repkill runs: the plugin's statusfile=
ALLOC_REQUESTS=100000  # alloc runs: requests counted in steady state
ALLOC_WAIT=600         # alloc runs: seconds allowed for nbddrive
ALLOC_LIB=/usr/local/lib/librdmaswap-alloc-counter.so
REA_SERVERS=2          # reattach/persist runs: memservers (ports PORT, PORT+1, ...), replicas=
REA_CAPACITY=64M       # reattach/persist runs: each memserver's --capacity
REA_SLAB=8M            # reattach/persist runs: each memserver's --slab-size
REA_SIZE=64M           # reattach/persist runs: the plugin's size=
REA_MIB=32             # reattach runs: MiB written before nbdkit is killed
REA_VOLUME=vmtest      # reattach/persist runs: the plugin's volume=
REA_VOLUME2=""         # reattach/persist runs: volume= of the restarted nbdkit (default REA_VOLUME)
REA_LEASE=60           # reattach/persist runs: the plugin's lease=
REC_MIB=96             # reconnect runs: swapload's working set (MiB)
REC_SIZE=128M          # reconnect runs: each memserver's --capacity and the plugin's size=
REC_SLAB=16M           # reconnect runs: each memserver's --slab-size
REC_DEAD=60            # reconnect runs: rdmaswap-nbd connect --dead-conn-timeout
REC_TIMEOUT=20         # reconnect runs: rdmaswap-nbd connect --timeout (in-flight requests at
                       # the kill are requeued after this long)
REC_SKIP=0             # reconnect runs: 1 = no rdmaswap-nbd reconnect (the run must then FAIL)
SOAK_SECONDS=120       # soak runs: how long the workload, the probe and the faults last
SOAK_SEED=1            # soak runs: seed of the fault schedule
SOAK_PLUGIN_TIMEOUT=3  # soak runs: the plugin's timeout=
SOAK_SERVERS=3         # soak runs: memservers, each on its own link
SOAK_CAPACITY=96M      # soak runs: each memserver's --capacity (two of them hold it all)
SOAK_SLAB=8M           # soak runs: each memserver's --slab-size
SOAK_SIZE=64M          # soak runs: the plugin's size=
SOAK_MIB=64            # soak runs: swapload's working set
SOAK_CG_MAX=32M        # soak runs: memory.max of the workload's cgroup
SOAK_HUNG=20           # soak runs: kernel.hung_task_timeout_secs meanwhile
SOAK_GRACE=120         # soak runs: seconds the workload and the probe may take past the end
ACCT_SECONDS=5         # acct runs: seconds of fio per row
ACCT_ROWS="randread:4k:1 randwrite:4k:1 randread:4k:32 randwrite:4k:32 randread:32k:8"
                       # acct runs: the rows, RW:BS:QD (fio's nbd engine, one connection)
ACCT_SIZE=128M         # acct runs: the memserver's --capacity and the plugin's size= (filled first)
APP_KEYS=65536         # app runs: redis keys key:000000000000.. (/etc/rdmaswap-vm/app-load.resp, made by the host)
APP_REQUESTS=10000     # app runs: redis-benchmark GET requests per memory level
APP_CLIENTS=4          # app runs: redis-benchmark -c
APP_LEVELS="100 75 50" # app runs: redis' cgroup memory.max, in % of its working set W
APP_SWAP=256M          # app runs: swap size (memserver --capacity, plugin size=, memory plugin, zram)
APP_WAIT=600           # app runs: seconds allowed for one redis-benchmark (or the load)
APP_SAMPLE=256         # app runs: keys read after the load and after the last level (must agree)
MS_WRAP=""             # command words before rdmaswap-memserver (alloc runs: env LD_PRELOAD=...)
MS_ARGS=""             # extra rdmaswap-memserver arguments (twohost etcd: --etcd ...)
NBDKIT_WRAP=""         # command words before nbdkit (alloc runs)
[ -r /etc/rdmaswap-vm.conf ] && . /etc/rdmaswap-vm.conf
[ -n "$MIN_PSWPOUT" ] || MIN_PSWPOUT=$((MIB * 200))
[ -n "$REP_KILL_AT" ] || REP_KILL_AT=$((MIB * 64))
[ -n "$NBD_SIZE" ] || NBD_SIZE=$CAPACITY
[ -n "$REA_VOLUME2" ] || REA_VOLUME2=$REA_VOLUME
[ -n "$RUNS" ] || RUNS=$MODE
ETCD_URL=http://$ADDR:$ETCD_PORT
DONOR_KEY=${ETCD_PREFIX}donors/$ADDR:$PORT   # the memserver's registration (docs/deployment.md)
ETCDCTL_API=3
export ETCDCTL_API
# --realtime: this VM swaps into the memservers it runs itself (rdmaswap-memserver(8))
MS_RT=--realtime
if [ "$REALTIME" = 0 ]; then MS_RT=""; PLUGIN_ARGS="realtime=0${PLUGIN_ARGS:+ $PLUGIN_ARGS}"; fi
# cryptsetup's libdevmapper: no udev in this VM, it makes the /dev/mapper nodes itself
DM_DISABLE_UDEV=1
export DM_DISABLE_UDEV

SOCK=/run/nbd.sock
# Debian's static busybox runs its own applets before searching PATH (FEATURE_SH_STANDALONE):
# iproute2's ip must be called by path (busybox's ip cannot create veth pairs).
IP=/usr/sbin/ip
TC=/usr/sbin/tc        # soak runs; busybox has a tc applet of its own too
NBDKIT_PIDFILE=/run/nbdkit.pid
CG=/sys/fs/cgroup/swaptest
MS_PID=""
NBDKIT_PID=""
ETCD_PID=""            # twohost etcd: VM A's etcd
CUR=""                 # label of the current run (memory/tcp/rdma/kill)
RDMA_OK=0
SWAPDEV=/dev/nbd0      # /dev/mapper/$CRYPT_NAME in crypt runs
# Server logs.  Pressure runs send them straight to the console instead: if the VM hangs, this
# script cannot print them any more.
MS_LOG=/run/memserver.log
NBDKIT_LOG=/run/nbdkit.log
PEER_TOLD=0            # twohost: the other VM has been told our result

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
    for _f in /run/memserver-*.log; do
        [ -e "$_f" ] && file_tail "$_f" 20 "memserver log"
    done
    file_tail "$STATUSFILE" 30 "plugin statusfile"
    file_tail /run/etcd.log 30 "etcd log"
    file_tail /run/etcdctl.out 10 "last etcdctl output"
    file_tail /run/nbddrive.out 20 "nbddrive output"
    if [ -s /run/nbdkit.log ]; then
        echo "----- nbdkit log (first 20 lines of /run/nbdkit.log) -----"
        head -n 20 /run/nbdkit.log
    fi
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
    grep -E '^(pswpin|pswpout|oom_kill) ' /proc/vmstat
    echo "----- dmesg (last 60 lines) -----"
    dmesg | tail -n 60
    echo "----- end dmesg -----"
}

fail() {
    say "FAIL: $*"
    diagnostics
    peer_tell "FAIL $ROLE: $*"
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

# wait_secs SECONDS CMD...: like wait_until, but bounded by the clock, for a CMD that takes long
# itself (etcdctl under TCG): poll every 0.5 s; 0 when CMD succeeds, 1 after SECONDS
wait_secs() {
    _ws_end=$(awk -v u="$(uptime_s)" -v s="$1" 'BEGIN { printf "%d", u + s }')
    shift
    while ! "$@"; do
        [ "$(uptime_s | cut -d. -f1)" -ge "$_ws_end" ] && return 1
        sleep 0.5
    done
    return 0
}

vmstat() { sed -n "s/^$1 //p" /proc/vmstat; }
meminfo_kib() { sed -n "s/^$1:[[:space:]]*\([0-9]*\) kB/\1/p" /proc/meminfo; }
proc_status_kib() { sed -n "s/^$2:[[:space:]]*\([0-9]*\) kB/\1/p" "/proc/$1/status" 2>/dev/null; }

# stat_fields FILE...: each /proc stat line with "pid (comm) " cut to "pid " (comm may hold
# spaces and parentheses), so that field N > 2 of stat(5) is awk's $(N-1)
stat_fields() { sed 's/^\([0-9]*\) .*) /\1 /' "$@" 2>/dev/null; }

# cpu_s PID: user + system CPU seconds of PID so far (fields 14 and 15, in 1/100 s)
cpu_s() { stat_fields "/proc/$1/stat" | awk '{ printf "%.2f", ($13 + $14) / 100 }'; }

# not_realtime PID: the threads of PID that are not SCHED_RR (policy, field 41, is 2), as
# "tid:policy" words (empty when all are)
not_realtime() { stat_fields /proc/"$1"/task/*/stat | awk '$40 != 2 { print $1 ":" $40 }'; }

# size_kib 384M|1G|...: KiB
size_kib() {
    case "$1" in
        *G) echo $((${1%G} * 1024 * 1024)) ;;
        *M) echo $((${1%M} * 1024)) ;;
        *K) echo "${1%K}" ;;
        *) echo $(($1 / 1024)) ;;
    esac
}

# twohost: messages between the VMs, one line per TCP connection to $PEER_PORT (busybox nc).
# peer_send ADDR TEXT [TRIES]: retried once a second (the peer may not be listening yet)
peer_send() {
    echo "$2" > /run/peer-out.msg
    _try=0
    while [ "$_try" -lt "${3:-30}" ]; do
        # shellcheck disable=SC2016
        run_bounded 10 /run/peer-send.log sh -c 'nc -w 5 "$1" "$2" < "$3"' sh "$1" "$PEER_PORT" \
            /run/peer-out.msg && return 0
        _try=$((_try + 1))
        sleep 1
    done
    return 1
}

# peer_recv SECONDS: waits for one message; prints it (empty on time-out)
peer_recv() {
    # shellcheck disable=SC2016
    run_bounded "$1" /run/peer-in.msg sh -c 'nc -l -p "$1" < /dev/null' sh "$PEER_PORT" \
        || : > /run/peer-in.msg
    head -n 1 /run/peer-in.msg
}

# peer_tell TEXT: twohost only, once: tell the other VM that this one failed
peer_tell() {
    [ "$MODE" = twohost ] && [ "$PEER_TOLD" = 0 ] || return 0
    PEER_TOLD=1
    if [ "$ROLE" = client ]; then _to=$ADDR; else _to=$CLIENT_ADDR; fi
    peer_send "$_to" "$1" 5 || say "could not tell $_to: $1"
}

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
# The plugin's default volume key (no volume-key=) is created in $STATE_DIRECTORY: on the
# tmpfs, the same for every nbdkit of this boot (a restarted one reattaches its volume).
export STATE_DIRECTORY=/run/rdmaswap-state
hostname rdmaswap-vm
exec < /dev/console > /dev/console 2>&1
# every SysRq function: the host sends w/m/l/t through qemu's monitor to a VM about to time out
echo 1 > /proc/sys/kernel/sysrq

# twohost: the kernel command line says which VM this is
for _w in $(cat /proc/cmdline); do
    case "$_w" in rdmaswap.role=*) ROLE=${_w#rdmaswap.role=} ;; esac
done
if [ "$MODE" = twohost ]; then
    case "$ROLE" in
        server|client) hostname "rdmaswap-$ROLE" ;;
        *) ROLE=""; fail "twohost: no rdmaswap.role=server|client on the kernel command line" ;;
    esac
fi

say "guest up at $(uptime_s) s: kernel $(uname -r), $(nproc) CPUs," \
    "$(sed -n 's/^MemTotal: *//p' /proc/meminfo) RAM, mode=$MODE${ROLE:+ role=$ROLE} runs=$RUNS mib=$MIB"

# Kernel modules, in `modprobe --show-depends` order (the host wrote the list).
while read -r _mod _params; do
    [ -n "$_mod" ] || continue
    # shellcheck disable=SC2086
    insmod "$_mod" $_params || fail "insmod $_mod failed"
done < /etc/rdmaswap-vm/modules
_nopt=0
if [ -s /etc/rdmaswap-vm/modules-optional ]; then
    while read -r _mod _params; do
        [ -n "$_mod" ] || continue
        # shellcheck disable=SC2086
        if insmod "$_mod" $_params 2>/dev/null; then
            _nopt=$((_nopt + 1))
        else
            say "optional module ${_mod##*/} not loaded"
        fi
    done < /etc/rdmaswap-vm/modules-optional
fi
say "modules loaded: $(wc -l < /etc/rdmaswap-vm/modules) + $_nopt optional"

# Network: lo, and a veth pair in the initial namespace; the single Soft-RoCE device sits on veth0
# and both the memserver and the plugin use its address (rxe loopback).  twohost: the VMs' virtio
# NIC eth0 (joined by qemu's socket netdev), VM A (server) $ADDR, VM B (client) $CLIENT_ADDR, and
# one Soft-RoCE device on each eth0.
"$IP" link set lo up || fail "ip link set lo up"
if [ "$MODE" = twohost ]; then
    NETDEV=eth0
    MYADDR=$ADDR
    [ "$ROLE" = client ] && MYADDR=$CLIENT_ADDR
    wait_until 20 test -e /sys/class/net/eth0 || fail "no eth0 (virtio-net) in the VM"
    "$IP" addr add "$MYADDR/24" dev eth0 || fail "ip addr add $MYADDR/24 dev eth0"
    "$IP" link set eth0 up || fail "cannot bring eth0 up"
    say "eth0: $MYADDR, $(cat /sys/class/net/eth0/address)"
else
    NETDEV=veth0
    "$IP" link add veth0 type veth peer name veth1 || fail "cannot create the veth pair"
    "$IP" addr add "$ADDR/24" dev veth0 || fail "ip addr add $ADDR/24 dev veth0"
    "$IP" link set veth0 up && "$IP" link set veth1 up || fail "cannot bring veth0/veth1 up"
fi

port_active() { grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null; }
if rdma link add rxe0 type rxe netdev "$NETDEV" && wait_until 20 port_active \
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
    kill) [ "$KILL_TRANSPORT" = rdma ] && needs_rdma=1 ;;
    twohost) needs_rdma=1 ;;
    *) case " $RUNS " in *"rdma "*) needs_rdma=1 ;; esac ;;
esac
if [ "$needs_rdma" = 1 ] && [ "$RDMA_OK" != 1 ]; then
    fail "Soft-RoCE device rxe0 on $NETDEV is not usable"
fi

# dmesg must stay clean (no OOM kill either); in kill mode I/O errors are expected.
check_dmesg() {
    _pat='WARNING:|BUG:|blocked for more than|Oops|general protection fault|Out of memory|oom-kill'
    if [ "$1" != allow-io-errors ]; then
        _pat="$_pat|I/O error"
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

AUTH_KEY=/etc/rdmaswap/auth.key # the cluster key run-vm-test.sh put in the initramfs
# Donor certificates (docs/security.md, "Roles"): run-vm-test.sh put the test's CA in the
# initramfs too (one for both VMs of twohost). Every memserver gets a donor key and a certificate
# for the address the plugin dials (donor_cert_args; over RDMA too: the check runs on the TCP
# control connection) and every rdmaswap plugin donor-ca= and donor-crl=: it uses only them.
CERT_CA_KEY=/etc/rdmaswap/donor-ca.key
CERT_CRL=/etc/rdmaswap/donor-ca.crl
case " $PLUGIN_ARGS" in
    *" donor-ca="* | *" insecure="*) ;; # --plugin-args chose
    *) [ ! -f "$CERT_CA_KEY" ] \
        || PLUGIN_ARGS="donor-ca=$CERT_CA_KEY.pub donor-crl=$CERT_CRL${PLUGIN_ARGS:+ $PLUGIN_ARGS}" ;;
esac
# donor_cert_args HOST PORT: set DONOR_ARGS to --donor-key/--donor-cert for a memserver dialled
# at HOST:PORT, made with rdmaswapctl in /run/donor on first use (a restart on that address
# reuses them); empty without the CA (modes that run no memserver).
donor_cert_args() {
    DONOR_ARGS=""
    [ -f "$CERT_CA_KEY" ] || return 0
    _dk=/run/donor/$1-$2.key
    if [ ! -f "$_dk.cert" ]; then
        mkdir -p /run/donor
        rm -f "$_dk" "$_dk.pub"
        if ! { rdmaswapctl donor-key create "$_dk" && rdmaswapctl cert issue \
            "ca-key=$CERT_CA_KEY" "donor-key=$_dk.pub" "name=donor-$1-$2" "addresses=$1:$2" \
            days=1 "out=$_dk.cert"; } > /run/donor/cert.out 2>&1; then
            cat /run/donor/cert.out
            fail "donor key and certificate for $1:$2 (rdmaswapctl)"
        fi
    fi
    DONOR_ARGS="--donor-key $_dk --donor-cert $_dk.cert"
}
ctl_ok() { rdmaswapctl status "server=$ADDR:$PORT" "auth-key=$AUTH_KEY" > /run/ctl.out 2>&1; }
ms_ready() { alive "$MS_PID" && ctl_ok; }

# start_memserver TRANSPORT
start_memserver() {
    donor_cert_args "$ADDR" "$PORT"
    say "starting rdmaswap-memserver --transport $1 --capacity $CAPACITY --slab-size $SLAB $MS_RT${MS_ARGS:+ $MS_ARGS}${DONOR_ARGS:+ $DONOR_ARGS}"
    # shellcheck disable=SC2086
    $MS_WRAP rdmaswap-memserver --listen "$ADDR" --port "$PORT" --capacity "$CAPACITY" \
        --slab-size "$SLAB" --transport "$1" --auth-key "$AUTH_KEY" $MS_RT $MS_ARGS $DONOR_ARGS \
        > "$MS_LOG" 2>&1 &
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

# start_nbdkit PLUGIN ARGS...: nbdkit --swap -f in the background.  Not nbdkit's own daemon mode:
# --swap's mlockall() happens before nbdkit forks into the background, and memory locks are not
# inherited across fork(2), so a daemonised nbdkit --swap runs with nothing locked (measured:
# VmLck 0 kB; systemd/rdmaswap-nbdkit.service runs it with -f too).
start_nbdkit() {
    rm -f "$NBDKIT_PIDFILE" "$SOCK"
    _filters=""
    _fargs=""
    if [ "$NBDKIT_STATS" = 1 ]; then
        _filters="--filter=stats"     # filter parameters go after the plugin's
        _fargs="statsfile=/run/nbdkit-stats.txt statsappend=true"
    fi
    say "starting nbdkit --swap -f${_filters:+ $_filters} $*${_fargs:+ $_fargs}"
    # Smaller thread stacks: --swap locks every thread's whole stack.
    # shellcheck disable=SC3045  # busybox ash has ulimit -s
    # shellcheck disable=SC2086
    (ulimit -s 1024; exec $NBDKIT_WRAP nbdkit --swap -f --log=stderr -P "$NBDKIT_PIDFILE" -U "$SOCK" $_filters "$@" $_fargs) \
        >> "$NBDKIT_LOG" 2>&1 &
    NBDKIT_PID=$!
    echo -1000 > "/proc/$NBDKIT_PID/oom_score_adj" 2>/dev/null
    if ! wait_until 60 eval 'test -S "$SOCK" && test -s "$NBDKIT_PIDFILE" || ! alive $NBDKIT_PID'; then
        fail "nbdkit made no socket $SOCK within 60 s"
    fi
    if ! alive "$NBDKIT_PID"; then
        wait "$NBDKIT_PID"
        _rc=$?
        NBDKIT_PID=""
        fail "nbdkit failed to start (exit $_rc)"
    fi
    [ "$(cat "$NBDKIT_PIDFILE")" = "$NBDKIT_PID" ] \
        || fail "nbdkit's pidfile says $(cat "$NBDKIT_PIDFILE"), expected $NBDKIT_PID"
    # --swap: everything nbdkit has mapped is locked
    _lck=$(proc_status_kib "$NBDKIT_PID" VmLck)
    _rss=$(proc_status_kib "$NBDKIT_PID" VmRSS)
    say "nbdkit pid $NBDKIT_PID: VmLck ${_lck:-?} kB, VmRSS ${_rss:-?} kB"
    [ -n "$_lck" ] && [ -n "$_rss" ] && [ $((_lck * 10)) -ge $((_rss * 9)) ] \
        || fail "nbdkit --swap is not locked in memory: VmLck ${_lck:-?} kB, VmRSS ${_rss:-?} kB"
}

stop_nbdkit() {
    [ -n "$NBDKIT_PID" ] || return 0
    kill -TERM "$NBDKIT_PID" 2>/dev/null
    if ! wait_until 30 eval '! alive $NBDKIT_PID'; then
        kill -9 "$NBDKIT_PID" 2>/dev/null
        fail "nbdkit did not exit within 30 s of SIGTERM"
    fi
    wait "$NBDKIT_PID" 2>/dev/null   # reap it (it is our child now)
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
            # shellcheck disable=SC2086
            start_nbdkit rdmaswap "server=$ADDR:$PORT" "size=$NBD_SIZE" "transport=$1" \
                "auth-key=$AUTH_KEY" $PLUGIN_ARGS
            ;;
    esac
}

teardown_backend() {
    stop_nbdkit
    stop_memserver
}

# crypt_open: what crypttab's `swap` option does: plain dm-crypt with a random key, over /dev/nbd0
crypt_open() {
    run_bounded 60 /run/cryptsetup.log cryptsetup open --type plain --key-file /dev/urandom \
        --cipher aes-xts-plain64 --key-size 512 /dev/nbd0 "$CRYPT_NAME"
    _rc=$?
    cat /run/cryptsetup.log
    [ "$_rc" = 0 ] || fail "cryptsetup open --type plain /dev/nbd0 $CRYPT_NAME failed (exit $_rc)"
    [ -b "/dev/mapper/$CRYPT_NAME" ] || fail "/dev/mapper/$CRYPT_NAME missing after cryptsetup open"
    run_bounded 30 /run/cryptsetup-status.log cryptsetup status "$CRYPT_NAME"
    sed 's/^/cryptsetup status: /' /run/cryptsetup-status.log
    grep -q 'cipher: *aes-xts-plain64' /run/cryptsetup-status.log \
        && grep -q 'device: *\/dev\/nbd0' /run/cryptsetup-status.log \
        || fail "cryptsetup status $CRYPT_NAME: not aes-xts-plain64 over /dev/nbd0"
}

crypt_close() {
    run_bounded 60 /run/cryptsetup.log cryptsetup close "$CRYPT_NAME" \
        || { cat /run/cryptsetup.log; fail "cryptsetup close $CRYPT_NAME failed or hung"; }
}

swap_used_kib() { awk -v d="$SWAPDEV" '$1 == d { print $4 }' /proc/swaps; }

# prefill: write the whole of /dev/nbd0 once before it becomes swap, so that the plugin holds every
# slab (and the memserver has registered every slab's memory region) before any memory pressure:
# no slab grant, no ibv_reg_mr on the swap-out path.  A diagnostic workaround (--prefill), not the
# default: without it, whole-VM pressure with the memserver in the same VM can deadlock (README).
prefill() {
    _mib=$(($(cat /sys/block/nbd0/size) / 2048))
    _t0=$(uptime_s)
    run_bounded 600 /run/prefill.log dd if=/dev/zero of=/dev/nbd0 bs=1M count="$_mib" conv=fsync \
        || { cat /run/prefill.log; fail "prefill: writing $_mib MiB of zeros to /dev/nbd0 failed"; }
    say "prefill: $_mib MiB written to /dev/nbd0 in $(elapsed "$_t0" "$(uptime_s)") s"
    echo 3 > /proc/sys/vm/drop_caches
}

# swap_on [crypt]: /dev/nbd0 (or dm-crypt over it) as swap
swap_on() {
    nbd_connect -swap
    [ "$PREFILL" = 1 ] && prefill
    SWAPDEV=/dev/nbd0
    if [ "$1" = crypt ]; then
        crypt_open
        SWAPDEV=/dev/mapper/$CRYPT_NAME
    fi
    mkswap "$SWAPDEV" > /run/mkswap.log 2>&1 || { cat /run/mkswap.log; fail "mkswap $SWAPDEV failed"; }
    swapon "$SWAPDEV" || fail "swapon $SWAPDEV failed"
    [ -n "$(swap_used_kib)" ] || { cat /proc/swaps; fail "$SWAPDEV not in /proc/swaps after swapon"; }
}

swap_off() {
    run_bounded 180 /run/swapoff.log swapoff "$SWAPDEV" \
        || { cat /run/swapoff.log; fail "swapoff $SWAPDEV failed or hung"; }
    [ "$SWAPDEV" = /dev/nbd0 ] || crypt_close
    SWAPDEV=/dev/nbd0
    nbd_disconnect
}

ctl_value() { sed -n "s/^$1=//p" /run/ctl.out | head -n 1; }

# A new shell so that $$ is the workload's own pid (in a subshell $$ would be PID 1).
in_cgroup_swapload() {
    # shellcheck disable=SC2016,SC2086
    sh -c 'echo $$ > "$1/cgroup.procs" || exit 3; shift; exec swapload "$@"' \
        sh "$CG" --mib "$MIB" --passes "$PASSES" --seed "$SEED" $SWAPLOAD_ARGS
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
        "swap used $(swap_used_kib) KiB now"
    [ "$_rc" = 124 ] && fail "[$1] swapload did not finish within $WORK_TIMEOUT s"
    [ "$_rc" = 137 ] && fail "[$1] swapload was killed (OOM?): $(tr '\n' ' ' < "$CG/memory.events")"
    grep -q '^swapload: OK pages=' /run/swapload.out \
        || fail "[$1] $(grep -m1 'MISMATCH' /run/swapload.out || echo "exit $_rc, no OK line")"
    [ "$_rc" = 0 ] || fail "[$1] swapload exit status $_rc"
    [ "$W_OUT" -ge "$MIN_PSWPOUT" ] \
        || fail "[$1] pswpout grew by $W_OUT pages, expected >= $MIN_PSWPOUT"
    [ "$W_IN" -gt 0 ] || fail "[$1] pswpin did not grow"
    rmdir "$CG" 2>/dev/null
    W_MIB=$MIB
}

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

# one_swap_run RUN: RUN is [pressure-][crypt-]memory|tcp|rdma: the workload in the memory-limited
# cgroup, or (pressure-) on the whole VM; the swap device /dev/nbd0, or (crypt-) dm-crypt over it.
# Sets up, swaps, checks, tears down.  Appends a line to /run/bench.txt.
one_swap_run() {
    case "$1" in
        repkill-*) repkill_run "${1#repkill-}"; return ;;
        backupkill-*) backupkill_run "${1#backupkill-}"; return ;;
        alloc-*) alloc_run "${1#alloc-}"; return ;;
        acct-*) acct_run "${1#acct-}"; return ;;
        reattach-*) reattach_run block "${1#reattach-}"; return ;;
        persist-*) reattach_run swap "${1#persist-}"; return ;;
        reconnect-*) reconnect_run "${1#reconnect-}"; return ;;
        soak-*) soak_run "${1#soak-}"; return ;;
        app-*) app_run "${1#app-}"; return ;;
        fence-*) fence_run "${1#fence-}"; return ;;
    esac
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

# ---------------------------------------------------------------------------------------------
# repkill-T (issue 4): replicated swap over T with a donor killed mid-run.  REP_SERVERS memservers
# on one address and consecutive ports, the plugin with every one as server=, replicas=REP_REPLICAS
# and statusfile=; the cgroup workload swaps, and once pswpout has grown by REP_KILL_AT pages while
# swapload still runs, the memserver holding the most slabs gets SIGKILL.  Then every page must
# verify, the kernel log must show no I/O error and no hung task, and the plugin's status must get
# back to full redundancy (degraded=0 lost=0 repaired>0) within REP_WAIT s; over RDMA the survivors
# must have served no TCP data operation (one-sided data path and repair).

ctl_port() { rdmaswapctl status "server=$ADDR:$1" "auth-key=$AUTH_KEY" > "/run/ctl-$1.out" 2>&1; }
ctl_port_value() { sed -n "s/^$2=//p" "/run/ctl-$1.out" | head -n 1; }
status_value() { sed -n "s/^$1=//p" "$STATUSFILE" 2>/dev/null | head -n 1; }
rep_pid() { eval "echo \${REP_PID$1:-}"; }
rep_port() { echo $((PORT + $1 - 1)); }
rep_ready() { alive "$(rep_pid "$1")" && ctl_port "$(rep_port "$1")"; }
full_redundancy() {
    [ "$(status_value degraded)" = 0 ] && [ "$(status_value lost)" = 0 ] \
        && [ "$(status_value repaired)" -gt 0 ] 2>/dev/null
}
# the kill condition: pswpout grew by REP_KILL_AT pages (or the workload ended: checked after)
rep_swapping() { [ $(($(vmstat pswpout) - _out0)) -ge "$REP_KILL_AT" ] || ! alive "$_wpid"; }

# swapload_until_kill: swapload in the memory-limited cgroup in the background (pid _wpid),
# returns once pswpout has grown by REP_KILL_AT pages while it still runs (sets _out0 _in0 _t0)
swapload_until_kill() {
    echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    [ -d "$CG" ] || mkdir "$CG" || fail "cannot create cgroup $CG"
    echo "$CG_MAX" > "$CG/memory.max" || fail "cannot set $CG/memory.max (memory controller?)"
    _out0=$(vmstat pswpout)
    _in0=$(vmstat pswpin)
    say "[$CUR] swapload --mib $MIB --passes $PASSES in a cgroup with memory.max=$CG_MAX;" \
        "kill after pswpout +$REP_KILL_AT"
    _t0=$(uptime_s)
    in_cgroup_swapload > /run/swapload.out 2>&1 &
    _wpid=$!
    wait_until "$WORK_TIMEOUT" rep_swapping
    alive "$_wpid" || { cat /run/swapload.out; fail "[$CUR] swapload ended before the kill (pswpout +$(($(vmstat pswpout) - _out0))): the kill would not land mid-run"; }
    rep_swapping || { kill -9 "$_wpid"; fail "[$CUR] pswpout did not grow by $REP_KILL_AT pages within $WORK_TIMEOUT s"; }
}

# start_memservers N T CAPACITY SLAB: N memservers over T on ports PORT.. (pids REP_PID1..N,
# logs /run/memserver-I.log), each answering rdmaswapctl; sets _servers (the plugin's server=)
start_memservers() {
    _servers=""
    _i=1
    while [ "$_i" -le "$1" ]; do
        _p=$(rep_port "$_i")
        donor_cert_args "$ADDR" "$_p"
        # shellcheck disable=SC2086
        rdmaswap-memserver --listen "$ADDR" --port "$_p" --capacity "$3" \
            --slab-size "$4" --transport "$2" --auth-key "$AUTH_KEY" $MS_RT $DONOR_ARGS \
            > "/run/memserver-$_i.log" 2>&1 &
        eval "REP_PID$_i=$!"
        echo -1000 > "/proc/$!/oom_score_adj" 2>/dev/null
        _servers="$_servers server=$ADDR:$_p"
        _i=$((_i + 1))
    done
    _t0=$(uptime_s)
    _i=1
    while [ "$_i" -le "$1" ]; do
        wait_until "$SERVER_WAIT" rep_ready "$_i" \
            || { file_tail "/run/memserver-$_i.log" 20 "memserver $_i log"; fail "[$CUR] memserver $_i (port $(rep_port "$_i")) not ready within $SERVER_WAIT s"; }
        _i=$((_i + 1))
    done
    say "[$CUR] $1 memservers ready after $(elapsed "$_t0" "$(uptime_s)") s"
}

# stop_memservers N: SIGTERM to those of REP_PID1..N still running, each must exit 0
stop_memservers() {
    _i=1
    while [ "$_i" -le "$1" ]; do
        MS_PID=$(rep_pid "$_i")
        stop_memserver
        eval "REP_PID$_i="
        _i=$((_i + 1))
    done
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

# backupkill-T (issue 15): repkill-T with one memserver, replicas=1 and the plugin's disk backup
# tier (backup= a file in the VM's /run): the only donor is killed mid-run, every page must still
# verify (swapped-out pages are read from the file, new ones written there alone), no I/O error,
# and the status must show them served by the file (backup_only > 0, lost=0).
backupkill_run() {   # backupkill_run tcp|rdma
    _saved_servers=$REP_SERVERS _saved_replicas=$REP_REPLICAS
    REP_SERVERS=1 REP_REPLICAS=1 REP_BACKUP=/run/rdmaswap-backup.img
    rm -f "$REP_BACKUP"
    repkill_run "$1"
    rm -f "$REP_BACKUP"
    REP_BACKUP="" REP_SERVERS=$_saved_servers REP_REPLICAS=$_saved_replicas
}

# ---------------------------------------------------------------------------------------------
# alloc-T (issue 5): tests/alloc's allocation counter (LD_PRELOAD) in nbdkit with the plugin and in
# the memserver, the data path over T.  nbddrive writes the whole 64 MiB device, warms up, then
# counts over ALLOC_REQUESTS mixed 4/32/128 KiB reads and writes (4 connections, 16 in flight each);
# every count must be 0.  Control: a new NBD connection must make nbdkit allocate and rdmaswapctl
# status the memserver, or the counter is blind.

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

# ---------------------------------------------------------------------------------------------
# acct-T (issue 13, "RDMA path accounting"): memserver + nbdkit with the plugin over T, the
# device filled once, then per row of ACCT_ROWS (RW:BS:QD) ACCT_SECONDS of fio (nbd engine on
# nbdkit's socket, one connection, random offsets); the plugin's status file (io_requests,
# data_batches, rdma_*) and nbdkit's CPU time are read before and after each row, and the
# differences printed per request as RDMASWAP-VM-ACCT lines (bench/rdma-accounting.sh). Fails if
# a row saw an error, or (rdma) if the accounting is off: no request counted, more doorbells than
# requests (each request here is one batch), or a completion count that is not one per doorbell.

acct_snapshot() {   # acct_snapshot FILE: the status file's counters and nbdkit's CPU seconds
    # the plugin rewrites the status every second: wait past the next write, so that nothing
    # the last fio row did is missing
    sleep 2
    { grep -E '^(io_|data_|rdma_)' "$STATUSFILE"; echo "cpu_s=$(cpu_s "$NBDKIT_PID")"; } > "$1"
}

acct_value() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" /run/acct-raw; }   # acct_value KEY

acct_run() {   # acct_run tcp|rdma
    _t=$1
    CUR=acct-$_t
    _r0=$(uptime_s)
    say "===== $CUR: data path accounting over $_t (fio nbd engine, $ACCT_SECONDS s per row) ====="
    command -v fio > /dev/null || fail "[$CUR] fio is not in the image"
    _cap=$CAPACITY
    CAPACITY=$ACCT_SIZE
    : > /run/nbdkit.log
    rm -f "$STATUSFILE"
    start_memserver "$_t"
    CAPACITY=$_cap
    # shellcheck disable=SC2086
    start_nbdkit rdmaswap "server=$ADDR:$PORT" "size=$ACCT_SIZE" "transport=$_t" \
        "auth-key=$AUTH_KEY" "statusfile=$STATUSFILE" $PLUGIN_ARGS
    wait_until 10 test -s "$STATUSFILE" || fail "[$CUR] the plugin wrote no $STATUSFILE within 10 s"
    _uri="nbd+unix:///?socket=$SOCK"
    # every slab granted and written first: reads hit the donor, writes allocate nothing
    _t0=$(uptime_s)
    run_bounded 300 /run/fio-fill.out fio --name=fill --thread --ioengine=nbd --uri="$_uri" \
        --rw=write --bs=1M --iodepth=4 --output-format=terse \
        || { cat /run/fio-fill.out; fail "[$CUR] fio could not fill the device"; }
    say "[$CUR] $ACCT_SIZE filled in $(elapsed "$_t0" "$(uptime_s)") s"
    : > /run/acct.txt
    for _row in $ACCT_ROWS; do
        _rw=${_row%%:*}
        _bs=${_row#*:}
        _bs=${_bs%%:*}
        _qd=${_row##*:}
        acct_snapshot /run/acct-before
        run_bounded $((ACCT_SECONDS + 120)) /run/fio-row.out fio --name="$_row" --thread \
            --ioengine=nbd --uri="$_uri" --rw="$_rw" --bs="$_bs" --iodepth="$_qd" \
            --runtime="$ACCT_SECONDS" --time_based --norandommap --randrepeat=0 \
            --output-format=terse
        _rc=$?
        [ "$_rc" = 0 ] || { cat /run/fio-row.out; fail "[$CUR] fio $_row failed (exit $_rc)"; }
        acct_snapshot /run/acct-after
        # terse v3: field 5 the error, 8 read IOPS, 49 write IOPS
        _iops=$(awk -F';' '/^3;/ { if ($5 != 0) print "error"; else print $8 + $49 }' /run/fio-row.out)
        case "$_iops" in ""|error) cat /run/fio-row.out; fail "[$CUR] fio $_row reported an error" ;; esac
        # /run/acct.txt: ROW REQUESTS IOPS, then per request: POSTS DOORBELLS POLLS EMPTY
        # COMPLETIONS ARMS SLEEPS BATCHES CPU-US; /run/acct-raw: the row's raw differences
        awk -F= -v row="$_row" -v iops="$_iops" '
            FILENAME == "/run/acct-before" { a[$1] = $2; next }
            { d[$1] = $2 - a[$1] }
            END {
                r = d["io_requests"]
                printf "raw %s requests=%d batches=%d posts=%d doorbells=%d polls=%d empty=%d completions=%d arms=%d sleeps=%d cpu_s=%.2f\n",
                    row, r, d["data_batches"], d["rdma_posts"], d["rdma_doorbells"], d["rdma_polls"],
                    d["rdma_polls_empty"], d["rdma_completions"], d["rdma_arms"], d["rdma_sleeps"],
                    d["cpu_s"] > "/run/acct-raw"
                if (r <= 0)
                    exit
                printf "%s %d %.0f %.2f %.2f %.2f %.2f %.2f %.2f %.2f %.2f %.0f\n", row, r, iops,
                    d["rdma_posts"] / r, d["rdma_doorbells"] / r, d["rdma_polls"] / r,
                    d["rdma_polls_empty"] / r, d["rdma_completions"] / r, d["rdma_arms"] / r,
                    d["rdma_sleeps"] / r, d["data_batches"] / r, d["cpu_s"] * 1e6 / r
            }' /run/acct-before /run/acct-after >> /run/acct.txt
        say "[$CUR] $_row: fio $_iops IOPS; $(cat /run/acct-raw)"
        _req=$(acct_value requests)
        [ "${_req:-0}" -gt 0 ] || fail "[$CUR] $_row: the status counted no request (io_requests did not grow)"
        if [ "$_t" = rdma ]; then
            _posts=$(acct_value posts) _bells=$(acct_value doorbells) _compl=$(acct_value completions)
            [ "$_posts" -ge "$_req" ] || fail "[$CUR] $_row: $_posts WRs posted for $_req requests (fewer than one each)"
            [ "$_bells" -le "$_req" ] || fail "[$CUR] $_row: $_bells doorbells for $_req requests (each is one batch here: one doorbell at most)"
            [ "$_compl" = "$_bells" ] || fail "[$CUR] $_row: $_compl completions for $_bells doorbells (one signaled WR per batch)"
        fi
    done
    {
        echo "transport=$_t seconds_per_row=$ACCT_SECONDS size=$ACCT_SIZE; fio nbd engine, one connection; from posts on: per request"
        printf '%-16s %8s %6s %6s %6s %7s %7s %6s %6s %6s %7s %7s\n' row requests iops \
            posts bells polls empty compl arms sleeps batches cpu_us
        awk '{ printf "%-16s %8d %6d %6s %6s %7s %7s %6s %6s %6s %7s %7d\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 }' /run/acct.txt
    } | sed 's/^/RDMASWAP-VM-ACCT: /'
    stop_nbdkit
    stop_memserver
    check_dmesg
    say "[$CUR] PASS: accounting of $(wc -l < /run/acct.txt) rows; whole run $(elapsed "$_r0" "$(uptime_s)") s"
}

# ---------------------------------------------------------------------------------------------
# swapload_after_kill kill|restart: waits (bounded) for the swapload started by
# swapload_until_kill, then checks it verified every page and swapped in after the kill
# (_kout/_kin: counts at the kill; the word names the event in the messages).  Sets W_SECS W_OUT W_IN.
swapload_after_kill() {
    wait_until "$WORK_TIMEOUT" eval '! alive $_wpid' \
        || { kill -9 "$_wpid"; fail "[$CUR] swapload did not finish within $WORK_TIMEOUT s of the $1 (hang?)"; }
    wait "$_wpid"
    _rc=$?
    W_SECS=$(elapsed "$_t0" "$(uptime_s)")
    W_OUT=$(($(vmstat pswpout) - _out0))
    W_IN=$(($(vmstat pswpin) - _in0))
    cat /run/swapload.out
    say "[$CUR] swapload exit $_rc in $W_SECS s: pswpout +$W_OUT pswpin +$W_IN pages" \
        "(after the kill: +$((W_OUT - _kout)) +$((W_IN - _kin)))"
    grep -q '^swapload: OK pages=' /run/swapload.out \
        || fail "[$CUR] $(grep -m1 'MISMATCH' /run/swapload.out || echo "swapload exit $_rc, no OK line") after the $1"
    [ "$_rc" = 0 ] || fail "[$CUR] swapload exit status $_rc"
    [ $((W_IN - _kin)) -gt 0 ] || fail "[$CUR] nothing was swapped in after the $1"
}

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

# ---------------------------------------------------------------------------------------------
# soak-T (issue 11): the fault soak.  SOAK_SERVERS memservers over T, each on its own link: the
# plugin side is rxe0 on veth0 (ADDR), as in every other run; veth0's peer veth1 is a port of a
# bridge br0, and donor I has a veth pair vdI (address SOAK_ADDR I = 10.77.0.(10+I), its own
# Soft-RoCE device rxeI) / vbI (a port of br0).  All of it stays in the initial network
# namespace: kernel 6.1's rxe has its UDP socket only there (a second namespace never receives,
# /work/shared/notes/vm-testing.md).  What makes traffic between these local addresses leave
# through the veths instead of `lo` is policy routing: the `local` table's rule moves from
# priority 0 to 100, packets that arrive on veth0 or vdI are looked up in `local` first (they
# are delivered), and every other lookup to a donor address goes out of veth0 (table 100), and
# from donor I out of vdI (table 100+I); accept_local=1 lets a packet whose source is a local
# address in, static neighbour entries replace ARP.  rxe itself sends through the same route
# lookup and short-cuts only a destination equal to its source, so its packets cross the veths
# too: soak_link_check proves it with ib_read_lat before the soak (a netem delay on vd1 must show
# in the RDMA READ latency), and each fault line counts the packets that crossed the link.
#
# Then nbdkit with the plugin (server= the three, replicas=2, timeout=SOAK_PLUGIN_TIMEOUT,
# statusfile=), /dev/nbd0 written whole (every slab granted: every probe read goes to a donor)
# and used as swap; for SOAK_SECONDS: swapload --rewrite --seconds in a cgroup (memory.max
# SOAK_CG_MAX; it checks every page it reads and times every access), nbdprobe (4 KiB O_DIRECT
# read of /dev/nbd0 every 100 ms), and the injector, which cycles through these faults, one at
# a time, each on the donor that holds the most slabs then (the plugin's status file):
#   delay      netem delay 50-500 ms on both ends of the donor's link, for 4-8 s
#   loss       netem loss 5-30 % on both ends, for 4-8 s
#   partition  a drop rule in the nftables netdev ingress chains of vdI and vbI (both
#              directions), for 5-30 s
#   stop       SIGSTOP of the donor's memserver, SIGCONT 3-10 s later
#   kill       kill -9 of the donor's memserver and a restart with the same arguments (it comes
#              back empty)
# After each fault it waits until the plugin has every slab on 2 valid replicas again (a status
# file written at least timeout= + 2 s after the fault), then 2-5 s, then the next fault: with
# replicas=2 a second donor's fault before the repair is a double fault, which may fail with
# EIO.  Not back to full redundancy by the end: no more faults (said in the report).
# Meanwhile the history checker (issue 25): a second nbdkit with the plugin over T to the same
# memservers (replicas=2, the same timeout=, no --swap: nothing swaps to it; size SOAK_HIST_SIZE,
# its own socket, status file and volume name) serves nbdhistory, which writes self-naming
# blocks, reads, trims and zeroes them from SOAK_HIST_THREADS connections (hot set, failed
# writes retried with new contents, whole-slab trims) and checks every read against the
# guarantee, then, once its faulty phase is over, rewrites the blocks whose last write failed
# and reads the whole export back.  The injector's wait for full redundancy covers both volumes.
# The schedule comes from SOAK_SEED (printed; the same seed gives the same faults).
# Report (RDMASWAP-VM-SOAK lines, printed by the host too): faults by kind, content errors,
# longest probe stall, longest page-in stall, hung-task warnings (kernel.hung_task_timeout_secs
# set to SOAK_HUNG for the run), I/O errors, the plugin's status, the history checker's
# operations, EIOs, violations and longest request against the bound (7 x timeout=).  FAIL on a
# content error (swapload MISMATCH or death), a violation of the guarantee (nbdhistory), an I/O
# error or hung task in dmesg, a failed probe read, either nbdkit dying, or the workload still
# running SOAK_GRACE s after its end.  EIO on the history export is allowed (a double fault, a
# donor killed while it held the only valid copy); wrong bytes are not.

SOAK_NET=0
# The history export (settings not in the list at the top of this file: a conf value wins)
: "${SOAK_HIST_SIZE:=16M}"   # soak runs: the history export's size= (two of the 8M slabs)
: "${SOAK_HIST_THREADS:=4}"  # soak runs: nbdhistory's threads, each with its NBD connection
: "${SOAK_HIST_RATE:=10}"    # soak runs: nbdhistory's operations per second per thread at most
: "${SOAK_HIST_TAIL:=4}"     # soak runs: nbdhistory's faulty phase ends this long before the
                             # soak's (its rewrite and read-back take about that much)
SOAK_HIST_SOCK=/run/nbd-hist.sock
SOAK_HIST_PIDFILE=/run/nbdkit-hist.pid
SOAK_HIST_STATUS=/run/rdmaswap-hist.status
SOAK_HIST_PID=""

soak_addr() { echo "10.77.0.$((10 + $1))"; }
soak_pid() { eval "echo \${SOAK_PID$1:-}"; }
soak_ctl() { rdmaswapctl status "server=$(soak_addr "$1"):$PORT" "auth-key=$AUTH_KEY" > "/run/ctl-soak-$1.out" 2>&1; }
soak_ready() { alive "$(soak_pid "$1")" && soak_ctl "$1"; }
# ge A B: A >= B (decimal numbers)
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
addf() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a + b }'; }
soak_sysctl() { echo "$3" > "/proc/sys/net/ipv4/conf/$1/$2" || fail "[$CUR] cannot set net.ipv4.conf.$1.$2=$3"; }
# packets that crossed donor I's link (both directions), from vdI's counters
soak_link_pkts() {
    cat "/sys/class/net/vd$1/statistics/rx_packets" "/sys/class/net/vd$1/statistics/tx_packets" \
        | awk '{ s += $1 } END { print s + 0 }'
}

soak_net() {
    [ "$SOAK_NET" = 1 ] && return 0
    _v0mac=$(cat /sys/class/net/veth0/address)
    "$IP" link add br0 type bridge forward_delay 0 || fail "[$CUR] cannot create the bridge br0"
    "$IP" link set veth1 master br0 && "$IP" link set br0 up || fail "[$CUR] cannot put veth1 in br0"
    for _c in all default veth0; do
        soak_sysctl "$_c" rp_filter 0
        soak_sysctl "$_c" accept_local 1
        soak_sysctl "$_c" arp_ignore 1
    done
    "$IP" route add 10.77.0.0/24 dev veth0 src "$ADDR" table 100 || fail "[$CUR] ip route (table 100)"
    "$IP" rule add pref 10 iif veth0 lookup local || fail "[$CUR] ip rule iif veth0"
    _i=1
    while [ "$_i" -le "$SOAK_SERVERS" ]; do
        _a=$(soak_addr "$_i")
        "$IP" link add "vd$_i" type veth peer name "vb$_i" || fail "[$CUR] cannot create vd$_i/vb$_i"
        "$IP" link set "vb$_i" master br0 && "$IP" link set "vb$_i" up || fail "[$CUR] cannot put vb$_i in br0"
        "$IP" addr add "$_a/32" dev "vd$_i" && "$IP" link set "vd$_i" up || fail "[$CUR] cannot set up vd$_i ($_a)"
        soak_sysctl "vd$_i" rp_filter 0
        soak_sysctl "vd$_i" accept_local 1
        soak_sysctl "vd$_i" arp_ignore 1
        "$IP" neigh replace "$_a" lladdr "$(cat "/sys/class/net/vd$_i/address")" dev veth0 nud permanent \
            && "$IP" neigh replace "$ADDR" lladdr "$_v0mac" dev "vd$_i" nud permanent \
            || fail "[$CUR] static neighbour entries for $_a"
        "$IP" route add 10.77.0.0/24 dev "vd$_i" src "$_a" table $((100 + _i)) \
            && "$IP" rule add pref $((10 + _i)) iif "vd$_i" lookup local \
            && "$IP" rule add pref $((20 + _i)) to "$_a" lookup 100 \
            && "$IP" rule add pref $((30 + _i)) from "$_a" lookup $((100 + _i)) \
            || fail "[$CUR] routing rules for $_a"
        rdma link add "rxe$_i" type rxe netdev "vd$_i" || fail "[$CUR] rdma link add rxe$_i netdev vd$_i"
        _i=$((_i + 1))
    done
    "$IP" rule add pref 100 lookup local && "$IP" rule del pref 0 lookup local \
        || fail "[$CUR] cannot move the local table's rule"
    # The partition's nftables chains: netdev ingress on both ends of each donor's link, empty
    # (accept) until a partition adds a drop rule.  Made once, here, before any traffic: adding
    # or removing the first ingress hook flips a static key (kernel code patched with int3
    # while packets run through it), and doing that mid-soak locked both virtual CPUs up in
    # __netif_receive_skb_core under qemu TCG (soft lockup, RCU stall; the nft process in D).
    {
        echo "table netdev soak {"
        _i=1
        while [ "$_i" -le "$SOAK_SERVERS" ]; do
            echo "  chain in_vd$_i { type filter hook ingress device \"vd$_i\" priority 0; policy accept; }"
            echo "  chain in_vb$_i { type filter hook ingress device \"vb$_i\" priority 0; policy accept; }"
            _i=$((_i + 1))
        done
        echo "}"
    } > /run/soak-chains.nft
    nft -f /run/soak-chains.nft || fail "[$CUR] nft -f /run/soak-chains.nft (the partition's chains)"
    _i=1
    while [ "$_i" -le "$SOAK_SERVERS" ]; do
        wait_until 20 grep -q ACTIVE "/sys/class/infiniband/rxe$_i/ports/1/state" \
            || fail "[$CUR] rxe$_i on vd$_i is not ACTIVE"
        _i=$((_i + 1))
    done
    say "[$CUR] links: $(ip -o -4 route get "$(soak_addr 1)" | head -n 1 | tr -s ' ');" \
        "$(ip -o -4 route get "$ADDR" from "$(soak_addr 1)" | head -n 1 | tr -s ' ')"
    SOAK_NET=1
}

# soak_link_check: RDMA between rxe0 and rxe1 really crosses vd1/vb1: ib_read_lat's 4 KiB READ
# latency to donor 1's address, plain and with netem delay D on both ends of the link (it must
# grow by at least 2 D).  Skipped without perftest in the image.
soak_link_check() {
    command -v ib_read_lat > /dev/null 2>&1 || { say "[$CUR] ib_read_lat not in the image: no link check"; return 0; }
    _d=50
    for _what in plain delay; do
        if [ "$_what" = delay ]; then
            "$TC" qdisc replace dev vd1 root netem delay "${_d}ms" \
                && "$TC" qdisc replace dev vb1 root netem delay "${_d}ms" || fail "[$CUR] tc netem on vd1/vb1"
        fi
        _c0=$(soak_link_pkts 1)
        ib_read_lat -d rxe1 -x 1 -s 4096 -n 20 > /run/ib-soak-server.log 2>&1 &
        _srv=$!
        _try=0
        while :; do
            sleep 1
            run_bounded 60 /run/ib-soak-client.log ib_read_lat -d rxe0 -x 1 -s 4096 -n 20 "$(soak_addr 1)" && break
            _try=$((_try + 1))
            if [ "$_try" -ge 5 ] || ! alive "$_srv"; then
                file_tail /run/ib-soak-server.log 20 "ib_read_lat server (rxe1)"
                file_tail /run/ib-soak-client.log 20 "ib_read_lat client (rxe0)"
                kill -9 "$_srv" 2>/dev/null
                fail "[$CUR] RDMA from rxe0 to rxe1 over vd1 failed (ib_read_lat)"
            fi
        done
        wait_until 10 eval '! alive $_srv' || kill -9 "$_srv" 2>/dev/null
        _lat=$(awk '$1 == 4096 { print $5 }' /run/ib-soak-client.log)
        _n=$(($(soak_link_pkts 1) - _c0))
        say "[$CUR] link check ($_what): rxe0 -> rxe1 4 KiB RDMA READ typical ${_lat:-?} us;" \
            "$_n packets crossed vd1"
        [ -n "$_lat" ] || fail "[$CUR] link check: no latency from ib_read_lat"
        if [ "$_what" = plain ]; then
            _lat0=$_lat
        else
            "$TC" qdisc del dev vd1 root; "$TC" qdisc del dev vb1 root
            ge "$_lat" "$(awk -v a="$_lat0" -v d="$_d" 'BEGIN { print a + 2 * d * 1000 * 0.9 }')" \
                || fail "[$CUR] link check: netem delay ${_d} ms each way on vd1/vb1 did not slow RDMA to rxe1 ($_lat0 -> $_lat us): the traffic does not cross the link"
        fi
        [ "$_n" -gt 40 ] || fail "[$CUR] link check: only $_n packets crossed vd1 during ib_read_lat"
    done
}

# soak_ms_start I: (re)start donor I's memserver (log appended), wait until it answers
soak_ms_start() {
    donor_cert_args "$(soak_addr "$1")" "$PORT"
    # shellcheck disable=SC2086
    rdmaswap-memserver --listen "$(soak_addr "$1")" --port "$PORT" --capacity "$SOAK_CAPACITY" \
        --slab-size "$SOAK_SLAB" --transport "$SOAK_T" --auth-key "$AUTH_KEY" $MS_RT $DONOR_ARGS \
        >> "/run/memserver-$1.log" 2>&1 &
    eval "SOAK_PID$1=$!"
    echo -1000 > "/proc/$!/oom_score_adj" 2>/dev/null
    [ "$2" = nowait ] && return 0
    wait_until "$SERVER_WAIT" soak_ready "$1" \
        || { file_tail "/run/memserver-$1.log" 20 "memserver $1 log"; fail "[$CUR] memserver $1 ($(soak_addr "$1")) not ready within $SERVER_WAIT s"; }
}

# soak_schedule SEED: the fault list, one per line: n kind donor param hold gap
#   delay: param ms each way; loss: param %; partition, stop: param s; hold: seconds the fault
#   lasts (kill: an estimate of the restart); gap: seconds after it before the next
soak_schedule() {
    awk -v seed="$1" -v nsrv="$SOAK_SERVERS" 'BEGIN {
        srand(seed)
        split("delay loss partition stop kill", kinds, " ")
        for (n = 0; n < 10000; n++) {
            k = kinds[n % 5 + 1]
            d = n % nsrv + 1
            if (k == "delay") { p = 50 + int(rand() * 451); h = 4 + int(rand() * 5) }
            else if (k == "loss") { p = 5 + int(rand() * 26); h = 4 + int(rand() * 5) }
            else if (k == "partition") { p = 5 + int(rand() * 26); h = p }
            else if (k == "stop") { p = 3 + int(rand() * 8); h = p }
            else { p = 0; h = 10 }
            print n + 1, k, d, p, h, 2 + int(rand() * 4)
        }
    }'
}

# soak_target N: the donor (1..SOAK_SERVERS) the plugin has in state ok that holds the most
# slabs (its status file's donor.K lines, K from 0); ties go to the donor after fault N's turn
# in the rotation; 0 if none is ok
soak_target() {
    sed -n 's/^donor\.\([0-9]*\)=.* state=\([a-z]*\) slabs=\([0-9]*\) .*/\1 \2 \3/p' "$STATUSFILE" \
        | awk -v n="$1" -v m="$SOAK_SERVERS" '
            $2 == "ok" {
                r = ($1 - (n - 1)) % m; if (r < 0) r += m
                key = $3 * 16 + (m - r)
                if (key > best) { best = key; d = $1 + 1 }
            }
            END { print d + 0 }'
}

# soak_redundant SINCE: both plugins (swap and history) hold every slab on 2 valid replicas,
# say status files written after SINCE (date +%s; a file is rewritten every second, unless the
# plugin's status thread waits, e.g. for a slab lock that a repair holds: then an old file must
# not count)
soak_redundant() {
    [ "$(stat -c %Y "$STATUSFILE" 2>/dev/null || echo 0)" -gt "$1" ] \
        && [ "$(status_value degraded)" = 0 ] && [ "$(status_value lost)" = 0 ] \
        && [ "$(stat -c %Y "$SOAK_HIST_STATUS" 2>/dev/null || echo 0)" -gt "$1" ] \
        && [ "$(soak_hist_value degraded)" = 0 ] && [ "$(soak_hist_value lost)" = 0 ]
}
soak_hist_value() { sed -n "s/^$1=//p" "$SOAK_HIST_STATUS" 2>/dev/null | head -n 1; }

# soak_hist_start T SERVERS: the history export's nbdkit in the background (soak_hist_ready
# waits for it): the plugin over T to the soak's memservers, replicas=2, timeout= as the swap
# plugin's.  No --swap (nothing swaps to this export), but the plugin locks nbdkit's memory
# itself (mlockall, as root): 1 MiB stacks (as start_nbdkit) and 2 threads per connection (-t;
# nbdhistory keeps one request in flight on each) keep that small.  realtime=0: not a swap
# device (no reclaim cycle to break), and at normal priority its load yields to the swap path
# and the injector instead of delaying them.
soak_hist_start() {
    rm -f "$SOAK_HIST_SOCK" "$SOAK_HIST_PIDFILE" "$SOAK_HIST_STATUS"
    : > /run/nbdkit-hist.log
    say "[$CUR] starting the history export: nbdkit -f -t 2 rdmaswap$2 size=$SOAK_HIST_SIZE" \
        "transport=$1 replicas=2 timeout=$SOAK_PLUGIN_TIMEOUT volume=soakhist lease=0 realtime=0${PLUGIN_ARGS:+ $PLUGIN_ARGS}"
    # shellcheck disable=SC3045,SC2086  # busybox ash has ulimit -s; PLUGIN_ARGS: words
    (ulimit -s 1024; exec nbdkit -f -t 2 --log=stderr -P "$SOAK_HIST_PIDFILE" -U "$SOAK_HIST_SOCK" \
        rdmaswap $2 "size=$SOAK_HIST_SIZE" "transport=$1" replicas=2 "timeout=$SOAK_PLUGIN_TIMEOUT" \
        "statusfile=$SOAK_HIST_STATUS" volume=soakhist lease=0 realtime=0 "auth-key=$AUTH_KEY" \
        $PLUGIN_ARGS) >> /run/nbdkit-hist.log 2>&1 &
    SOAK_HIST_PID=$!
    echo -1000 > "/proc/$SOAK_HIST_PID/oom_score_adj" 2>/dev/null
    SOAK_HIST_T0=$(uptime_s)
}

soak_hist_ready() {
    if ! wait_until 60 eval 'test -S "$SOAK_HIST_SOCK" && test -s "$SOAK_HIST_PIDFILE" || ! alive $SOAK_HIST_PID' \
            || ! alive "$SOAK_HIST_PID"; then
        file_tail /run/nbdkit-hist.log 30 "history nbdkit log"
        fail "[$CUR] the history export's nbdkit made no socket $SOAK_HIST_SOCK within 60 s (or died)"
    fi
    say "[$CUR] history export ready $(elapsed "$SOAK_HIST_T0" "$(uptime_s)") s after its start:" \
        "nbdkit pid $SOAK_HIST_PID, VmRSS $(proc_status_kib "$SOAK_HIST_PID" VmRSS) kB," \
        "VmLck $(proc_status_kib "$SOAK_HIST_PID" VmLck) kB; MemAvailable $(meminfo_kib MemAvailable) kB"
}

soak_hist_stop() {
    [ -n "$SOAK_HIST_PID" ] || return 0
    kill -TERM "$SOAK_HIST_PID" 2>/dev/null
    if ! wait_until 30 eval '! alive $SOAK_HIST_PID'; then
        kill -9 "$SOAK_HIST_PID" 2>/dev/null
        fail "[$CUR] the history export's nbdkit did not exit within 30 s of SIGTERM"
    fi
    wait "$SOAK_HIST_PID" 2>/dev/null
    SOAK_HIST_PID=""
}

# soak_cpu_ticks: the guest's CPU time so far, "idle total" in clock ticks (/proc/stat; idle
# counts iowait too)
soak_cpu_ticks() { awk '$1 == "cpu" { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; exit }' /proc/stat; }

# soak_hist_field KEY: KEY's value in nbdhistory's summary line (KEY=VALUE words)
soak_hist_field() { sed -n "s/^nbdhistory: seed=.* $1=\([^ ]*\).*/\1/p" /run/nbdhistory.out | head -n 1; }

soak_heal_link() {   # soak_heal_link I: no netem, no nft drop on donor I's link
    "$TC" qdisc del dev "vd$1" root 2>/dev/null
    "$TC" qdisc del dev "vb$1" root 2>/dev/null
    nft flush chain netdev soak "in_vd$1" 2>/dev/null
    nft flush chain netdev soak "in_vb$1" 2>/dev/null
    return 0
}

# soak_fault N KIND DONOR PARAM HOLD: inject one fault, undo it, log it (/run/soak-faults)
soak_fault() {
    _fn=$1 _fk=$2 _fd=$3 _fp=$4 _fh=$5
    _c0=$(soak_link_pkts "$_fd")
    _ft0=$(uptime_s)
    _drops=""
    _fpid=$(soak_pid "$_fd")
    _fslabs=$(sed -n "s/^donor\.$((_fd - 1))=.* slabs=\([0-9]*\) .*/\1/p" "$STATUSFILE")
    case "$_fk" in
        delay|loss)
            if [ "$_fk" = delay ]; then _nm="delay ${_fp}ms"; _what="netem delay $_fp ms each way, $_fh s"
            else _nm="loss ${_fp}%"; _what="netem loss $_fp % each way, $_fh s"; fi
            # a queue long enough that the delay alone drops nothing
            # shellcheck disable=SC2086
            "$TC" qdisc replace dev "vd$_fd" root netem $_nm limit 100000 \
                && "$TC" qdisc replace dev "vb$_fd" root netem $_nm limit 100000 \
                || fail "[$CUR] tc qdisc replace ... netem $_nm on vd$_fd/vb$_fd"
            sleep "$_fh"
            _fst=$("$TC" -s qdisc show dev "vd$_fd" | awk '/Sent/ { print $4 " packets out of vd'"$_fd"' through netem, " $7 + 0 " dropped"; exit }')
            soak_heal_link "$_fd"
            _what="$_what ($_fst)"
            ;;
        partition)
            printf '%s\n' "add rule netdev soak in_vd$_fd counter drop" \
                "add rule netdev soak in_vb$_fd counter drop" > /run/soak-cut.nft
            nft -f /run/soak-cut.nft || fail "[$CUR] nft -f /run/soak-cut.nft (partition of donor $_fd)"
            sleep "$_fh"
            _drops=$(nft list table netdev soak | awk '{ for (i = 1; i < NF; i++) if ($i == "packets") s += $(i + 1) } END { print s + 0 }')
            soak_heal_link "$_fd"
            _what="partition (nftables drop both ways), $_fh s, $_drops packets dropped"
            ;;
        stop)
            kill -STOP "$_fpid" || fail "[$CUR] kill -STOP $_fpid (memserver $_fd)"
            sleep "$_fh"
            kill -CONT "$_fpid"
            _what="SIGSTOP of memserver $_fd (pid $_fpid), SIGCONT after $_fh s"
            ;;
        kill)
            kill -9 "$_fpid"
            wait "$_fpid" 2>/dev/null
            _tk=$(uptime_s)
            soak_ms_start "$_fd"
            _what="kill -9 of memserver $_fd (pid $_fpid), restarted (pid $(soak_pid "$_fd")) in $(elapsed "$_tk" "$(uptime_s)") s"
            ;;
    esac
    _ft1=$(uptime_s)
    eval "SOAK_N_$_fk=\$((SOAK_N_$_fk + 1))"
    _pk=$(($(soak_link_pkts "$_fd") - _c0))
    say "[$CUR] fault $_fn at $_ft0-$_ft1 s, donor $_fd ($(soak_addr "$_fd"), $_fslabs slabs): $_what;" \
        "$_pk packets crossed its link; plugin (status $(($(date +%s) - $(stat -c %Y "$STATUSFILE"))) s old):" \
        "degraded=$(status_value degraded) lost=$(status_value lost)" \
        "failures=$(status_value server_failures) repaired=$(status_value repaired)"
    echo "$_fn $_fk $_fd $_fp $_ft0 $_ft1 $_pk ${_drops:-0}" >> /run/soak-faults
}

soak_run() {   # soak_run tcp|rdma
    SOAK_T=$1
    CUR=soak-$1
    _r0=$(uptime_s)
    say "===== $CUR: fault soak, $SOAK_SECONDS s (seed $SOAK_SEED), $SOAK_SERVERS memservers ($1) on their own links, replicas=2 timeout=$SOAK_PLUGIN_TIMEOUT ====="
    soak_net
    [ "$1" = rdma ] && soak_link_check
    : > /run/nbdkit.log
    : > /run/soak-faults
    : > /run/soak-recovery
    SOAK_N_delay=0 SOAK_N_loss=0 SOAK_N_partition=0 SOAK_N_stop=0 SOAK_N_kill=0
    _servers=""
    _i=1
    while [ "$_i" -le "$SOAK_SERVERS" ]; do
        : > "/run/memserver-$_i.log"
        soak_ms_start "$_i" nowait
        _servers="$_servers server=$(soak_addr "$_i"):$PORT"
        _i=$((_i + 1))
    done
    _t0=$(uptime_s)
    _i=1
    while [ "$_i" -le "$SOAK_SERVERS" ]; do
        wait_until "$SERVER_WAIT" soak_ready "$_i" \
            || { file_tail "/run/memserver-$_i.log" 20 "memserver $_i log"; fail "[$CUR] memserver $_i not ready within $SERVER_WAIT s"; }
        _i=$((_i + 1))
    done
    say "[$CUR] $SOAK_SERVERS memservers ready after $(elapsed "$_t0" "$(uptime_s)") s"
    rm -f "$STATUSFILE"
    # shellcheck disable=SC2086
    start_nbdkit rdmaswap $_servers "size=$SOAK_SIZE" "transport=$1" replicas=2 \
        "timeout=$SOAK_PLUGIN_TIMEOUT" "statusfile=$STATUSFILE" "auth-key=$AUTH_KEY" $PLUGIN_ARGS
    nbd_connect -swap
    soak_hist_start "$1" "$_servers"   # (its start-up overlaps the prefill)
    prefill
    SWAPDEV=/dev/nbd0
    mkswap /dev/nbd0 > /run/mkswap.log 2>&1 || { cat /run/mkswap.log; fail "mkswap /dev/nbd0 failed"; }
    swapon /dev/nbd0 || fail "swapon /dev/nbd0 failed"
    wait_until 5 eval '[ "$(status_value slabs_live)" -gt 0 ] 2>/dev/null' || fail "[$CUR] no plugin status"
    say "[$CUR] plugin: slabs_live=$(status_value slabs_live) degraded=$(status_value degraded);" \
        "$(grep '^donor\.' "$STATUSFILE" | tr '\n' ' ')"
    soak_hist_ready
    _pk0=""
    _i=1
    while [ "$_i" -le "$SOAK_SERVERS" ]; do _pk0="$_pk0 $(soak_link_pkts "$_i")"; _i=$((_i + 1)); done

    _hung0=$(cat /proc/sys/kernel/hung_task_timeout_secs)
    echo "$SOAK_HUNG" > /proc/sys/kernel/hung_task_timeout_secs || fail "[$CUR] cannot set kernel.hung_task_timeout_secs"
    echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    [ -d "$CG" ] || mkdir "$CG" || fail "cannot create cgroup $CG"
    echo "$SOAK_CG_MAX" > "$CG/memory.max" || fail "cannot set $CG/memory.max"
    soak_schedule "$SOAK_SEED" > /run/soak-schedule   # (before the load: awk under TCG is slow)
    _out0=$(vmstat pswpout)
    _in0=$(vmstat pswpin)
    _cpu0=$(soak_cpu_ticks)
    _ncpu0=$(cpu_s "$NBDKIT_PID")
    _hcpu0=$(cpu_s "$SOAK_HIST_PID")
    _t0=$(uptime_s)
    SOAK_END=$(addf "$_t0" "$SOAK_SECONDS")
    _hsecs=$SOAK_SECONDS
    [ "$SOAK_SECONDS" -gt $((2 * SOAK_HIST_TAIL)) ] && _hsecs=$((SOAK_SECONDS - SOAK_HIST_TAIL))
    _hbound=$((7 * SOAK_PLUGIN_TIMEOUT))   # docs/architecture.md, "The guarantee"
    say "[$CUR] soak from $_t0 to $SOAK_END s: swapload --mib $SOAK_MIB --rewrite --seconds $SOAK_SECONDS" \
        "(cgroup memory.max=$SOAK_CG_MAX), nbdprobe, nbdhistory ($SOAK_HIST_THREADS connections," \
        "$_hsecs s), faults (hung_task_timeout_secs=$SOAK_HUNG)"
    # shellcheck disable=SC2016
    sh -c 'echo $$ > "$1/cgroup.procs" || exit 3; shift; exec swapload "$@"' sh "$CG" \
        --mib "$SOAK_MIB" --seconds "$SOAK_SECONDS" --rewrite --seed "$SEED" > /run/swapload.out 2>&1 &
    _wpid=$!
    nbdprobe --device /dev/nbd0 --seconds "$SOAK_SECONDS" --seed "$SOAK_SEED" > /run/nbdprobe.out 2>&1 &
    _ppid=$!
    nbdhistory --socket "$SOAK_HIST_SOCK" --seconds "$_hsecs" --seed "$SOAK_SEED" \
        --threads "$SOAK_HIST_THREADS" --rate "$SOAK_HIST_RATE" \
        --slab-size "$(($(size_kib "$SOAK_SLAB") * 1024))" --settle 1 --bound "$_hbound" \
        --fault-log /run/soak-faults > /run/nbdhistory.out 2>&1 &
    _hpid=$!
    # The injector (this shell and what it starts) runs at real-time priority 2, above nbdkit's
    # and the memservers' threads (SCHED_RR 1): otherwise, with the CPUs busy, its tc and nft
    # commands waited for the 5 % that RT throttling leaves and a 6 s delay lasted 20 s.
    if command -v chrt > /dev/null 2>&1; then
        chrt -r -p 2 $$ > /dev/null || fail "[$CUR] chrt -r -p 2 (the injector)"
    fi
    sleep 2   # the workload gets going first
    say "[$CUR] injector starts at $(uptime_s) s"
    # (names of their own: alive() and wait_until() set _p, _c, _st, _n)
    while read -r _sn _sk _sd _sp _sh _sg <&3; do
        # every fault ends (and the next would start) at least 5 s before the workload does
        ge "$(addf "$(uptime_s)" "$((_sh + 5))")" "$SOAK_END" && break
        alive "$_wpid" || break
        # the donor that holds the most slabs (faults on an empty donor miss the data path)
        _t=$(soak_target "$_sn")
        [ "$_t" -gt 0 ] && _sd=$_t
        soak_fault "$_sn" "$_sk" "$_sd" "$_sp" "$_sh"
        alive "$NBDKIT_PID" || fail "[$CUR] nbdkit died (fault $_sn: $_sk of donor $_sd)"
        # One fault at a time: the next only once the plugin is back to two valid replicas of
        # every slab (replicas=2 promises nothing for a second donor's fault before that).  The
        # plugin may notice a failure up to timeout= after the fault ended, and its status file
        # is rewritten every second: nothing is read from it before that.
        _tr=$(uptime_s)
        sleep "$((SOAK_PLUGIN_TIMEOUT + 2))"
        _since=$(date +%s)
        while ! soak_redundant "$_since"; do
            ge "$(uptime_s)" "$SOAK_END" && break
            alive "$_wpid" && alive "$NBDKIT_PID" || break
            sleep 0.5
        done
        if soak_redundant "$_since"; then
            _rec=$(elapsed "$_tr" "$(uptime_s)")
            echo "$_sn $_rec" >> /run/soak-recovery
            say "[$CUR] fault $_sn: full redundancy again $_rec s after it ended" \
                "(repaired=$(status_value repaired) repair_bytes=$(status_value repair_bytes))"
        else
            echo "$_sn never" >> /run/soak-recovery
            say "[$CUR] fault $_sn: not back to full redundancy by the end of the soak" \
                "(degraded=$(status_value degraded) lost=$(status_value lost); history export" \
                "degraded=$(soak_hist_value degraded) lost=$(soak_hist_value lost)): no more faults"
            break
        fi
        sleep "$_sg"
    done 3< /run/soak-schedule
    _i=1
    while [ "$_i" -le "$SOAK_SERVERS" ]; do
        soak_heal_link "$_i"
        kill -CONT "$(soak_pid "$_i")" 2>/dev/null
        _i=$((_i + 1))
    done
    command -v chrt > /dev/null 2>&1 && chrt -o -p 0 $$ > /dev/null
    say "[$CUR] injector done at $(uptime_s) s; waiting for swapload, nbdprobe and nbdhistory"
    wait_until "$((SOAK_SECONDS + SOAK_GRACE))" eval '! alive $_wpid && ! alive $_ppid && ! alive $_hpid' || true
    _hung=$(dmesg | grep -c 'blocked for more than')
    _ioerr=$(dmesg | grep -c 'I/O error')
    _stuck=""
    alive "$_wpid" && _stuck="swapload"
    alive "$_ppid" && _stuck="$_stuck nbdprobe"
    alive "$_hpid" && _stuck="$_stuck nbdhistory"
    _wrc=none
    _hrc=none
    [ -n "$_stuck" ] || { wait "$_wpid"; _wrc=$?; wait "$_ppid"; wait "$_hpid"; _hrc=$?; }
    W_SECS=$(elapsed "$_t0" "$(uptime_s)")
    W_OUT=$(($(vmstat pswpout) - _out0))
    W_IN=$(($(vmstat pswpin) - _in0))
    _cpu=$(echo "$_cpu0 $(soak_cpu_ticks) $(cpu_s "$NBDKIT_PID") $_ncpu0 $(cpu_s "$SOAK_HIST_PID") $_hcpu0" \
        | awk '{ printf "guest CPUs idle %.0f %% from the start of the soak to the end of its workload; CPU seconds meanwhile: swap nbdkit %.1f, history nbdkit %.1f", ($4 - $2 > 0) ? 100 * ($3 - $1) / ($4 - $2) : 0, $5 - $6, $7 - $8 }')
    grep -v '^swapload: stall ' /run/swapload.out | tail -n 8
    tail -n 30 /run/nbdprobe.out
    cat /run/nbdhistory.out   # its start and summary lines; on a violation, each with its history
    file_tail /run/nbdkit.log 60 "nbdkit log"
    file_tail /run/nbdkit-hist.log 30 "history nbdkit log"

    # the report
    _ok=$(grep -c '^swapload: OK pages=' /run/swapload.out)
    _mis=$(grep -c 'MISMATCH' /run/swapload.out)
    _ps=$(sed -n 's/^nbdprobe: reads=//p' /run/nbdprobe.out)
    _perr=$(echo "$_ps" | sed -n 's/.* errors=\([0-9]*\) .*/\1/p')
    _nf=$(wc -l < /run/soak-faults)
    _hv=$(soak_hist_field violations)
    _pkt=""
    _i=1
    for _p0 in $_pk0; do
        _pkt="$_pkt vd$_i:$(($(soak_link_pkts "$_i") - _p0))"
        _i=$((_i + 1))
    done
    {
        echo "$CUR $SOAK_SECONDS s, seed $SOAK_SEED, plugin timeout=$SOAK_PLUGIN_TIMEOUT, swapload $SOAK_MIB MiB in memory.max=$SOAK_CG_MAX, pswpout +$W_OUT pswpin +$W_IN"
        echo "faults injected: $_nf (delay $SOAK_N_delay, loss $SOAK_N_loss, partition $SOAK_N_partition, stop $SOAK_N_stop, kill $SOAK_N_kill)"
        echo "content errors: $_mis ($(grep -m1 -E '^swapload: (OK|MISMATCH|SIGBUS)' /run/swapload.out || echo "swapload exit $_wrc, no OK line"))"
        echo "longest probe stall: $(echo "$_ps" | sed -n 's/.* max_ms=\([0-9.]*\) max_at=\([0-9.]*\) .*/\1 ms at \2 s/p') (reads=$_ps)"
        echo "longest page-in stall: $(sed -n 's/^swapload: longest page stall //p' /run/swapload.out)"
        echo "back to full redundancy after each fault (s): $(awk '{ printf "%s#%s=%s", (NR > 1 ? " " : ""), $1, $2 }' /run/soak-recovery)"
        echo "hung-task warnings: $_hung (kernel.hung_task_timeout_secs=$SOAK_HUNG); I/O errors in dmesg: $_ioerr"
        echo "packets over the donors' links during the soak:$_pkt"
        echo "plugin: $(grep -E '^(slabs_live|degraded|lost|repaired|repair_bytes|server_failures)=' "$STATUSFILE" | tr '\n' ' ')"
        grep '^donor\.' "$STATUSFILE"
        echo "history: ops=$(soak_hist_field ops) reads=$(soak_hist_field reads) writes=$(soak_hist_field writes)" \
            "eio=$(soak_hist_field eio) violations=${_hv:-?} longest=$(soak_hist_field longest) (bound ${_hbound}s)"
        echo "history detail: trims=$(soak_hist_field trims) zeros=$(soak_hist_field zeros)" \
            "failed=$(soak_hist_field failed) $(sed -n 's/^nbdhistory: seed=.* eio=[0-9]* \(([^)]*)\).*/\1/p' /run/nbdhistory.out)" \
            "reads-checked=$(soak_hist_field reads-checked) (data $(soak_hist_field data), zeros" \
            "$(soak_hist_field zero-reads), mixed-in-flux $(soak_hist_field mixed-in-flux))" \
            "read-back=$(soak_hist_field read-back) blocks unwritten=$(soak_hist_field unwritten)" \
            "seed=$SOAK_SEED exit=$_hrc cpu=$(soak_hist_field cpu); longest: $(sed -n 's/^nbdhistory: seed=.*(longest: \(.*\))$/\1/p' /run/nbdhistory.out)"
        echo "cpu: $_cpu"
        echo "history plugin: $(grep -E '^(slabs_live|degraded|lost|repaired|repair_bytes|server_failures)=' "$SOAK_HIST_STATUS" | tr '\n' ' ')" \
            "nbdkit VmRSS $(proc_status_kib "$SOAK_HIST_PID" VmRSS) kB VmLck $(proc_status_kib "$SOAK_HIST_PID" VmLck) kB"
        # per fault: the slowest probe read (of those >= 500 ms) and page access (>= 1 s) that
        # overlapped the time from the fault's start to the end of its recovery
        awk '
            FILENAME == "/run/soak-recovery" { rec[$1] = $2; next }
            FILENAME == "/run/nbdprobe.out" {
                if ($2 == "slow" || $2 == "read") { for (i = 1; i <= NF; i++) if ($i ~ /^at=/) { pt[++np] = substr($i, 4) + 0; pv[np] = ($2 == "slow" ? $4 : "EIO") } }
                next
            }
            FILENAME == "/run/swapload.out" {
                if ($2 == "stall") { wt[++nw] = substr($7, 4) + 0; wv[nw] = $3 + 0 }
                next
            }
            {
                e = (rec[$1] ~ /^[0-9.]+$/) ? $6 + rec[$1] : 1e9
                p = 0; w = 0
                for (i = 1; i <= np; i++) if (pt[i] + (pv[i] + 0) / 1000 >= $5 && pt[i] <= e) { if (pv[i] == "EIO") p = "EIO"; else if (p != "EIO" && pv[i] + 0 > p) p = pv[i] + 0 }
                for (i = 1; i <= nw; i++) if (wt[i] + wv[i] / 1000 >= $5 && wt[i] <= e && wv[i] + 0 > w) w = wv[i] + 0
                printf "fault %s: %s donor %s param %s at %s-%s s, %s packets over the link%s; redundant again after %s s; slowest probe read %s, page access %s\n", $1, $2, $3, $4, $5, $6, $7, ($8 > 0 ? ", " $8 " dropped" : ""), (rec[$1] == "" ? "?" : rec[$1]), (p == 0 ? "<500 ms" : p " ms"), (w == 0 ? "<1 s" : w " ms")
            }' /run/soak-recovery /run/nbdprobe.out /run/swapload.out /run/soak-faults
    } | sed 's/^/RDMASWAP-VM-SOAK: /' | tee /run/soak-report.txt

    echo "$_hung0" > /proc/sys/kernel/hung_task_timeout_secs
    [ -z "$_stuck" ] || fail "[$CUR] still running $SOAK_GRACE s after the soak's end: $_stuck (hang?)"
    [ "$_mis" = 0 ] && [ "$_ok" = 1 ] || fail "[$CUR] swapload: $(grep -m1 -E 'MISMATCH|SIGBUS' /run/swapload.out || echo "exit $_wrc, no OK line")"
    [ "$_wrc" = 0 ] || fail "[$CUR] swapload exit status $_wrc"
    [ -n "$_hv" ] || fail "[$CUR] nbdhistory printed no summary (exit $_hrc): $(tail -n 1 /run/nbdhistory.out)"
    [ "$_hv" = 0 ] || fail "[$CUR] nbdhistory: $_hv violations of the guarantee: $(grep -m1 '^VIOLATION' /run/nbdhistory.out)"
    [ "$_hrc" = 0 ] || fail "[$CUR] nbdhistory exit status $_hrc: $(grep -m1 'FAIL' /run/nbdhistory.out)"
    alive "$SOAK_HIST_PID" || fail "[$CUR] the history export's nbdkit died"
    [ "$_hung" = 0 ] || fail "[$CUR] hung-task warning: $(dmesg | grep -m1 'blocked for more than')"
    [ "$_ioerr" = 0 ] || fail "[$CUR] I/O error in the kernel log: $(dmesg | grep -m1 'I/O error')"
    [ "${_perr:-x}" = 0 ] || fail "[$CUR] nbdprobe: ${_ps:-no summary}"
    alive "$NBDKIT_PID" || fail "[$CUR] nbdkit died"
    [ "$_nf" -gt 0 ] || fail "[$CUR] no fault was injected"
    rmdir "$CG" 2>/dev/null
    check_dmesg
    run_bounded 180 /run/swapoff.log swapoff /dev/nbd0 \
        || { cat /run/swapoff.log; fail "swapoff /dev/nbd0 failed or hung"; }
    nbd_disconnect
    stop_nbdkit
    soak_hist_stop
    _i=1
    while [ "$_i" -le "$SOAK_SERVERS" ]; do
        MS_PID=$(soak_pid "$_i")
        stop_memserver
        eval "SOAK_PID$_i="
        _i=$((_i + 1))
    done
    check_dmesg
    echo "$CUR $W_SECS $W_OUT $W_IN $SOAK_MIB" >> /run/bench.txt
    say "[$CUR] PASS: $_nf faults over $SOAK_SECONDS s, every page verified, no I/O error, no hung task," \
        "$(soak_hist_field reads-checked) reads of the history export checked, no violation;" \
        "whole run $(elapsed "$_r0" "$(uptime_s)") s"
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

print_bench() {
    echo "RDMASWAP-VM-BENCH: passes=$PASSES memory.max=$CG_MAX (cgroup runs)"
    awk '
        { mode[NR] = $1; secs[NR] = $2; out[NR] = $3; inn[NR] = $4; mib[NR] = $5; if ($1 == "memory") base = $2 }
        END {
            printf "RDMASWAP-VM-BENCH: %-20s %6s %9s %9s %9s %10s\n", "run", "mib", "seconds", "pswpout", "pswpin", "vs-memory"
            for (i = 1; i <= NR; i++) {
                r = (base > 0) ? sprintf("%.2f", secs[i] / base) : "n/a"
                printf "RDMASWAP-VM-BENCH: %-20s %6d %9.2f %9d %9d %10s\n", mode[i], mib[i], secs[i], out[i], inn[i], r
            }
        }' /run/bench.txt
}

# ---------------------------------------------------------------------------------------------
# twohost: VM A (server) runs the memserver on its eth0/rxe0; VM B (client) runs nbdkit with the
# plugin over RDMA, nbd-client and swap.  The VMs talk through qemu's socket netdev (the host's
# loopback).  Messages (peer_send/peer_recv): B -> A "scan" once B's swap run is done and its
# pages are still in A's pool; A scans its memserver and answers "scanned N"; B tears down and
# sends "done"; A stops its memserver.  Either side sends "FAIL ..." when it fails.
# ETCD=1 (run-vm-test.sh --etcd): A also runs a single-member etcd on $ETCD_URL, its memserver
# registers there (--etcd --advertise), and B's plugin gets etcd= and no server=: it must find
# the donor through etcd.

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

# ---------------------------------------------------------------------------------------------
# app-B (issue 15, the application table; bench/apptable.sh): redis-server (no persistence) in a
# cgroup, swapping to B: rdma or tcp (rdmaswap over Soft-RoCE or TCP on /dev/nbd0), memory
# (nbdkit's memory plugin on /dev/nbd0), zram (/dev/zram0) or disk (/dev/vda, a virtio disk on a
# host file).  APP_KEYS keys of random base64 text are loaded with redis-cli --pipe; the cgroup's
# memory.current then is the working set W; for each level L of APP_LEVELS memory.max is set to
# L % of W and redis-benchmark measures GET throughput and latency (uniformly random keys).  The
# values of APP_SAMPLE keys read after the load and after the last level must agree.
# Lines "RDMASWAP-VM-APP: row B L LIMIT_KIB RPS AVG_MS P50_MS P99_MS MAX_MS PSWPIN PSWPOUT SECS"
# and "RDMASWAP-VM-APP: ws B RSS_KIB CURRENT_KIB KEYS".
APP_CG=/sys/fs/cgroup/apptable
APP_LOAD=/etc/rdmaswap-vm/app-load.resp
REDIS_PID=""

redis_up() { redis-cli -p 6379 ping 2>/dev/null | grep -q PONG; }
cg_value() { sed -n "s/^$2 //p" "$APP_CG/$1"; }   # cg_value FILE KEY
app_cg_gone() { rmdir "$APP_CG" 2>/dev/null || [ ! -d "$APP_CG" ]; }

app_swap_on() {   # app_swap_on BACKEND: the swap device, SWAPDEV
    case "$1" in
        rdma|tcp)
            _acap=$CAPACITY
            CAPACITY=$APP_SWAP
            start_memserver "$1"
            CAPACITY=$_acap
            # shellcheck disable=SC2086
            start_nbdkit rdmaswap "server=$ADDR:$PORT" "size=$APP_SWAP" "transport=$1" \
                "auth-key=$AUTH_KEY" $PLUGIN_ARGS
            swap_on plain
            ;;
        memory)
            start_nbdkit memory "$APP_SWAP" allocator=malloc,mlock=true
            swap_on plain
            ;;
        zram)
            [ -w /sys/block/zram0/disksize ] || fail "[$CUR] no /dev/zram0 (zram module not loaded?)"
            echo "$APP_SWAP" > /sys/block/zram0/disksize || fail "[$CUR] cannot set zram0's disksize"
            SWAPDEV=/dev/zram0
            ;;
        disk)
            [ -b /dev/vda ] || fail "[$CUR] no /dev/vda (virtio disk)"
            SWAPDEV=/dev/vda
            ;;
        *) fail "unknown app run backend '$1' (want rdma, tcp, memory, zram or disk)" ;;
    esac
    case "$1" in
        zram|disk)
            mkswap "$SWAPDEV" > /run/mkswap.log 2>&1 || { cat /run/mkswap.log; fail "mkswap $SWAPDEV failed"; }
            swapon "$SWAPDEV" || fail "swapon $SWAPDEV failed"
            [ -n "$(swap_used_kib)" ] || { cat /proc/swaps; fail "$SWAPDEV not in /proc/swaps after swapon"; }
            ;;
    esac
    say "[$CUR] swap: $(awk -v d="$SWAPDEV" '$1 == d { print $1, $3, "KiB" }' /proc/swaps)"
}

app_swap_off() {   # app_swap_off BACKEND
    case "$1" in
        rdma|tcp|memory)
            swap_off
            teardown_backend
            ;;
        *)
            run_bounded 180 /run/swapoff.log swapoff "$SWAPDEV" \
                || { cat /run/swapoff.log; fail "swapoff $SWAPDEV failed or hung"; }
            [ "$1" != zram ] || echo 1 > /sys/block/zram0/reset
            SWAPDEV=/dev/nbd0
            ;;
    esac
}

# app_sample FILE: the values of APP_SAMPLE keys spread over the key space (a whole-set DEBUG
# DIGEST at 50 % swaps the whole set in, which took minutes under TCG)
app_sample() {
    awk -v k="$APP_KEYS" -v n="$APP_SAMPLE" 'BEGIN { for (i = 0; i < n; i++) printf "GET key:%012d\n", int(i * k / n) }' \
        > /run/redis-sample.in
    run_bounded "$APP_WAIT" "$1" sh -c 'redis-cli -p 6379 < /run/redis-sample.in' \
        && [ "$(grep -c . "$1")" = "$APP_SAMPLE" ]
}

app_run() {   # app_run rdma|tcp|memory|zram|disk
    _ab=$1
    CUR=app-$_ab
    _ar0=$(uptime_s)
    say "===== $CUR: redis-server swapping to $_ab, memory.max at $APP_LEVELS % of its working set ====="
    command -v redis-server > /dev/null && command -v redis-benchmark > /dev/null \
        || fail "[$CUR] redis-server/redis-benchmark not in the image"
    [ -s "$APP_LOAD" ] || fail "[$CUR] no $APP_LOAD in the image"
    : > /run/nbdkit.log
    app_swap_on "$_ab"
    echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    [ -d "$APP_CG" ] || mkdir "$APP_CG" || fail "[$CUR] cannot create cgroup $APP_CG"
    echo max > "$APP_CG/memory.max" || fail "[$CUR] cannot set $APP_CG/memory.max"
    # shellcheck disable=SC2016
    sh -c 'echo $$ > "$1/cgroup.procs" || exit 3; exec redis-server --bind 127.0.0.1 --port 6379 \
        --save "" --appendonly no --protected-mode no --daemonize no \
        --loglevel warning --logfile /run/redis.log' sh "$APP_CG" > /run/redis.out 2>&1 &
    REDIS_PID=$!
    wait_until 60 redis_up || { cat /run/redis.out /run/redis.log 2>/dev/null; fail "[$CUR] redis-server did not answer PING within 60 s"; }
    _at0=$(uptime_s)
    run_bounded "$APP_WAIT" /run/redis-load.out sh -c 'redis-cli -p 6379 --pipe < "$1"' sh "$APP_LOAD" \
        || { cat /run/redis-load.out; fail "[$CUR] loading $APP_LOAD with redis-cli --pipe failed"; }
    grep -q 'errors: 0,' /run/redis-load.out || { cat /run/redis-load.out; fail "[$CUR] redis-cli --pipe reported errors"; }
    _akeys=$(redis-cli -p 6379 dbsize)
    say "[$CUR] loaded $_akeys keys in $(elapsed "$_at0" "$(uptime_s)") s: $(tail -n 1 /run/redis-load.out)"
    [ "$_akeys" = "$APP_KEYS" ] || fail "[$CUR] DBSIZE $_akeys after the load, expected $APP_KEYS"
    app_sample /run/redis-sample0 || fail "[$CUR] reading $APP_SAMPLE sample keys after the load failed"
    _arss=$(proc_status_kib "$REDIS_PID" VmRSS)
    _aw=$(($(cat "$APP_CG/memory.current") / 1024))
    say "[$CUR] working set: memory.current $_aw KiB (redis VmRSS $_arss KiB, used_memory $(redis-cli -p 6379 info memory | sed -n 's/^used_memory_human://p' | tr -d '\r'))"
    echo "RDMASWAP-VM-APP: ws $_ab $_arss $_aw $_akeys"
    for _alv in $APP_LEVELS; do
        _alim=$((_aw * _alv / 100))
        _ain0=$(vmstat pswpin)
        _aout0=$(vmstat pswpout)
        echo "$((_alim * 1024))" > "$APP_CG/memory.max" || fail "[$CUR] cannot set memory.max to $_alim KiB"
        _at0=$(uptime_s)
        run_bounded "$APP_WAIT" /run/redis-bench.out redis-benchmark -p 6379 -t get -r "$APP_KEYS" \
            -n "$APP_REQUESTS" -c "$APP_CLIENTS" --csv
        _arc=$?
        _asecs=$(elapsed "$_at0" "$(uptime_s)")
        _din=$(($(vmstat pswpin) - _ain0))
        _dout=$(($(vmstat pswpout) - _aout0))
        [ "$_arc" = 0 ] || { cat /run/redis-bench.out; fail "[$CUR] redis-benchmark at $_alv % failed (exit $_arc)"; }
        # "GET","rps","avg","min","p50","p95","p99","max" (ms)
        _row=$(tr -d '"\r' < /run/redis-bench.out | awk -F, '$1 == "GET" { print $2, $3, $5, $7, $8 }')
        [ -n "$_row" ] || { cat /run/redis-bench.out; fail "[$CUR] no GET line from redis-benchmark --csv"; }
        alive "$REDIS_PID" || fail "[$CUR] redis-server died at $_alv %"
        say "[$CUR] $_alv % ($_alim KiB): rps avg p50 p99 max = $_row; pswpin +$_din pswpout +$_dout;" \
            "$_asecs s; memory.current $(($(cat "$APP_CG/memory.current") / 1024)) KiB, swap $(swap_used_kib) KiB"
        echo "RDMASWAP-VM-APP: row $_ab $_alv $_alim $_row $_din $_dout $_asecs"
    done
    _at0=$(uptime_s)
    app_sample /run/redis-sample1 || fail "[$CUR] reading $APP_SAMPLE sample keys after the last level failed"
    cmp -s /run/redis-sample0 /run/redis-sample1 \
        || fail "[$CUR] $APP_SAMPLE sample values read after the last level differ from those after the load"
    say "[$CUR] $APP_SAMPLE sample values unchanged ($(elapsed "$_at0" "$(uptime_s)") s);" \
        "memory.events: $(tr '\n' ' ' < "$APP_CG/memory.events")"
    [ "$(cg_value memory.events oom_kill)" = 0 ] || fail "[$CUR] OOM kill in redis' cgroup"
    kill -9 "$REDIS_PID"
    wait "$REDIS_PID" 2>/dev/null
    REDIS_PID=""
    wait_until 30 app_cg_gone || fail "[$CUR] cannot remove $APP_CG"
    app_swap_off "$_ab"
    check_dmesg
    say "[$CUR] PASS: whole run $(elapsed "$_ar0" "$(uptime_s)") s"
}

# ---------------------------------------------------------------------------------------------
# fence-rdma (issue 25, defect 1 over RDMA): a write that failed may never land after a newer one
# that was acknowledged.  One memserver at FENCE_ADDR on veth1 with a Soft-RoCE device of its
# own (rxef); policy routing, as in the soak but on the veth pair itself, makes the traffic
# between rxe0 (ADDR) and it cross veth0 -> veth1, where tc holds what the test picks.
# rdmafence (tests/vm/rdmafence.cpp) opens two data paths A and B of one session, holds A's
# packets to the memserver (its QP number in the RoCE BTH) and the CM's DREQs in a netem delay
# of FENCE_DELAY ms, so that A's write of 0xbb fails at FENCE_TIMEOUT ms (timeout=) and reaches
# the memserver late; B writes 0xcc meanwhile; once the held packets are in, a read must give
# 0xcc (or EIO), never 0xbb.  Two scenarios: A's fence at once (its reconnect names its old QP),
# and a fence that fails (connect requests dropped too: B's write must fail, then fence A's QP
# itself once connects pass).  Everything is undone at the end.
FENCE_ADDR=10.77.0.21
FENCE_TIMEOUT=1000
FENCE_DELAY=6000
FENCE_PID=""
FENCE_SYSCTL=""   # name=value of each sysctl changed, to restore

fence_sysctl() {   # fence_sysctl IF KEY VALUE
    _f=/proc/sys/net/ipv4/conf/$1/$2
    FENCE_SYSCTL="$FENCE_SYSCTL $1/$2=$(cat "$_f")"
    echo "$3" > "$_f" || fail "[$CUR] cannot set net.ipv4.conf.$1.$2=$3"
}
fence_ready() { alive "$FENCE_PID" && rdmaswapctl status "server=$FENCE_ADDR:$PORT" "auth-key=$AUTH_KEY" > /run/ctl-fence.out 2>&1; }

fence_net_up() {
    for _c in all default veth0 veth1; do
        fence_sysctl "$_c" rp_filter 0
        fence_sysctl "$_c" accept_local 1
    done
    "$IP" addr add "$FENCE_ADDR/32" dev veth1 || fail "[$CUR] ip addr add $FENCE_ADDR/32 dev veth1"
    "$IP" neigh replace "$FENCE_ADDR" lladdr "$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent \
        && "$IP" neigh replace "$ADDR" lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent \
        || fail "[$CUR] static neighbour entries"
    "$IP" route add "$FENCE_ADDR/32" dev veth0 src "$ADDR" table 150 \
        && "$IP" route add "$ADDR/32" dev veth1 src "$FENCE_ADDR" table 151 \
        && "$IP" rule add pref 50 iif veth0 lookup local \
        && "$IP" rule add pref 51 iif veth1 lookup local \
        && "$IP" rule add pref 52 to "$FENCE_ADDR" lookup 150 \
        && "$IP" rule add pref 53 from "$FENCE_ADDR" lookup 151 \
        && "$IP" rule add pref 100 lookup local && "$IP" rule del pref 0 lookup local \
        || fail "[$CUR] routing rules for $FENCE_ADDR"
    rdma link add rxef type rxe netdev veth1 || fail "[$CUR] rdma link add rxef netdev veth1"
    wait_until 20 grep -q ACTIVE /sys/class/infiniband/rxef/ports/1/state \
        || fail "[$CUR] rxef on veth1 is not ACTIVE"
    say "[$CUR] link: $(ip -o -4 route get "$FENCE_ADDR" | head -n 1 | tr -s ' ')"
}

fence_net_down() {
    rdma link del rxef 2>/dev/null
    "$IP" rule add pref 0 lookup local 2>/dev/null
    for _p in 100 53 52 51 50; do "$IP" rule del pref "$_p" 2>/dev/null; done
    "$IP" route flush table 150 2>/dev/null
    "$IP" route flush table 151 2>/dev/null
    "$IP" neigh del "$FENCE_ADDR" dev veth0 2>/dev/null
    "$IP" neigh del "$ADDR" dev veth1 2>/dev/null
    "$IP" addr del "$FENCE_ADDR/32" dev veth1 2>/dev/null
    for _kv in $FENCE_SYSCTL; do echo "${_kv#*=}" > "/proc/sys/net/ipv4/conf/${_kv%%=*}"; done
    FENCE_SYSCTL=""
}

fence_run() {   # fence_run rdma
    CUR=fence-$1
    [ "$1" = rdma ] || fail "[$CUR] the fence run is for RDMA only (TCP's fence: tests/unit/test_tcp_fence.cpp)"
    say "===== $CUR: a failed RDMA write never lands after a newer one (issue 25) ====="
    _f0=$(uptime_s)
    fence_net_up
    rdmaswap-memserver --listen "$FENCE_ADDR" --port "$PORT" --capacity 16M --slab-size 8M \
        --transport rdma --auth-key "$AUTH_KEY" > /run/memserver-fence.log 2>&1 &
    FENCE_PID=$!
    wait_until "$SERVER_WAIT" fence_ready \
        || { file_tail /run/memserver-fence.log 20 "memserver log"; fail "[$CUR] memserver at $FENCE_ADDR not ready within $SERVER_WAIT s"; }
    run_bounded 120 /run/rdmafence.out rdmafence --server "$FENCE_ADDR:$PORT" --auth-key "$AUTH_KEY" \
        --dev veth0 --tc "$TC" --timeout-ms "$FENCE_TIMEOUT" --delay-ms "$FENCE_DELAY"
    _frc=$?
    sed "s/^/[$CUR] /" /run/rdmafence.out
    say "[$CUR] memserver: $(grep -c 'fenced: a new connect named it' /run/memserver-fence.log) QP(s) fenced"
    kill -TERM "$FENCE_PID" 2>/dev/null
    wait_until 30 eval '! alive $FENCE_PID' || kill -9 "$FENCE_PID" 2>/dev/null
    wait "$FENCE_PID" 2>/dev/null
    FENCE_PID=""
    fence_net_down
    case $_frc in
        0) ;;
        124) fail "[$CUR] rdmafence did not finish within 120 s" ;;
        *) file_tail /run/memserver-fence.log 20 "memserver log"; fail "[$CUR] rdmafence failed (exit $_frc): $(grep 'FAIL' /run/rdmafence.out | head -n 1)" ;;
    esac
    check_dmesg
    say "[$CUR] PASS: whole run $(elapsed "$_f0" "$(uptime_s)") s"
}

# ---------------------------------------------------------------------------------------------
# Scenario

: > /run/bench.txt
case "$MODE" in
    rdma)
        rdma_sanity
        run_rdma_tests
        check_dmesg
        for _m in $RUNS; do
            one_swap_run "$_m"
        done
        ;;
    memory|tcp|pressure|runs|bench)
        [ "$needs_rdma" = 1 ] && rdma_sanity
        for _m in $RUNS; do
            one_swap_run "$_m"
        done
        case "$MODE" in memory|tcp) ;; *) print_bench ;; esac
        ;;
    kill)
        [ "$KILL_TRANSPORT" = rdma ] && rdma_sanity
        # --extra-runs first: kill_test leaves I/O errors in the kernel log on purpose
        for _m in $RUNS; do
            [ "$_m" = kill ] || one_swap_run "$_m"
        done
        kill_test
        ;;
    twohost)
        if [ "$ROLE" = server ]; then twohost_server; else twohost_client; fi
        ;;
    *)
        fail "unknown mode '$MODE'"
        ;;
esac
say "all checks passed at $(uptime_s) s"
finish PASS
