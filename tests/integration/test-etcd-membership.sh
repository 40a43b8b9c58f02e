#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# etcd membership of a serving volume, with a real 3-member etcd on loopback and etcd= only:
# 1. A watch that falls behind a compaction recovers: the etcd member that carries nbdkit's watch
#    stream is stopped (SIGSTOP) while a donor registers through the other two, enough writes
#    follow that the leader drops its log and sends that member a snapshot, and the store is
#    compacted and defragmented. When the member comes back it restores the snapshot and cancels
#    the watch with the compaction's revision (a second watch on that member, beside nbdkit's,
#    proves it: the cancel arrives, the registration's event never does). nbdkit takes the new
#    donor within a few seconds, well before its watch would have been opened again anyway.
# 2. That runtime-added donor gets slabs; kill -9 of it during fio write+verify (replicas=2)
#    loses nothing, and repair restores two copies of every slab on the other two donors.
# 3. 2 of 3 etcd members killed during fio write+verify: 0 errors, nbdkit serves on, and new
#    slabs are still placed (losing etcd is not losing the donors).
# (A killed donor's registration disappearing within TTL + 1 s: test-etcd-register.sh.)
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires curl --version
requires ss -V
requires_build memserver plugin ctl

now() { date +%s.%N; }
elapsed() { "$PYTHON" -c 'import sys; print("%.2f" % (float(sys.argv[2]) - float(sys.argv[1])))' "$1" "$2"; }
status() { cat "$tmpdir/status" 2>/dev/null; }
stat_get() { sed -n "s/^$1=//p" "$tmpdir/status"; }
# donor_state ADDR: the volume's state of donor ADDR (the last line naming it).
donor_state() { status | sed -n "s/^donor\.[0-9]*=$1 state=\([a-z]*\) .*/\1/p" | tail -n 1; }
donor_is() { [[ $(donor_state "$1") == "$2" ]]; }
# fio_region NAME OFFSET_MIB SIZE_MIB write|verify: as in test-runtime-donors.sh.
fio_region() {
    local name=$1 off=$2 size=$3 mode=$4 extra=(--do_verify=1)
    [[ $mode == verify ]] && extra=(--verify_only)
    timeout 60 fio --name="$name" --ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite \
        --bssplit=4k/50:128k/50 --iodepth=8 --offset="${off}M" --size="${size}M" --verify=crc32c \
        --verify_fatal=1 --verify_state_save=0 --randseed=$((off + 1)) "${extra[@]}" \
        --output-format=json >"$tmpdir/fio-$name.json" ||
        { cat "$tmpdir/fio-$name.json" >&2; fail "fio $name ($mode of $size MiB at $off MiB) failed"; }
    "$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio-$name.json" $((size << 20)) >/dev/null ||
        fail "fio $name: see above"
}

# Every member snapshots every 100 entries, so the leader keeps only the last 5,000 entries
# (etcd's catch-up window, not configurable in 3.4) plus up to 100 in its log: a member further
# behind gets a snapshot.
ETCD_EXTRA_ARGS=(--snapshot-count 100)
start_etcd_cluster 3
prefix=/rdmaswap-membership-test/
# The members other than 0, the one nbdkit's watch is on (its client starts with the first URL).
others="${ETCD_CLIENT_URLS[1]},${ETCD_CLIENT_URLS[2]}"
ectl() { timeout 10 etcdctl --endpoints "$others" --dial-timeout=2s --command-timeout=5s "$@"; }
registered() { [[ -n $(ectl get --print-value-only "${prefix}donors/$1") ]]; }
member_id() {
    etcdctl --endpoints "${ETCD_CLIENT_URLS[$1]}" endpoint status -w json |
        "$PYTHON" -c 'import json, sys; print("%x" % json.load(sys.stdin)[0]["Status"]["header"]["member_id"])'
}
leader_id() {
    etcdctl --endpoints "${ETCD_CLIENT_URLS[$1]}" endpoint status -w json |
        "$PYTHON" -c 'import json, sys; print("%x" % json.load(sys.stdin)[0]["Status"]["leader"])'
}
# Memservers talk to members 1 and 2 first (member 0 is stopped for a while below).
reg_args=(--etcd "$others,${ETCD_CLIENT_URLS[0]}" --advertise @ADDR@ --etcd-prefix "$prefix")

