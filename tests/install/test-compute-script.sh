#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# rdmaswap-compute, the helper of the compute-host units, with a config file of the installed
# kind: it rejects bad settings (exit 2), prints the exact nbdkit / rdmaswap-nbd / mkswap /
# swapon / swapoff commands (-n), and really runs nbdkit --swap in the foreground against a
# memserver (exec'ed, so systemd sees nbdkit as the main process, with the configured stack
# limit and its memory locked); wait-ready returns once the socket serves and fails fast when
# nbdkit dies; reconnect does nothing when the device is not connected. The kernel attach
# itself (rdmaswap-nbd connect/reconnect/disconnect, swapon) runs in the VM tests
# (reconnect-T, with the options printed here), not on this host.
set -euo pipefail
source "$(dirname "$0")/../integration/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl
compute=$RDMASWAP_BUILD/systemd/rdmaswap-compute
[[ -x $compute ]] || fail "not built: $compute"

start_memserver 64M 1M
conf=$tmpdir/compute.conf
sock=$tmpdir/nbd.sock
# write_conf [KEY=VALUE...]: a valid config, with the given lines appended.
write_conf() {
    {
        echo "SERVERS=\"$MEMSERVER_ADDR\""
        echo "SIZE=64M"
        echo "TRANSPORT=tcp"
        echo "CHANNELS=4"
        echo "TIMEOUT=5"
        echo "NBDKIT_THREADS=4"
        echo "SOCKET=$sock"
        echo "PLUGIN=$PLUGIN"
        echo "NBD_DEVICE=/dev/nbd7"
        echo "SWAP_PRIORITY=5"
        echo "SWAP_DISCARD=once"
        echo "STATUSFILE=$tmpdir/status"
        echo "AUTH_KEY=$AUTH_KEY"
        printf '%s\n' "$@"
    } >"$conf"
}

# Bad settings: exit status 2 and a message naming the key.
for bad in $'SERVERS=\nETCD=' 'ETCD=127.0.0.1:2379' 'ETCD=http://a:1,' 'ETCD_PREFIX=/x/' \
    $'ETCD=http://127.0.0.1:2379\nETCD_PREFIX=x' 'SIZE=' 'TRANSPORT=infiniband' 'CHANNELS=0' 'TIMEOUT=x' \
    'NBD_DEVICE=/dev/sda' 'SWAP_DISCARD=always' 'SWAP_PRIORITY=high' 'SOCKET=relative.sock' \
    'REPLICAS=two' 'STATUSFILE=status.txt' 'LEASE=1w' 'LEASE=604801' 'NBD_DEAD_CONN_TIMEOUT=0' \
    'NBD_TIMEOUT=' 'NBD_TIMEOUT=5' 'BACKUP=backup.img' 'BACKUP=/srv/backup.img' \
    'BACKUP=/run/rdmaswap/backup.img' 'BACKUP=/var/lib/rdmaswap/' 'BACKUP=/var/lib/rdmaswap/../x' \
    'BACKUP=/var/lib/rdmaswap/volume.key' 'BACKUP_QUEUE=32M' \
    $'BACKUP_QUEUE=lots\nBACKUP=/var/lib/rdmaswap/b.img'; do
    write_conf "$bad"
    rc=0
    "$compute" -c "$conf" check >/dev/null 2>"$tmpdir/err" || rc=$?
    [[ $rc == 2 ]] || fail "config with $bad: exit $rc, expected 2"
    grep -q "${bad%%=*}" "$tmpdir/err" || fail "config with $bad: message does not name it: $(cat "$tmpdir/err")"
done
rc=0
"$compute" -c "$tmpdir/missing.conf" check 2>/dev/null || rc=$?
[[ $rc == 2 ]] || fail "missing config: exit $rc, expected 2"

# The exact commands. rdmaswap-nbd's options are those the VM test reconnect-T proves on the
# kernel (tests/vm/guest/scenarios/reconnect.sh): connect --socket --device --connections
# --block-size 4096 --dead-conn-timeout --timeout; reconnect --socket --device --connections
# --statusfile; disconnect --device.
write_conf "REPLICAS=1"
"$compute" -c "$conf" check >"$tmpdir/check.txt" || fail "check failed on a valid config"
cat >"$tmpdir/want.txt" <<WANT
# config: $conf
ulimit -s 1024
nbdkit --swap -f -U $sock -t 4 $PLUGIN server=$MEMSERVER_ADDR size=64M transport=tcp channels=4 timeout=5 replicas=1 statusfile=$tmpdir/status auth-key=$AUTH_KEY
rdmaswap-nbd connect --socket $sock --device /dev/nbd7 --connections 2 --block-size 4096 --dead-conn-timeout 120 --timeout 80
mkswap /dev/nbd7
swapon --priority 5 --discard=once /dev/nbd7
rdmaswap-nbd reconnect --socket $sock --device /dev/nbd7 --connections 2 --statusfile $tmpdir/status
swapoff /dev/nbd7
rdmaswap-nbd disconnect --device /dev/nbd7
WANT
diff -u "$tmpdir/want.txt" "$tmpdir/check.txt" || fail "check printed other commands"

