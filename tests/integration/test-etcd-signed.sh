#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 26, "etcd decides nothing alone": signed records. With a real etcd on loopback, two
# certified donors (D1, D2: their registrations are signed by their donor keys) and a plugin
# with donor-ca=, an etcd writer holding no key puts
#  (a) an unsigned registration of a live uncertified memserver U1 (it holds the cluster key
#      only and registers itself: what any compute host can do),
#  (b) D1's signed registration copied to the address of another uncertified memserver U2,
#  (c) D2's registration with a field changed (it looks empty and unused: a lure),
#  (d) D1's older registration again, once D1 put a newer one (a replay),
#  (e) the volume's holders record unsigned, then signed by another key, naming U1:
# the plugin never contacts U1 or U2 (no session, no slab, no warning naming them: they were
# never probed), counts each (etcd_ignored_unsigned, _bad_cert, _bad_signature, _replayed,
# etcd_holders_ignored), and keeps serving on D1 and D2: no chunk lost, every byte reads back.
# Without the checks: (a) and (b) are probed (a refusal warning names U1 and U2), the counters
# stay absent, and (e)'s record makes the start contact U1.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires etcdctl version
requires_build memserver plugin ctl
"$PYTHON" -c 'import cryptography.hazmat.primitives.asymmetric.ed25519' 2>/dev/null ||
    skip "python3-cryptography is not installed"

export tmpdir
start_etcd_cluster 1
prefix=/rdmaswap-signed-test/
volume=signed-vol
ectl() { timeout 10 etcdctl --endpoints "$ETCD_ENDPOINTS" --dial-timeout=2s --command-timeout=5s "$@"; }
reg_value() { ectl get --print-value-only "${prefix}donors/$1"; }
registered() { [[ -n $(reg_value "$1") ]]; }
reg_args=(--etcd "$ETCD_ENDPOINTS" --advertise @ADDR@ --etcd-prefix "$prefix")
stat_get() { sed -n "s/^$1=//p" "$tmpdir/status" 2>/dev/null; }
stat_at_least() { [[ $(stat_get "$1") -ge $2 ]]; }
donor_is() { grep -q "^donor\.[0-9]*=$1 state=$2 " "$tmpdir/status" 2>/dev/null; }
# A JSON edit of a value: python3 -c CODE VALUE [ARGS...] with r the parsed value.
jedit() {
    local code=$1
    shift
    "$PYTHON" -c "import json, sys
r = json.loads(sys.argv[1])
$code
print(json.dumps(r))" "$@"
}

make_donor_ca
start_certified_memserver d1 32M 1M "${reg_args[@]}"
D1=$MEMSERVER_ADDR
start_certified_memserver d2 32M 1M "${reg_args[@]}"
D2=$MEMSERVER_ADDR
RDMASWAP_TEST_UNCERTIFIED=1 start_memserver 32M 1M "${reg_args[@]}"
U1=$MEMSERVER_ADDR U1_PORT=$MEMSERVER_PORT
RDMASWAP_TEST_UNCERTIFIED=1 start_memserver 32M 1M
U2=$MEMSERVER_ADDR U2_PORT=$MEMSERVER_PORT
for a in "$D1" "$D2" "$U1"; do wait_until 10 "registration of $a" registered "$a"; done
reg_value "$D1" | grep -q '"sig"' || fail "D1's registration is not signed: $(reg_value "$D1")"
reg_value "$U1" | grep -q '"sig"' && fail "U1's registration is signed: $(reg_value "$U1")"
# (b) D1's registration copied to U2's address.
d1_old=$(reg_value "$D1")
ectl put "${prefix}donors/$U2" "$(jedit 'r["addr"] = sys.argv[2]' "$d1_old" "$U2")" >/dev/null

plugin_args=(etcd="$ETCD_ENDPOINTS" etcd-prefix="$prefix" donor-ca="$DONOR_CA"
             donor-crl="$DONOR_CRL" volume="$volume" size=16M replicas=1 spread=2 lease=60
             timeout=3 statusfile="$tmpdir/status")
start_nbdkit first -- "${plugin_args[@]}"
for a in "$D1" "$D2"; do wait_until 10 "donor $a in use" donor_is "$a" ok; done
wait_until 10 "(a) counted" stat_at_least etcd_ignored_unsigned 1
wait_until 10 "(b) counted" stat_at_least etcd_ignored_bad_cert 1
nbdsh_run -u "$NBDKIT_URI" -c '
import os
data = os.urandom(16 << 20)
for off in range(0, 16 << 20, 4 << 20):
    h.pwrite(data[off:off + (4 << 20)], off)
open(os.environ["tmpdir"] + "/data", "wb").write(data)
' || fail "the first write failed"

# (c) D2's registration tampered: it says it is larger, empty and unused (a lure).
ectl put "${prefix}donors/$D2" "$(jedit 'r["slabs_total"] += 64; r["slabs_free"] = r["slabs_total"]; r["sessions"] = 0' \
    "$(reg_value "$D2")")" >/dev/null