ports=() addrs=()
for i in 0 1; do
    start_memserver 64M 1M "${reg_args[@]}"
    ports+=("$MEMSERVER_PORT") addrs+=("$MEMSERVER_ADDR")
    wait_until 10 "registration of $MEMSERVER_ADDR" registered "$MEMSERVER_ADDR"
done

t_nbdkit=$(now)
start_nbdkit mem -- etcd="$ETCD_ENDPOINTS" etcd-prefix="$prefix" size=48M replicas=2 lease=0 \
    timeout=5 statusfile="$tmpdir/status" donor-cache="$tmpdir/mem.donors"
for a in "${addrs[@]}"; do wait_until 10 "donor $a in the status file" donor_is "$a" ok; done
# nbdkit's watch stream is an HTTP connection to member 0 (the only connection it keeps to etcd).
p0=${ETCD_CLIENT_URLS[0]##*:}
watching_0() { ss -Htnp state established "( dport = :$p0 )" | grep -q "pid=$NBDKIT_PID,"; }
wait_until 10 "nbdkit's watch stream on etcd member 0 (port $p0)" watching_0

# ---- 1. A watch that falls behind a compaction ----
# Member 0 must not be the leader (stopping the leader costs an election, and the leader sends
# no snapshot to itself).
if [[ $(leader_id 0) == "$(member_id 0)" ]]; then
    etcdctl --endpoints "${ETCD_CLIENT_URLS[0]}" move-leader "$(member_id 1)" >/dev/null ||
        fail "etcdctl move-leader failed"
fi
# The witness: a watch of the same keys on the same member, read by curl.
b64() { printf %s "$1" | base64 -w0; }
curl -sN --max-time 60 -X POST "${ETCD_CLIENT_URLS[0]}/v3/watch" \
    -d "{\"create_request\":{\"key\":\"$(b64 "${prefix}donors/")\",\"range_end\":\"$(b64 "${prefix}donors0")\"}}" \
    >"$tmpdir/witness.json" 2>&1 &
witness=$!
cleanup_pid "$witness"
wait_until 10 "the witness watch created" grep -q '"created":true' "$tmpdir/witness.json"
sigstop "${ETCD_PIDS[0]}"
# filler N PARALLEL: N puts of one key outside the donors through members 1 and 2 (the JSON
# gateway, keep-alive connections), PARALLEL at a time.
filler() {
    "$PYTHON" - "$others" "$1" "$2" "$(b64 "${prefix}filler")" <<'EOF'
import base64, http.client, json, sys, threading, urllib.parse
urls, n, k, key = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def run(i):
    u = urllib.parse.urlparse(urls[i % len(urls)])
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    for j in range(i, n, k):
        c.request("POST", "/v3/kv/put", json.dumps({"key": key, "value": base64.b64encode(b"%d" % j).decode()}))
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            sys.exit("put: HTTP %d %s" % (r.status, body[:200]))
ts = [threading.Thread(target=run, args=(i,)) for i in range(k)]
for t in ts: t.start()
for t in ts: t.join()
EOF
}
# One put at a time first: the leader sends each in a message of its own, until the 512
# messages it lets be in flight to the stopped member (kept in socket buffers) are used up, so
# that the registration below is not among them.
t0=$(now)
filler 1000 1 || fail "etcd puts failed"
start_memserver 64M 1M --etcd "$others" --advertise @ADDR@ --etcd-prefix "$prefix"
c_port=$MEMSERVER_PORT c_addr=$MEMSERVER_ADDR c_pid=$MEMSERVER_PID
wait_until 10 "registration of $c_addr" registered "$c_addr"
filler 5200 8 || fail "etcd puts failed"
rev=$(ectl get -w json "${prefix}donors/$c_addr" |
    "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["header"]["revision"])')
ectl compact "$rev" >/dev/null || fail "etcdctl compact $rev failed"
ectl defrag >/dev/null || fail "etcdctl defrag failed"
log "member 0 stopped; $c_addr registered, 6200 puts, compacted at revision $rev in $(elapsed "$t0" "$(now)") s"
donor_state "$c_addr" | grep -q . && fail "nbdkit knew $c_addr while its etcd member was stopped"
kill -CONT "${ETCD_PIDS[0]}"
t_cont=$(now)
wait_until 15 "the witness watch cancelled by the compaction" \
    grep -q "\"canceled\":true,\"compact_revision\":\"$rev\"" "$tmpdir/witness.json"
grep -q "applied incoming snapshot" "$tmpdir/etcd-0.log" ||
    fail "etcd member 0 did not restore a snapshot (the scenario did not happen)"
grep -q "$(b64 "${prefix}donors/$c_addr")" "$tmpdir/witness.json" &&
    fail "the witness watch saw the registration of $c_addr (the scenario did not happen): $(cat "$tmpdir/witness.json")"
wait_until 15 "nbdkit took the donor $c_addr registered during the stop" donor_is "$c_addr" ok
t_ok=$(now)
log "member 0 back: snapshot restored, watches cancelled at revision $rev; $c_addr in use $(elapsed "$t_cont" "$t_ok") s after"
# Not by a watch reopened at the end of its span (30 s, common/cluster/membership.h) nor after a
# failure (which it would have logged):
"$PYTHON" -c 'import sys; sys.exit(float(sys.argv[2]) - float(sys.argv[1]) >= 28)' "$t_nbdkit" "$t_ok" ||
    fail "$c_addr was taken $(elapsed "$t_nbdkit" "$t_ok") s after nbdkit started: not proven to be by the cancelled watch"
grep -q "cannot watch the donors" "$NBDKIT_LOG" && fail "nbdkit's watch failed: $(grep "cannot watch" "$NBDKIT_LOG")"
wait_etcd_healthy 15 "${ETCD_CLIENT_URLS[@]}"

# ---- 2. The runtime donor gets slabs; kill -9 of it during I/O loses nothing ----
fio_region before 24 16 write
c_used=$(ctl_get "$c_port" slabs_used)
log "16 MiB written: ${addrs[0]} $(ctl_get "${ports[0]}" slabs_used), ${addrs[1]} $(ctl_get "${ports[1]}" slabs_used), runtime donor $c_addr $c_used slabs"
((c_used >= 8)) || fail "the runtime donor $c_addr got $c_used of 32 new replicas (power of two choices: it was empty)"
repaired0=$(stat_get repaired)
(sleep 1; kill -KILL "$c_pid") >/dev/null 2>&1 &
killer=$!
fio_verify_until_done "$killer" /dev/null "with kill -9 of the runtime donor $c_addr" "killing $c_addr failed"
wait "$c_pid" 2>/dev/null || true
fio_region beforev 24 16 verify
healed() { [[ $(stat_get degraded) == 0 && $(stat_get lost) == 0 && $(stat_get repaired) -ge $((repaired0 + c_used)) ]]; }
wait_until 30 "repair after the kill of $c_addr" healed
fio_region beforev2 24 16 verify
log "kill -9 of the runtime donor: every byte read back; repaired: $(($(stat_get repaired) - repaired0)) replicas"

# ---- 3. 2 of 3 etcd members killed during I/O ----
(sleep 1; kill -KILL "${ETCD_PIDS[0]}" "${ETCD_PIDS[1]}"; sleep 2) >/dev/null 2>&1 &
killer=$!
fio_verify_until_done "$killer" /dev/null "with 2 of 3 etcd members killed" "killing etcd members failed"
stop_etcd_member 0
stop_etcd_member 1
kill -0 "$NBDKIT_PID" || fail "nbdkit exited"
# New slabs too (the region never written): etcd without a quorum retires no donor.
fio_region fresh 40 8 write
fio_region beforev3 24 16 verify
log "PASS"