# Every setting of this version, and the default of an empty STATUSFILE (as in the compute.conf
# of earlier versions).
write_conf "STATUSFILE=" "LEASE=300" "BACKUP=/var/lib/rdmaswap/swap/backup.img" "BACKUP_QUEUE=64M" \
    "NBD_CONNECTIONS=1" "NBD_DEAD_CONN_TIMEOUT=60" "NBD_TIMEOUT=20" \
    "ETCD=http://127.0.0.1:2379,http://127.0.0.2:2379" "ETCD_PREFIX=/site1/"
"$compute" -c "$conf" check >"$tmpdir/check.txt" || fail "check failed on a config with every setting"
cat >"$tmpdir/want.txt" <<WANT
# config: $conf
ulimit -s 1024
nbdkit --swap -f -U $sock -t 4 $PLUGIN server=$MEMSERVER_ADDR etcd=http://127.0.0.1:2379\,http://127.0.0.2:2379 etcd-prefix=/site1/ size=64M transport=tcp channels=4 timeout=5 statusfile=/run/rdmaswap/status lease=300 backup=/var/lib/rdmaswap/swap/backup.img backup-queue=64M auth-key=$AUTH_KEY
rdmaswap-nbd connect --socket $sock --device /dev/nbd7 --connections 1 --block-size 4096 --dead-conn-timeout 60 --timeout 20
mkswap /dev/nbd7
swapon --priority 5 --discard=once /dev/nbd7
rdmaswap-nbd reconnect --socket $sock --device /dev/nbd7 --connections 1 --statusfile /run/rdmaswap/status
swapoff /dev/nbd7
rdmaswap-nbd disconnect --device /dev/nbd7
WANT
diff -u "$tmpdir/want.txt" "$tmpdir/check.txt" || fail "check printed other commands (every setting)"
"$compute" -c "$conf" -n reconnect >"$tmpdir/reconnect.txt" || fail "reconnect -n failed"
[[ $(cat "$tmpdir/reconnect.txt") == "rdmaswap-nbd reconnect --socket $sock --device /dev/nbd7 --connections 1 --statusfile /run/rdmaswap/status" ]] ||
    fail "reconnect -n printed: $(cat "$tmpdir/reconnect.txt")"

# reconnect (rdmaswap-nbdkit.service's ExecStartPost) with the device not connected, as at the
# first start: nothing to do (rdmaswap-nbd is not even run), exit 0. Skipped if this host has
# a connected /dev/nbd7 of its own.
write_conf
if [[ $(cat /sys/block/nbd7/size 2>/dev/null || echo 0) == 0 ]]; then
    "$compute" -c "$conf" reconnect 2>"$tmpdir/err" ||
        fail "reconnect with /dev/nbd7 not connected failed: $(cat "$tmpdir/err")"
    grep -q 'not connected: nothing to reconnect' "$tmpdir/err" || fail "reconnect said: $(cat "$tmpdir/err")"
else
    log "/dev/nbd7 is connected on this host: reconnect not run"
fi

# The real thing: nbdkit in the foreground, as rdmaswap-nbdkit.service runs it.
"$compute" -c "$conf" nbdkit </dev/null >"$tmpdir/nbdkit-compute.log" 2>&1 &
pid=$!
cleanup_pid $pid
timeout 60 "$compute" -c "$conf" wait-ready $pid || fail "wait-ready failed"
[[ $(cat /proc/$pid/comm) == nbdkit ]] || fail "the main process is $(cat /proc/$pid/comm), not nbdkit (no exec?)"
grep -E -q '^Max stack size +1048576 ' /proc/$pid/limits || fail "nbdkit's stack limit is not 1 MiB"
locked=$(awk '/^VmLck:/ { print $2 }' /proc/$pid/status)
((locked > 0)) || fail "nbdkit --swap has no locked memory"
uri="nbd+unix:///?socket=$sock"
nbdsh_run -u "$uri" -c '
assert h.get_size() == 64 * 1024 * 1024
data = bytes(range(256)) * 512
h.pwrite(data, 5 * 1024 * 1024 - 4096)
assert h.pread(len(data), 5 * 1024 * 1024 - 4096) == data
assert h.pread(4096, 0) == bytes(4096)
' || fail "the device nbdkit serves does not work"
[[ $(ctl_get "$MEMSERVER_PORT" slabs_used) -ge 1 ]] || fail "no slab used on the memserver"
wait_until 10 "status file" test -s "$tmpdir/status"
grep -q '^replicas=1$' "$tmpdir/status" || fail "status file without replicas=1: $(cat "$tmpdir/status")"
kill -TERM $pid
wait $pid 2>/dev/null || true

# wait-ready fails fast when nbdkit cannot start (no memserver on that port).
write_conf "SERVERS=127.0.0.1:$(free_port)"
"$compute" -c "$conf" nbdkit </dev/null >"$tmpdir/nbdkit-dead.log" 2>&1 &
pid=$!
cleanup_pid $pid
start=$SECONDS
rc=0
timeout 60 "$compute" -c "$conf" wait-ready $pid 2>"$tmpdir/err" || rc=$?
[[ $rc == 1 ]] || fail "wait-ready with a dead nbdkit: exit $rc, expected 1"
((SECONDS - start < 30)) || fail "wait-ready took $((SECONDS - start)) s to notice nbdkit died"
grep -q 'not reachable' "$tmpdir/nbdkit-dead.log" || fail "nbdkit did not say the memserver is unreachable"
log "rdmaswap-compute OK"
