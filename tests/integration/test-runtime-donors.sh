#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Donors join and leave while nbdkit serves, without a restart:
# 1. server=: a memserver that was down when nbdkit started is connected once it answers, and
#    gets new slabs; every byte reads back right.
# 2. etcd=: a memserver registered after nbdkit started is used (new slabs, and slabs another
#    donor gives back move to it); when its registration vanishes it is retired (no new slabs,
#    its replicas serve on); kill -9 of it with replicas=2 loses nothing, and repair restores
#    two copies of every slab on the others.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl

status() { cat "$tmpdir/status" 2>/dev/null; }
stat_get() { sed -n "s/^$1=//p" "$tmpdir/status"; }
# donor_state ADDR: the volume's state of donor ADDR (the last line naming it: a donor that came
# back is a new donor).
donor_state() { status | sed -n "s/^donor\.[0-9]*=$1 state=\([a-z]*\) .*/\1/p" | tail -n 1; }
donor_is() { [[ $(donor_state "$1") == "$2" ]]; }
# fio_region NAME OFFSET_MIB SIZE_MIB write|verify: fio through $NBDKIT_URI, crc32c-verified,
# seeded by the offset so that a later verify of the region checks what the write wrote.
fio_region() {
    local name=$1 off=$2 size=$3 mode=$4 extra=(--do_verify=1)
    [[ $mode == verify ]] && extra=(--verify_only)
    timeout 60 fio --name="$name" --ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite \
        --bssplit=4k/50:128k/50 --iodepth=8 --offset="${off}M" --size="${size}M" --verify=crc32c \
        --verify_fatal=1 --verify_state_save=0 --randseed=$((off + 1)) "${extra[@]}" \
        --output-format=json >"$tmpdir/fio-$name.json" ||
        { cat "$tmpdir/fio-$name.json" >&2; tail -n 30 "$NBDKIT_LOG" >&2; fail "fio $name ($mode of $size MiB at $off MiB) failed"; }
}

# ---- 1. server=: a donor down at start joins when it answers ----
start_memserver 64M 1M
a_port=$MEMSERVER_PORT a_addr=$MEMSERVER_ADDR
b_port=$(free_port)
start_nbdkit late -- server="$a_addr" server="127.0.0.1:$b_port" size=16M replicas=1 lease=0 \
    timeout=5 statusfile="$tmpdir/status"
grep -q "memserver 127.0.0.1:$b_port is not reachable" "$NBDKIT_LOG" ||
    fail "nbdkit did not warn that 127.0.0.1:$b_port is down"
fio_region late1 0 8 write
[[ $(ctl_get "$a_port" slabs_used) == 8 ]] || fail "expected 8 slabs on $a_addr"
MEMSERVER_FIXED_PORT=$b_port start_memserver 64M 1M
b_addr=$MEMSERVER_ADDR
wait_until 30 "$b_addr added to the volume" donor_is "$b_addr" ok
fio_region late2 8 8 write
b_used=$(ctl_get "$b_port" slabs_used)
log "after the second write: $(ctl_get "$a_port" slabs_used) slabs on $a_addr, $b_used on the late $b_addr"
((b_used >= 4)) || fail "the late donor $b_addr got $b_used of 8 new slabs (power of two choices: it was empty)"
fio_region late1v 0 8 verify
fio_region late2v 8 8 verify
kill -TERM "$NBDKIT_PID"
wait "$NBDKIT_PID" 2>/dev/null || true
log "part 1 passed: a server= donor down at start joined and serves"

# ---- 2. etcd=: donors registered at runtime ----
start_etcd_cluster 1
prefix=/rdmaswap-runtime-test/
ectl() { timeout 10 etcdctl --endpoints "$ETCD_ENDPOINTS" --dial-timeout=2s --command-timeout=3s "$@"; }
registered() { [[ -n $(ectl get --print-value-only "${prefix}donors/$1") ]]; }
reg_args=(--etcd "$ETCD_ENDPOINTS" --advertise @ADDR@ --etcd-prefix "$prefix")
ports=() addrs=()
for i in 0 1; do
    start_memserver 64M 1M "${reg_args[@]}"
    ports+=("$MEMSERVER_PORT") addrs+=("$MEMSERVER_ADDR")
    wait_until 10 "registration of $MEMSERVER_ADDR" registered "$MEMSERVER_ADDR"
