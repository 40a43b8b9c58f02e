#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 29: a compute host restarted many times over a day with etcd= (new donors each time,
# the default volume key), as an operator runs it, with a real etcd on loopback:
# 1. A first start (lease=0) and a clean shutdown log no line with "error:" (an operator's log
#    watcher alerts on those).
# 2. The donors of that run are gone; the holders record (the file beside the volume key) also
#    names 17 more donors gone long ago. nbdkit starts with two new live donors (etcd=
#    replicas=2; lease=60, so that the record keeps the donors it cannot contact) and says in
#    one line which recorded donors are not reachable.
# 3. A third donor registers while nbdkit serves and the writes need it (the first two are
#    full): nbdkit used to abort (std::out_of_range from Membership::step(), whose record
#    named donors it did not know; with lease=0 too). It must keep serving, use the new donor,
#    keep the dead donors in the record, and every byte must read back.
# 4. A restart with lease=0 drops the donors it cannot contact from the record (nothing of the
#    volume outlives a run with lease=0): the record stays bounded.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires etcdctl version
requires_build memserver plugin ctl

export tmpdir # (the nbdsh scripts below keep their bytes there)
start_etcd_cluster 1
prefix=/rdmaswap-restarts-test/
ectl() { timeout 10 etcdctl --endpoints "$ETCD_ENDPOINTS" --dial-timeout=2s --command-timeout=5s "$@"; }
registered() { [[ -n $(ectl get --print-value-only "${prefix}donors/$1") ]]; }
unregistered() { ! registered "$1"; }
reg_args=(--etcd "$ETCD_ENDPOINTS" --advertise @ADDR@ --etcd-prefix "$prefix")
status() { cat "$tmpdir/status" 2>/dev/null; }
donor_is() { status | grep -q "^donor\.[0-9]*=$1 state=$2 "; }
errors() { grep 'error:' "$1" || true; }
plugin_args=(etcd="$ETCD_ENDPOINTS" etcd-prefix="$prefix" size=24M replicas=2 timeout=5
             statusfile="$tmpdir/status")

# ---- 1. First start, clean shutdown ----
old_pids=() old_addrs=()
for _ in 0 1; do
    start_memserver 16M 1M "${reg_args[@]}"
    old_pids+=("$MEMSERVER_PID") old_addrs+=("$MEMSERVER_ADDR")
    wait_until 10 "registration of $MEMSERVER_ADDR" registered "$MEMSERVER_ADDR"
done
start_nbdkit first -- "${plugin_args[@]}" lease=0
for a in "${old_addrs[@]}"; do wait_until 10 "donor $a in use" donor_is "$a" ok; done
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"\x5a" * 65536, 0)' || fail "first write failed"
stop_nbdkit_clean
[[ -z $(errors "$NBDKIT_LOG") ]] ||
    fail "a first start and a clean shutdown logged errors: $(errors "$NBDKIT_LOG")"
log "first start and clean shutdown: no error line"

# ---- 2. The donors are gone; the record names them and 17 more ----
for p in "${old_pids[@]}"; do kill -KILL "$p"; done
# (Their keys would expire with their leases within 10 s, test-etcd-register.sh; deleted now to
# spare the wait.)
for a in "${old_addrs[@]}"; do ectl del "${prefix}donors/$a" >/dev/null; done
for a in "${old_addrs[@]}"; do wait_until 5 "$a unregistered" unregistered "$a"; done
holders=("$STATE_DIRECTORY"/volume.key.*.holders)
[[ -f ${holders[0]} ]] || fail "no holders record beside the volume key in $STATE_DIRECTORY"
dead=()
for _ in $(seq 17); do dead+=("127.0.0.1:$(free_port)"); done
"$PYTHON" - "${holders[0]}" "${old_addrs[@]}" "${dead[@]}" <<'EOF' || fail "cannot edit the holders record"
import json, os, sys
path, names = sys.argv[1], sys.argv[2:]
r = json.load(open(path))
assert sorted(r["donors"]) == sorted(sys.argv[2:4]), r
r["donors"] = sorted(set(r["donors"]) | set(names))
with open(path + ".new", "w") as f:
    json.dump(r, f)
os.chmod(path + ".new", 0o600)
os.rename(path + ".new", path)
EOF
new_addrs=() new_ports=()
for _ in 0 1; do
    start_memserver 12M 1M "${reg_args[@]}"
    new_addrs+=("$MEMSERVER_ADDR") new_ports+=("$MEMSERVER_PORT")
    wait_until 10 "registration of $MEMSERVER_ADDR" registered "$MEMSERVER_ADDR"
