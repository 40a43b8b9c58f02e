#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The plugin finds its memservers in etcd (etcd= only, no server=): two memservers register in a
# real 3-member etcd on loopback, nbdkit lists them (skipping a malformed entry), writes and
# verifies with replicas=2 on both, and caches the list; with 2 of 3 etcd members killed (no
# quorum), then all 3, a restarted nbdkit uses the cache, reattaches its volume and reads every
# byte back; with etcd down and no cache it refuses to start, saying why, unless a server= is
# given (then it uses that one alone). Bad etcd keys are refused at start.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_nbdsh
requires_build memserver plugin ctl

# 0. Bad etcd keys: nbdkit refuses them at start, naming the key (no network needed).
refused() {
    local what=$1 out rc=0
    shift
    out=$(timeout 20 nbdkit -f -U "$tmpdir/bad.sock" "$PLUGIN" size=16M auth-key="$AUTH_KEY" "$@" 2>&1) || rc=$?
    [[ $rc != 0 && $rc != 124 && $out == *"$what"* ]] ||
        fail "nbdkit rdmaswap $* exited $rc without a message naming '$what': $out"
}
refused "etcd=127.0.0.1:2379: " etcd=127.0.0.1:2379
refused "etcd=: " etcd=
refused "etcd=http://h:1,ftp://h:2: " etcd=http://h:1,ftp://h:2
refused "etcd-prefix= must not be empty" etcd=http://127.0.0.1:1 etcd-prefix=
refused "etcd-prefix= needs etcd=" server=127.0.0.1:1 etcd-prefix=/x/
refused "donor-cache= needs etcd=" server=127.0.0.1:1 donor-cache="$tmpdir/x.donors"
refused "server=HOST[:PORT] or etcd=URL" replicas=1

start_etcd_cluster 3
prefix=/rdmaswap-plugin-test/
ectl() { timeout 10 etcdctl --endpoints "$ETCD_ENDPOINTS" --dial-timeout=2s --command-timeout=3s "$@"; }
registered() { [[ -n $(ectl get --print-value-only "${prefix}donors/$1") ]]; }

ports=() addrs=()
for i in 0 1; do
    start_memserver 64M 1M --etcd "$ETCD_ENDPOINTS" --advertise @ADDR@ --etcd-prefix "$prefix"
    ports+=("$MEMSERVER_PORT") addrs+=("$MEMSERVER_ADDR")
    wait_until 10 "registration of $MEMSERVER_ADDR" registered "$MEMSERVER_ADDR"
done
# An entry that is not a donor's: skipped with a warning naming its key (one warning for all
# the entries ignored), not fatal.
bad_key="${prefix}donors/junk:1"
ectl put "$bad_key" 'not json' >/dev/null
# A donor of another prefix (another cluster): never listed (the count below would be 3).
ectl put /rdmaswap-other/donors/127.0.0.1:1 \
    '{"addr":"127.0.0.1:1","boot_id":"0000000000000001","transport":"tcp","slab_size":1048576,"slabs_total":1,"slabs_free":1,"auth":true}' >/dev/null

plugin_args=(etcd="$ETCD_ENDPOINTS" etcd-prefix="$prefix" size=24M replicas=2 lease=60 timeout=5)
fio_args=(--ioengine=nbd --rw=randwrite --bssplit=4k/50:128k/50 --iodepth=8 --numjobs=3
          --size=8M --offset_increment=8M --verify=crc32c --verify_fatal=1
          --verify_state_save=0 --output-format=json)
seed=11

# 1. etcd= only: both registered donors are found and used.
start_nbdkit first -v -- "${plugin_args[@]}"
grep -q "etcd gave 2 donor(s) under ${prefix}donors/" "$NBDKIT_LOG" ||
    fail "nbdkit did not log that etcd gave 2 donors"
grep -q "warning: discovery: etcd: ${prefix}donors/: 1 entry ignored (1 malformed), e.g. $bad_key: " "$NBDKIT_LOG" ||
    fail "nbdkit did not warn about the malformed entry $bad_key"
