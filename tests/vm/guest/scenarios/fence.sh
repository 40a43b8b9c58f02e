# SPDX-License-Identifier: MIT
# shellcheck shell=sh
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
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

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
