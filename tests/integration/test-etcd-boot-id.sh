#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 26, S1: a boot id seen in etcd is only a reason to ask the donor itself. With a real
# etcd on loopback and replicas=1:
# 1. `etcdctl put` of a live donor's registration with a new boot id (what anyone who can write
#    to etcd can do, with no key): the plugin asks the donor over its session's connection, the
#    session is there, and nothing is dropped: no slab lost, every byte reads back (on c230031
#    the plugin took the donor as restarted: 8 of 8 slabs lost, reads EIO).
# 2. A real restart of the donor (kill -9, then a new memserver on the same port, with a new boot
#    id in its registration) is still seen: its session is gone, so its slabs are lost (EIO, not
#    zeros: replicas=1) and it is used again as a new donor.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires etcdctl version
requires_build memserver plugin

export tmpdir
start_etcd_cluster 1
prefix=/rdmaswap-boot-id-test/
ectl() { timeout 10 etcdctl --endpoints "$ETCD_ENDPOINTS" --dial-timeout=2s --command-timeout=5s "$@"; }
reg_value() { ectl get --print-value-only "${prefix}donors/$1"; }
registered() { [[ -n $(reg_value "$1") ]]; }
reg_args=(--etcd "$ETCD_ENDPOINTS" --advertise @ADDR@ --etcd-prefix "$prefix")
stat_get() { sed -n "s/^$1=//p" "$tmpdir/status" 2>/dev/null; }
donor_is() { grep -q "^donor\.[0-9]*=$1 state=$2 " "$tmpdir/status" 2>/dev/null; }

start_memserver 16M 1M "${reg_args[@]}"
addr=$MEMSERVER_ADDR port=$MEMSERVER_PORT
wait_until 10 "registration of $addr" registered "$addr"
start_nbdkit boot -- etcd="$ETCD_ENDPOINTS" etcd-prefix="$prefix" size=8M replicas=1 timeout=3 \
    lease=0 statusfile="$tmpdir/status"
wait_until 10 "donor $addr in use" donor_is "$addr" ok
nbdsh_run -u "$NBDKIT_URI" -c '
import os
data = os.urandom(8 << 20)
h.pwrite(data, 0)
open(os.environ["tmpdir"] + "/data", "wb").write(data)
' || fail "the first write failed"

# ---- 1. A forged boot id ----
old=$(reg_value "$addr")
forged=$("$PYTHON" -c '
import json, sys
r = json.loads(sys.argv[1])
r["boot_id"] = "%016x" % (int(r["boot_id"], 16) ^ 0x5a5a5a5a5a5a5a5a)
print(json.dumps(r))' "$old")
ectl put "${prefix}donors/$addr" "$forged" >/dev/null || fail "etcdctl put failed"
log "forged: $forged"
# The plugin reacts to the watch event within a step (2 s at most); wait until it has asked
# (the counter) or lost the slabs (what c230031 did, at once).
# With certified donors (donor-ca=) the registrations are signed: the forged one is refused
# outright (etcd_ignored_bad_signature), and the donor is not even asked.
asked_or_lost() { [[ $(stat_get lost) != 0 || $(stat_get etcd_boot_id_disbelieved) -ge 1 ||
                   $(stat_get etcd_ignored_bad_signature) -ge 1 ]]; }
wait_until 10 "the plugin to react to the forged boot id" asked_or_lost
lost=$(stat_get lost)
[[ $lost == 0 ]] || fail "a boot id forged in etcd lost $lost slabs (replicas=1)"
nbdsh_run -u "$NBDKIT_URI" -c '
import os
want = open(os.environ["tmpdir"] + "/data", "rb").read()
assert h.pread(8 << 20, 0) == want, "the bytes read back differ from those written"
' || fail "reading back after the forged boot id failed"
[[ $(stat_get etcd_ignored_bad_signature) -ge 1 ]] ||
    grep -q "etcd says memserver $addr restarted" "$NBDKIT_LOG" ||
    fail "no warning about the disbelieved boot id: $(grep -i boot "$NBDKIT_LOG" || true)"
log "part 1: forged boot id disbelieved; 0 slabs lost, 8 MiB read back"

# ---- 2. A real restart ----
kill -KILL "$MEMSERVER_PID"
wait "$MEMSERVER_PID" 2>/dev/null || true
MEMSERVER_FIXED_PORT=$port start_memserver 16M 1M "${reg_args[@]}"
new_boot() { [[ $(reg_value "$addr") != "$old" && $(reg_value "$addr") != "$forged" ]] && registered "$addr"; }
wait_until 10 "the new registration of $addr" new_boot
wait_until 10 "the restarted donor's slabs counted lost" \
    bash -c "[[ \$(sed -n 's/^lost=//p' '$tmpdir/status') == 8 ]]"
# Lost slabs read as errors, never as zeros.
nbdsh_run -u "$NBDKIT_URI" -c '
try:
    h.pread(4096, 0)
except nbd.Error:
    pass
else:
    raise AssertionError("a lost slab read without an error")
' || fail "a slab lost with the restarted donor did not read as an error"
# The restarted donor is used again as a new donor: a lost slab trimmed whole takes writes
# again, and they land on it.
wait_until 10 "the restarted donor in use again" donor_is "$addr" ok
nbdsh_run -u "$NBDKIT_URI" -c '
h.trim(1 << 20, 0)
h.pwrite(b"\x42" * 65536, 0)
assert h.pread(65536, 0) == b"\x42" * 65536' || fail "a write after the real restart failed"
log "part 2: a real restart is still seen: 8 slabs lost (EIO), the donor used again"
stop_nbdkit_clean
log "PASS"