done
rm -f "$tmpdir/status"
start_nbdkit reg -- etcd="$ETCD_ENDPOINTS" etcd-prefix="$prefix" size=40M replicas=2 lease=0 \
    timeout=5 statusfile="$tmpdir/status" donor-cache="$tmpdir/reg.donors"
fio_region reg1 0 16 write
start_memserver 64M 1M "${reg_args[@]}"
c_port=$MEMSERVER_PORT c_addr=$MEMSERVER_ADDR c_pid=$MEMSERVER_PID
wait_until 30 "the runtime donor $c_addr added" donor_is "$c_addr" ok
# A give-back on the first donor, of 8 slabs more than it has free: 8 of its slabs must move,
# and the runtime donor is the only one with room that holds no copy of them.
migrated0=$(stat_get migrated)
ctl_giveback "${ports[0]}" $(($(ctl_get "${ports[0]}" slabs_free) + 8))M >/dev/null ||
    fail "rdmaswapctl giveback failed"
moved() { (($(stat_get migrated) >= migrated0 + 8)); }
wait_until 60 "8 slabs moved off ${addrs[0]}" moved
c_used=$(ctl_get "$c_port" slabs_used)
log "give-back of 8 used slabs on ${addrs[0]}: $(stat_get migrated) slabs moved; the runtime donor holds $c_used"
((c_used == 8)) || fail "the runtime donor $c_addr holds $c_used slabs after the give-back, not 8"
# New slabs: the first donor has no room left, so every new slab has a copy on the runtime donor.
fio_region reg2 16 16 write
c_after=$(ctl_get "$c_port" slabs_used)
log "after a second write of 16 MiB: ${addrs[0]} $(ctl_get "${ports[0]}" slabs_used), ${addrs[1]} $(ctl_get "${ports[1]}" slabs_used), runtime donor $c_after slabs"
((c_after == c_used + 16)) || fail "the runtime donor $c_addr got $((c_after - c_used)) of the 16 new slabs, not all 16"

# The first donor lends its memory again (room for the writes and the repair below).
ctl_lend "${ports[0]}" 48M >/dev/null || fail "rdmaswapctl lend failed"

# Its registration vanishes: retired, no new slabs, its replicas serve on. (A live memserver
# puts its value again when its free slabs or sessions change, up to 5 s after the writes
# above: first wait until the value says what it has, so that nothing puts it back while we
# look for the retirement.)
settled() {
    local v
    v=$(ectl get --print-value-only "${prefix}donors/$c_addr") &&
        [[ $("$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["slabs_free"])' \
            <<<"$v") == "$(ctl_get "$c_port" slabs_free)" ]]
}
wait_until 20 "the registration of $c_addr to count its free slabs" settled
ectl del "${prefix}donors/$c_addr" >/dev/null
wait_until 15 "$c_addr retired" donor_is "$c_addr" retired
fio_region reg3 32 8 write
[[ $(ctl_get "$c_port" slabs_used) == "$c_after" ]] ||
    fail "the retired donor $c_addr got new slabs ($c_after -> $(ctl_get "$c_port" slabs_used))"
fio_region reg2v 16 16 verify
log "registration of $c_addr deleted: retired, no new slabs, its replicas still read back"

# kill -9 of the runtime donor: replicas=2 loses nothing; repair restores two copies.
kill -KILL "$c_pid"
wait "$c_pid" 2>/dev/null || true
fio_region reg1v 0 16 verify
fio_region reg2v2 16 16 verify
fio_region reg3v 32 8 verify
healed() { [[ $(stat_get degraded) == 0 && $(stat_get lost) == 0 ]]; }
wait_until 60 "repair after the runtime donor's kill" healed
fio_region reg2v3 16 16 verify
log "kill -9 of the runtime donor: every byte read back; repaired: $(stat_get repaired) replicas"
log "PASS"