wait_until 10 "(c) counted" stat_at_least etcd_ignored_bad_signature 1
# An unsigned registration put while it runs (the watch): U1's value for U2's key.
ectl put "${prefix}donors/$U2" "$(jedit 'r["addr"] = sys.argv[2]' "$(reg_value "$U1")" "$U2")" >/dev/null
wait_until 10 "an unsigned registration by the watch counted" stat_at_least etcd_ignored_unsigned 2
# (d) D1 registered again since (its session count changed): its old registration put back.
wait_until 10 "a newer registration of D1" bash -c "[[ \$(timeout 10 etcdctl --endpoints '$ETCD_ENDPOINTS' get --print-value-only '${prefix}donors/$D1') != '$d1_old' ]]"
ectl put "${prefix}donors/$D1" "$d1_old" >/dev/null
wait_until 10 "(d) counted" stat_at_least etcd_ignored_replayed 1

check_data() {
    nbdsh_run -u "$NBDKIT_URI" -c '
import os
want = open(os.environ["tmpdir"] + "/data", "rb").read()
got = bytearray()
for off in range(0, 16 << 20, 4 << 20):
    got += h.pread(4 << 20, off)
assert bytes(got) == want, "the bytes read back differ from those written"
new = os.urandom(16 << 20)
for off in range(0, 16 << 20, 4 << 20):
    h.pwrite(new[off:off + (4 << 20)], off)
for off in range(0, 16 << 20, 4 << 20):
    assert h.pread(4 << 20, off) == new[off:off + (4 << 20)], "a rewrite read back wrong"
open(os.environ["tmpdir"] + "/data", "wb").write(new)
' || fail "$1: reads or writes failed"
    [[ $(stat_get lost) == 0 ]] || fail "$1: $(stat_get lost) chunks lost"
}
never_used() {
    local p
    for p in "$U1_PORT" "$U2_PORT"; do
        [[ $(ctl_get "$p" sessions) -eq 0 ]] || fail "$1: the uncertified memserver on port $p has a session"
        [[ $(ctl_get "$p" slabs_free) -eq 32 ]] || fail "$1: the uncertified memserver on port $p holds slabs"
    done
    grep -q "^donor\.[0-9]*=\($U1\|$U2\) " "$tmpdir/status" && fail "$1: a donor line names U1 or U2"
    # (Only the warnings about entries ignored may name them: a probe or a connection
    # refused for want of a certificate, or one that failed, is a warning naming the address.)
    grep "$U1\|$U2" "$NBDKIT_LOG" | grep -qv 'ignored' &&
        fail "$1: the plugin contacted U1 or U2: $(grep "$U1\|$U2" "$NBDKIT_LOG" | grep -v ignored)"
    return 0
}
check_data "registrations (a) to (d)"
never_used "registrations (a) to (d)"
log "registrations: $(grep '^etcd_ignored' "$tmpdir/status" | tr '\n' ' ')"
grep -q 'etcd: .*ignored' "$NBDKIT_LOG" || fail "no warning about the entries ignored"
stop_nbdkit_clean

# (e) The holders record in etcd: signed by the volume key; planted unsigned, then signed by
# another key, each naming U1 (and a dead address).
key="${prefix}volumes/$volume/holders"
genuine=$(ectl get --print-value-only "$key")
grep -q '"sig"' <<<"$genuine" || fail "etcd's holders record is not signed: $genuine"
dead="127.0.0.1:$(free_port)"
for plant in unsigned other-key; do
    if [[ $plant == unsigned ]]; then
        value=$(jedit 'del r["sig"]; r["donors"] = sorted(set(r["donors"]) | {sys.argv[2], sys.argv[3]})' \
            "$genuine" "$U1" "$dead")
    else
        value=$("$PYTHON" - "$genuine" "$U1" "$dead" "$key" <<'EOF'
import base64, json, struct, sys
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
r = json.loads(sys.argv[1])
del r["sig"]
r["donors"] = sorted(set(r["donors"]) | {sys.argv[2], sys.argv[3]})
key = sys.argv[4].encode()
text = json.dumps(r, separators=(",", ":"), sort_keys=True).encode()
msg = b"rdmaswap-holders-v1" + struct.pack("<I", len(key)) + key + text
r["sig"] = base64.b64encode(Ed25519PrivateKey.generate().sign(msg)).decode()
print(json.dumps(r))
EOF
)
    fi
    ectl put "$key" "$value" >/dev/null
    rm -f "$tmpdir/status"
    start_nbdkit "$plant" -- "${plugin_args[@]}"
    wait_until 10 "the status file" test -s "$tmpdir/status"
    [[ $(stat_get etcd_holders_ignored) == 1 ]] || fail "($plant) the planted holders record was not counted"
    grep -q 'holders record ignored' "$NBDKIT_LOG" || fail "($plant) no warning about the holders record"
    check_data "holders record $plant"
    never_used "holders record $plant"
    stop_nbdkit_clean
    log "holders record $plant: ignored, 0 chunks lost, 16 MiB read back and rewritten"
done
log "PASS"
