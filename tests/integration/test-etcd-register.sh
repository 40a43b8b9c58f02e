#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A memserver with --etcd registers itself in a real 3-member etcd (loopback): the key holds its
# address, slab counts and a boot id; the free slabs it publishes drop after a client allocates,
# a change of one slab is published too (5 s after the last put at most); the sessions it
# publishes follow a client's session (1 while it is open, 0 once it left);
# kill -9 removes the key within the lease's TTL + 1 s, SIGTERM at once; with 2 of 3 members down
# (no quorum) and with all down at its start, it serves on and registers once etcd is back.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

# Bad option sets are refused at once (exit 2, with a message naming the option).
refused() {
    local what=$1 out rc=0
    shift
    out=$(timeout 10 "$MEMSERVER" --insecure --listen 127.0.0.1 --port 0 --capacity 1M --slab-size 1M "$@" 2>&1) || rc=$?
    [[ $rc == 2 && $out == *"$what"* ]] || fail "memserver $* exited $rc, not 2 naming $what: $out"
}
refused "--advertise" --etcd http://127.0.0.1:2379
refused "--advertise" --advertise 127.0.0.1:7471
refused "--etcd" --etcd 127.0.0.1:2379 --advertise 127.0.0.1:7471
refused "--etcd" --etcd http://127.0.0.1:2379,ftp://x:1 --advertise 127.0.0.1:7471
refused "--advertise" --etcd http://127.0.0.1:2379 --advertise 127.0.0.1
refused "--advertise" --etcd http://127.0.0.1:2379 --advertise ::1:7471
refused "--etcd-prefix" --etcd http://127.0.0.1:2379 --advertise 127.0.0.1:7471 --etcd-prefix ""

start_etcd_cluster 3
prefix=/rdmaswap-test/
ttl=10 # the memserver's lease TTL (memserver/registry.h)
ectl() { timeout 10 etcdctl --endpoints "$ETCD_ENDPOINTS" --dial-timeout=2s --command-timeout=3s "$@"; }
donor_key() { echo "${prefix}donors/$1"; }
# value ADDR: the registered JSON of the donor at ADDR (empty if there is none).
value() { ectl get --print-value-only "$(donor_key "$1")"; }
registered() { [[ -n $(value "$1") ]]; }
unregistered() { local v; v=$(value "$1") && [[ -z $v ]]; }
# field ADDR NAME: one field of the registered value.
field() {
    value "$1" | "$PYTHON" -c 'import json, sys; print(json.dumps(json.load(sys.stdin)[sys.argv[1]]))' "$2"
}
published_free() { [[ $(field "$1" slabs_free) == "$2" ]]; }
published_sessions() { [[ $(field "$1" sessions) == "$2" ]]; }
now() { date +%s.%N; }
elapsed() { "$PYTHON" -c 'import sys; print("%.2f" % (float(sys.argv[2]) - float(sys.argv[1])))' "$1" "$2"; }
etcd_args=(--etcd "$ETCD_ENDPOINTS" --advertise @ADDR@ --etcd-prefix "$prefix")
check="$RDMASWAP_BUILD/tests/integration/etcd-client-check"
[[ -x $check ]] || fail "not built: $check"

# 0. The client itself (common/net/etcd), with the first member's URL wrong (a dead port): a watch
# sees a put and a delete; a watch from a compacted revision is cancelled with the compaction's
# revision.
dead="http://127.0.0.1:$(free_port)"
timeout 30 "$check" "$dead,$ETCD_ENDPOINTS" watch "${prefix}watch/" || fail "etcd client: watch"
rev=$(ectl get -w json / | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["header"]["revision"])')
for i in 1 2 3; do ectl put "${prefix}watch2/x" "$i" >/dev/null; done
ectl compact $((rev + 3)) >/dev/null
timeout 30 "$check" "$ETCD_ENDPOINTS" compacted "${prefix}watch2/" $((rev + 1)) ||
    fail "etcd client: watch from a compacted revision"

