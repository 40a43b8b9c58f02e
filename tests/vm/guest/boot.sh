# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# The boot of the rdmaswap test VM, sourced by /init (tests/vm/guest-init.sh) after lib.sh and
# read_config: the file systems, the console, the twohost role, the kernel modules, the network
# and the Soft-RoCE device; fails when the MODE/RUNS need RDMA and rxe0 is not usable.


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
