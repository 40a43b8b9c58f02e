#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 26, S2: an address from etcd that was never reached never makes a chunk lost. With a real
# etcd on loopback, a volume a quarter written on two donors (replicas=1, lease=60), then a dead
# address (and 200 more) added to its holders record in etcd (what anyone who can write to etcd
# can do, with no key): at the next start of nbdkit no chunk is lost, every byte reads back,
# writes succeed, and neither the local record (the file beside the volume key) nor etcd's copy
# names a dead address. On c230031 30 of 32 chunks were marked lost (writes to them failed with
# EIO; 24 of 32 here on main at 2cf5674) and the address was copied into the local record, so
# it stayed after etcd was cleaned.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires etcdctl version
requires_build memserver plugin

export tmpdir
start_etcd_cluster 1
prefix=/rdmaswap-holders-dead-test/
ectl() { timeout 10 etcdctl --endpoints "$ETCD_ENDPOINTS" --dial-timeout=2s --command-timeout=5s "$@"; }
registered() { [[ -n $(ectl get --print-value-only "${prefix}donors/$1") ]]; }
reg_args=(--etcd "$ETCD_ENDPOINTS" --advertise @ADDR@ --etcd-prefix "$prefix")
stat_get() { sed -n "s/^$1=//p" "$tmpdir/status" 2>/dev/null; }
donor_is() { grep -q "^donor\.[0-9]*=$1 state=$2 " "$tmpdir/status" 2>/dev/null; }
plugin_args=(etcd="$ETCD_ENDPOINTS" etcd-prefix="$prefix" size=32M replicas=1 lease=60 timeout=3
             statusfile="$tmpdir/status")

addrs=()
for _ in 0 1; do
    start_memserver 32M 1M "${reg_args[@]}"
    addrs+=("$MEMSERVER_ADDR")
    wait_until 10 "registration of $MEMSERVER_ADDR" registered "$MEMSERVER_ADDR"
done
start_nbdkit first -- "${plugin_args[@]}"
for a in "${addrs[@]}"; do wait_until 10 "donor $a in use" donor_is "$a" ok; done
# A quarter of the volume written: the other 24 chunks hold nothing yet (a start that thinks a
# donor is missing takes such chunks as lost: their data might have been there).
nbdsh_run -u "$NBDKIT_URI" -c '
import os
data = os.urandom(8 << 20)
for off in range(0, 8 << 20, 4 << 20):
    h.pwrite(data[off:off + (4 << 20)], off)
open(os.environ["tmpdir"] + "/data", "wb").write(data)
' || fail "the first write failed"
stop_nbdkit_clean

# The dead address, added to etcd's copy of the holders record.
key=$(ectl get --prefix --keys-only "${prefix}volumes/" | grep '/holders$' | head -n 1)
[[ -n $key ]] || fail "no holders record under ${prefix}volumes/ in etcd"
dead="127.0.0.1:$(free_port)"
value=$(ectl get --print-value-only "$key")
# (And 200 more dead addresses: a start contacts at most 64 that etcd's copy alone names, and
# none makes a chunk lost.)
forged=$("$PYTHON" -c '
import json, sys
r = json.loads(sys.argv[1])
more = {"127.4.%d.%d:9" % (i // 250, i % 250 + 1) for i in range(200)}
r["donors"] = sorted(set(r["donors"]) | {sys.argv[2]} | more)
print(json.dumps(r))' "$value" "$dead")
ectl put "$key" "$forged" >/dev/null || fail "etcdctl put failed"
log "etcd's record now names $dead and 200 more dead addresses"

rm -f "$tmpdir/status"
start_nbdkit second -- "${plugin_args[@]}"
wait_until 10 "the status file" test -s "$tmpdir/status"
lost=$(stat_get lost)
[[ $lost == 0 ]] || fail "a dead address in etcd's holders record made $lost chunks lost"
nbdsh_run -u "$NBDKIT_URI" -c '
import os
want = open(os.environ["tmpdir"] + "/data", "rb").read()
got = bytearray()
for off in range(0, 8 << 20, 4 << 20):
    got += h.pread(4 << 20, off)
assert bytes(got) == want, "the bytes read back differ from those written"
assert h.pread(4 << 20, 28 << 20) == bytes(4 << 20), "a chunk never written does not read as zeros"
new = os.urandom(32 << 20)
for off in range(0, 32 << 20, 4 << 20):
    h.pwrite(new[off:off + (4 << 20)], off)
for off in range(0, 32 << 20, 4 << 20):
    assert h.pread(4 << 20, off) == new[off:off + (4 << 20)], "a rewrite read back wrong"
' || fail "reads or writes after the start with the forged record failed"
holders=("$STATE_DIRECTORY"/volume.key.*.holders)
[[ -f ${holders[0]} ]] || fail "no holders record beside the volume key in $STATE_DIRECTORY"
grep -q "$dead\|127\.4\." "${holders[0]}" && fail "the local record names a dead address: $(cat "${holders[0]}")"
ectl get --print-value-only "$key" | grep -q "$dead\|127\.4\." &&
    fail "etcd's record still names a dead address: $(ectl get --print-value-only "$key")"
stop_nbdkit_clean
log "0 chunks lost, 8 MiB read back, 32 MiB rewritten; the local record: $(cat "${holders[0]}")"
log "PASS"
