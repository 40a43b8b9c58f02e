# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# The harness of the rdmaswap test VM, sourced by /init (tests/vm/guest-init.sh; busybox ash,
# POSIX sh): the settings' defaults, read_config, logging and the one result line (say, fail,
# finish), bounded waits, the kernel-log check, starting and stopping memservers and nbdkit,
# /dev/nbd0 and swap, the swap workload, and the twohost peer messages.  It only defines: the
# boot is guest/boot.sh, each scenario guest/scenarios/NAME.sh.

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

# read_config: /etc/rdmaswap-vm.conf (written by run-vm-test.sh) over the defaults above, the
# defaults that depend on other settings, and the fixed names and state of this boot
read_config() {
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
}

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

# size_kib 384M|1G|4k|...: KiB (either case: fio's block sizes are lower case)
size_kib() {
    case "$1" in
        *[gG]) echo $((${1%[gG]} * 1024 * 1024)) ;;
        *[mM]) echo $((${1%[mM]} * 1024)) ;;
        *[kK]) echo "${1%[kK]}" ;;
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

# term_within SECONDS PID: SIGTERM, then up to SECONDS for PID to exit; if it has not, SIGKILL
# and false. The caller reaps it (wait).
term_within() {
    kill -TERM "$2" 2>/dev/null
    wait_until "$1" eval "! alive $2" && return 0
    kill -9 "$2" 2>/dev/null
    return 1
}

stop_memserver() {
    [ -n "$MS_PID" ] || return 0
    term_within 30 "$MS_PID" || fail "memserver did not exit within 30 s of SIGTERM"
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
    term_within 30 "$NBDKIT_PID" || fail "nbdkit did not exit within 30 s of SIGTERM"
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

# ---------------------------------------------------------------------------------------------
# Several memservers on one address and consecutive ports (repkill, backupkill, reattach,
# reconnect): their status, start and stop, and the swapload that a kill interrupts.

ctl_port() { rdmaswapctl status "server=$ADDR:$1" "auth-key=$AUTH_KEY" > "/run/ctl-$1.out" 2>&1; }
ctl_port_value() { sed -n "s/^$2=//p" "/run/ctl-$1.out" | head -n 1; }
status_value() { sed -n "s/^$1=//p" "$STATUSFILE" 2>/dev/null | head -n 1; }
rep_pid() { eval "echo \${REP_PID$1:-}"; }
rep_port() { echo $((PORT + $1 - 1)); }
rep_ready() { alive "$(rep_pid "$1")" && ctl_port "$(rep_port "$1")"; }
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