done
rm -f "$tmpdir/status" # (the last run's)
start_nbdkit second -- "${plugin_args[@]}" lease=60
for a in "${new_addrs[@]}"; do wait_until 10 "donor $a in use" donor_is "$a" ok; done
n=$(grep -c 'not reachable' "$NBDKIT_LOG" || true)
[[ $n == 1 ]] || fail "expected one line naming the unreachable recorded donors, got $n: $(grep 'not reachable' "$NBDKIT_LOG")"
grep -q 'warning: plugin: 19 memservers not reachable: ' "$NBDKIT_LOG" ||
    fail "no summary of the 19 unreachable donors: $(grep 'not reachable' "$NBDKIT_LOG")"

# ---- 3. A third donor registers; the writes need it ----
# 12 slabs each, replicas=2: the first 12 MiB fill both, the rest needs the third.
nbdsh_run -u "$NBDKIT_URI" -c '
import os
data = bytearray()
for i in range(8):
    chunk = os.urandom(1 << 20)
    h.pwrite(chunk, i << 20)
    data += chunk
open(os.environ["tmpdir"] + "/first8", "wb").write(data)
' || fail "writes to the first two donors failed"
start_memserver 32M 1M "${reg_args[@]}"
c_addr=$MEMSERVER_ADDR c_port=$MEMSERVER_PORT
wait_until 10 "registration of $c_addr" registered "$c_addr"
# (nbdkit used to abort here: the wait ends at once then.)
exited_or_in_use() { ! kill -0 "$NBDKIT_PID" 2>/dev/null || donor_is "$c_addr" ok; }
wait_until 20 "the runtime donor $c_addr in use" exited_or_in_use
kill -0 "$NBDKIT_PID" 2>/dev/null ||
    fail "nbdkit exited when $c_addr registered: $(tail -n 2 "$NBDKIT_LOG" | tr '\n' ' ')"
nbdsh_run -u "$NBDKIT_URI" -c '
import os
data = bytearray(open(os.environ["tmpdir"] + "/first8", "rb").read())
for i in range(8, 24):
    chunk = os.urandom(1 << 20)
    h.pwrite(chunk, i << 20)
    data += chunk
got = h.pread(24 << 20, 0)
assert got == bytes(data), "the bytes read back differ from those written"
' || fail "writes that need the runtime donor, or reading them back, failed"
c_used=$(ctl_get "$c_port" slabs_used)
((c_used >= 8)) || fail "the runtime donor $c_addr holds $c_used slabs: the writes did not need it"
kill -0 "$NBDKIT_PID" 2>/dev/null || fail "nbdkit exited"
grep -q 'terminate called' "$NBDKIT_LOG" && fail "nbdkit aborted: $(grep -A1 'terminate called' "$NBDKIT_LOG")"
"$PYTHON" - "${holders[0]}" "$c_addr" "${dead[@]}" <<'EOF' || fail "the holders record lost a donor"
import json, sys
donors = json.load(open(sys.argv[1]))["donors"]
missing = [d for d in sys.argv[2:] if d not in donors]
assert not missing, "not in the record %s: %s" % (donors, missing)
assert donors == sorted(donors), donors
EOF
log "runtime donor $c_addr holds $c_used slabs; 24 MiB read back; the record keeps the dead donors"
stop_nbdkit_clean

# ---- 4. lease=0: the donors not contacted leave the record ----
rm -f "$tmpdir/status"
# (-v: the drop is an info line.)
start_nbdkit third -v -- "${plugin_args[@]}" lease=0
# (A full donor may be outside the donor set: connected for the slabs it holds.)
in_use() { donor_is "$1" ok || donor_is "$1" outside; }
for a in "${new_addrs[@]}" "$c_addr"; do wait_until 10 "donor $a in use" in_use "$a"; done
grep -q 'the holders record drops 19 donor(s) not contacted now (lease=0' "$NBDKIT_LOG" ||
    fail "the 19 dead donors were not dropped from the record: $(grep 'holders' "$NBDKIT_LOG")"
"$PYTHON" - "${holders[0]}" "${new_addrs[@]}" "$c_addr" <<'EOF' || fail "the record is not bounded"
import json, sys
donors = json.load(open(sys.argv[1]))["donors"]
assert sorted(donors) == sorted(sys.argv[2:]), "the record names %s, expected %s" % (donors, sys.argv[2:])
EOF
stop_nbdkit_clean
log "lease=0 restart: the record names the 3 live donors only"
log "PASS"