timeout 60 fio --name=write --do_verify=1 "${fio_args[@]}" --uri="$NBDKIT_URI" --randseed=$seed \
    >"$tmpdir/fio1.json" || { cat "$tmpdir/fio1.json" >&2; fail "fio write+verify failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio1.json" $((24 << 20)) $((24 << 20)) ||
    fail "fio write+verify: see above"
used=()
for p in "${ports[@]}"; do used+=("$(ctl_get "$p" slabs_used)"); done
log "slabs used after the write: ${used[*]} (24 chunks, replicas=2)"
[[ ${used[0]} == 24 && ${used[1]} == 24 ]] ||
    fail "expected 24 slabs on each of the 2 donors etcd gave, found ${used[*]}"

# 2. The cache: one file beside the volume key, mode 0600, naming both donors.
caches=("$STATE_DIRECTORY"/*.donors)
[[ ${#caches[@]} == 1 && -f ${caches[0]} ]] || fail "expected one donor cache in $STATE_DIRECTORY: ${caches[*]}"
cache=${caches[0]}
[[ $(stat -c %a "$cache") == 600 ]] || fail "the donor cache $cache has mode $(stat -c %a "$cache")"
"$PYTHON" - "$cache" "$prefix" "${addrs[@]}" <<'EOF' || fail "the donor cache $cache is not as expected: $(cat "$cache")"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["version"] == 1 and c["prefix"] == sys.argv[2], c
assert sorted(c["donors"]) == sorted(sys.argv[3:]), c
EOF
log "donor cache $(basename "$cache"): $(cat "$cache")"

# 3. A clean stop (the lease keeps the slabs), etcd without a quorum (2 of 3 members killed),
# then with every member killed, and each time a restart with the same etcd=: it reads the
# cache, reattaches, and every byte reads back right.
restart_from_cache() {
    local name=$1
    kill -TERM "$NBDKIT_PID"
    wait "$NBDKIT_PID" 2>/dev/null || true
    local t0 t1
    t0=$(date +%s.%N)
    start_nbdkit "$name" -- "${plugin_args[@]}"
    t1=$(date +%s.%N)
    log "nbdkit $name serving $("$PYTHON" -c 'import sys; print("%.2f" % (float(sys.argv[2]) - float(sys.argv[1])))' "$t0" "$t1") s after its start"
    grep -q "warning: discovery: etcd is not reachable (.*): using the 2 donor(s) of the cache $cache" \
        "$NBDKIT_LOG" || fail "nbdkit $name did not say that it used the cache $cache"
    timeout 60 fio --name=verify --verify_only "${fio_args[@]}" --uri="$NBDKIT_URI" --randseed=$seed \
        >"$tmpdir/fio-$name.json" || { cat "$tmpdir/fio-$name.json" >&2; fail "fio verify in nbdkit $name failed"; }
    "$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio-$name.json" $((24 << 20)) ||
        fail "fio verify in nbdkit $name: see above"
    for i in 0 1; do
        [[ $(ctl_get "${ports[i]}" slabs_used) == 24 ]] ||
            fail "memserver ${addrs[i]} holds $(ctl_get "${ports[i]}" slabs_used) slabs after nbdkit $name reattached, not the same 24"
    done
}
stop_etcd_member 1
stop_etcd_member 2
ectl get --prefix "$prefix" >/dev/null 2>&1 && fail "etcd still answers reads without a quorum"
restart_from_cache second
log "2 of 3 etcd members down: the restarted nbdkit used the cache, reattached and verified 24 MiB"
stop_etcd_member 0
ectl get --prefix "$prefix" >/dev/null 2>&1 && fail "etcd still answers after every member was killed"
restart_from_cache third
log "every etcd member down: the restarted nbdkit used the cache, reattached and verified 24 MiB"
kill -TERM "$NBDKIT_PID"
wait "$NBDKIT_PID" 2>/dev/null || true

# 4. etcd down and no cache (another cache path) and no server=: a clear error at start ...
rc=0
out=$(timeout 30 nbdkit -f -U "$tmpdir/fourth.sock" "$PLUGIN" "${plugin_args[@]}" \
    donor-cache="$tmpdir/none.donors" auth-key="$AUTH_KEY" 2>&1) || rc=$?
[[ $rc != 0 && $rc != 124 ]] || fail "nbdkit with etcd down and no cache exited $rc: $out"
[[ $out == *"etcd is not reachable"*"$tmpdir/none.donors: there is none"*"no memserver to use"* ]] ||
    fail "nbdkit with etcd down and no cache did not say why: $out"
log "etcd down, no cache: refused with: $(grep -o 'rdmaswap: etcd is not reachable.*' <<<"$out")"
# ... but with a server= as well it starts on that one alone, saying so.
start_nbdkit fifth -- etcd="$ETCD_ENDPOINTS" etcd-prefix="$prefix" server="${addrs[0]}" size=4M \
    replicas=1 lease=0 timeout=5 donor-cache="$tmpdir/none.donors"
grep -q "warning: discovery: etcd is not reachable (.*) and there is no usable donor cache ($tmpdir/none.donors: there is none): using the server= entries only" \
    "$NBDKIT_LOG" || fail "nbdkit with etcd down, no cache and a server= did not say it uses server= only"
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"x" * 4096, 0); assert h.pread(4096, 0) == b"x" * 4096'
log "PASS"