# 1. Registration: the key under the prefix, read with etcdctl, with a lease.
start_memserver 64M 1M "${etcd_args[@]}"
a=$MEMSERVER_ADDR a_pid=$MEMSERVER_PID a_log=$MEMSERVER_LOG a_port=$MEMSERVER_PORT
wait_until 10 "registration of $a" registered "$a"
v=$(value "$a")
log "registered: $v"
listed=$(timeout 30 "$check" "$ETCD_ENDPOINTS" list "${prefix}donors/") || fail "etcd client: list"
[[ $listed == "$(donor_key "$a") $v" ]] || fail "etcd client lists '$listed', etcdctl reads '$v'"
[[ $(field "$a" addr) == "\"$a\"" ]] || fail "addr in $v is not $a"
[[ $(field "$a" slabs_total) == 64 ]] || fail "slabs_total in $v is not 64"
[[ $(field "$a" slabs_free) == 64 ]] || fail "slabs_free in $v is not 64"
[[ $(field "$a" slab_size) == $((1 << 20)) ]] || fail "slab_size in $v is not 1 MiB"
[[ $(field "$a" sessions) == 0 ]] || fail "sessions in $v is not 0"
[[ $(field "$a" transport) == '"tcp"' ]] || fail "transport in $v is not tcp"
[[ $(field "$a" auth) == true ]] || fail "auth in $v is not true"
[[ $(field "$a" boot_id) =~ ^\"[0-9a-f]{16}\"$ ]] || fail "boot_id in $v is not 16 hex digits"
a_boot=$(field "$a" boot_id)
lease=$(ectl get -w json "$(donor_key "$a")" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["kvs"][0].get("lease", 0))')
[[ $lease != 0 ]] || fail "the key of $a has no lease"
ttl_left=$(ectl lease timetolive "$(printf %x "$lease")" | sed -n 's/.*remaining(\([0-9-]*\)s).*/\1/p')
log "lease $(printf %x "$lease"): ${ttl_left}s left"
((ttl_left > 0 && ttl_left <= ttl)) || fail "lease TTL left is '$ttl_left', expected 1..$ttl"

# 2. A client opens a session: the published sessions is 1 (as STATS says) within 3 s (the
# registry re-puts at most every 2 s and looks every 0.5 s). It allocates 16 of the 64 slabs: the
# published slabs_free drops within a few seconds.
start_nbdkit a -- server="$a" size=32M timeout=5 lease=0
t0=$(now)
wait_until 4 "sessions of $a published as 1" published_sessions "$a" 1
log "sessions 0 -> 1 published after $(elapsed "$t0" "$(now)") s (after nbdkit was ready)"
[[ $(ctl_get "$a_port" sessions) == 1 ]] || fail "STATS of $a does not say sessions=1"
nbdsh_run -u "$NBDKIT_URI" -c '
import os
data = os.urandom(16 << 20)
h.pwrite(data, 0)
h.flush()
assert h.pread(16 << 20, 0) == data
'
t0=$(now)
wait_until 6 "slabs_free of $a published as 48" published_free "$a" 48
log "slabs_free 64 -> 48 published after $(elapsed "$t0" "$(now)") s (after the write)"
# One slab more (less than 5 % of 64): put once the last put is 5 s old, not never.
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"\x5a" * (1 << 20), 16 << 20); h.flush()'
t0=$(now)
wait_until 8 "slabs_free of $a published as 47 (a small change)" published_free "$a" 47
log "slabs_free 48 -> 47 published after $(elapsed "$t0" "$(now)") s (after the write)"
kill "$NBDKIT_PID"
wait "$NBDKIT_PID" 2>/dev/null || true
# The client left (lease=0: its session ended with its connection rather than staying detached,
# which would still count): sessions goes back to 0.
t0=$(now)
wait_until 4 "sessions of $a published as 0 after the client left" published_sessions "$a" 0
log "sessions 1 -> 0 published $(elapsed "$t0" "$(now)") s after nbdkit exited"
[[ $(ctl_get "$a_port" sessions) == 0 ]] || fail "STATS of $a does not say sessions=0"

# 3. SIGTERM: the key is gone when the process has exited (deregistered before it exits).
kill -TERM "$a_pid"
t0=$(now)
for ((i = 0; i < 100; i++)); do kill -0 "$a_pid" 2>/dev/null || break; sleep 0.05; done
kill -0 "$a_pid" 2>/dev/null && fail "memserver $a did not exit within 5 s of SIGTERM"
wait "$a_pid" 2>/dev/null || true
t1=$(now)
wait_until 1 "key of $a gone after SIGTERM" unregistered "$a"
log "SIGTERM: exit after $(elapsed "$t0" "$t1") s, key gone $(elapsed "$t1" "$(now)") s after the exit"
grep -q "etcd: deregistered" "$a_log" || fail "memserver $a did not log its deregistration"

# 4. kill -9: the key goes with the lease, within TTL + 1 s.
start_memserver 16M 1M "${etcd_args[@]}"
b=$MEMSERVER_ADDR
wait_until 10 "registration of $b" registered "$b"
# The time the key goes is taken from a watch (from the revision read now, so that it sees the
# delete even if it starts late), not from polling.
rev=$(ectl get -w json "$(donor_key "$b")" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["header"]["revision"])')
(
    timeout $((ttl + 10)) etcdctl --endpoints "$ETCD_ENDPOINTS" watch --rev=$((rev + 1)) "$(donor_key "$b")" |
        while read -r line; do [[ $line == DELETE ]] && { now; break; }; done
) >"$tmpdir/b-gone" &
watcher=$!
sleep 0.5
kill -KILL "$MEMSERVER_PID"
t0=$(now)
wait_until $((ttl + 5)) "key of $b gone after kill -9" unregistered "$b"
wait "$watcher" || true
[[ -s $tmpdir/b-gone ]] || fail "the watch did not see the key of $b deleted"
took=$(elapsed "$t0" "$(cat "$tmpdir/b-gone")")
log "kill -9: key of $b gone after $took s (TTL $ttl s)"
"$PYTHON" -c 'import sys; sys.exit(float(sys.argv[1]) > float(sys.argv[2]))' "$took" $((ttl + 1)) ||
    fail "the key of $b outlived kill -9 by $took s, more than TTL + 1 s"

# 5. Two of three members down (no quorum): the memserver serves on (status, I/O); once they are
# back it publishes again (slabs_free of the writes made meanwhile).
start_memserver 64M 1M "${etcd_args[@]}"
c=$MEMSERVER_ADDR c_port=$MEMSERVER_PORT c_log=$MEMSERVER_LOG
wait_until 10 "registration of $c" registered "$c"
c_boot=$(field "$c" boot_id)
[[ $c_boot != "$a_boot" ]] || fail "two memservers have the same boot id $c_boot"
stop_etcd_member 1
stop_etcd_member 2
wait_until 15 "memserver $c warns that etcd is away" grep -q "etcd: cannot register" "$c_log"
ctl_get "$c_port" slabs_total >/dev/null
start_nbdkit c -- server="$c" size=32M timeout=5
nbdsh_run -u "$NBDKIT_URI" -c '
import os
data = os.urandom(8 << 20)
h.pwrite(data, 0)
h.flush()
assert h.pread(8 << 20, 0) == data
'
[[ $(ctl_get "$c_port" slabs_free) == 56 ]] || fail "memserver $c did not grant 8 slabs without etcd"
log "2 of 3 etcd members down: memserver $c served status and I/O"
kill "$NBDKIT_PID"
wait "$NBDKIT_PID" 2>/dev/null || true
start_etcd_member 1
start_etcd_member 2
wait_etcd_healthy 30 "${ETCD_CLIENT_URLS[@]}"
t0=$(now)
wait_until 15 "memserver $c publishes again after the outage" published_free "$c" 56
log "etcd back: $c published slabs_free=56 after $(elapsed "$t0" "$(now)") s"
[[ $(field "$c" boot_id) == "$c_boot" ]] || fail "boot id of $c changed without a restart"
[[ $(grep -c "etcd: cannot register" "$c_log") == 1 ]] || fail "more than one warning for one outage"
grep -Eq "etcd: (registered|reachable again)" "$c_log" || fail "no info line when etcd came back"

# 6. Every member down when a memserver starts: it serves, and registers once etcd is up.
for i in 0 1 2; do stop_etcd_member "$i"; done
start_memserver 16M 1M "${etcd_args[@]}"
d=$MEMSERVER_ADDR d_port=$MEMSERVER_PORT d_log=$MEMSERVER_LOG
ctl_get "$d_port" slabs_total >/dev/null
wait_until 10 "memserver $d warns that etcd is away" grep -q "etcd: cannot register" "$d_log"
for i in 0 1 2; do start_etcd_member "$i"; done
wait_etcd_healthy 30 "${ETCD_CLIENT_URLS[@]}"
t0=$(now)
wait_until 15 "registration of $d once etcd is up" registered "$d"
log "etcd started: $d registered after $(elapsed "$t0" "$(now)") s"
ctl_get "$d_port" slabs_total >/dev/null
log "PASS"
