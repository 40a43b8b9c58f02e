# SPDX-License-Identifier: MIT
# shellcheck shell=sh
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
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

SOAK_NET=0
# The history export (settings not in the list in guest/lib.sh: a conf value wins)
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
    term_within 30 "$SOAK_HIST_PID" || fail "[$CUR] the history export's nbdkit did not exit within 30 s of SIGTERM"
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
