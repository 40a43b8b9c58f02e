#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 29: the holders record ages out a donor that is gone, with lease > 0 (with lease=0 it is
# dropped at once: test-etcd-restarts.sh). The operator's sequence with a real etcd on loopback:
# 1. nbdkit (etcd=, the default volume key, lease=3) uses donors A and B and stops cleanly.
# 2. A is gone. A restart cannot reach it: the record keeps it (it may hold slabs of the last
#    run until its lease ends), with the time the start found it unreachable. A comes back
#    while nbdkit runs and is connected: the record no longer says it is unreachable. Then A
#    is gone for good.
# 3. A record of the format before issue 29 (no times) is read as "unreachable since now": a
#    restart keeps A, with a new time.
# 4. A restart once A has been unreachable for longer than the lease: the record no longer
#    names it (and says so in one info line); B stays.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires etcdctl version
requires_build memserver plugin ctl

start_etcd_cluster 1
prefix=/rdmaswap-aging-test/
lease=3
ectl() { timeout 10 etcdctl --endpoints "$ETCD_ENDPOINTS" --dial-timeout=2s --command-timeout=5s "$@"; }
registered() { [[ -n $(ectl get --print-value-only "${prefix}donors/$1") ]]; }
unregistered() { ! registered "$1"; }
reg_args=(--etcd "$ETCD_ENDPOINTS" --advertise @ADDR@ --etcd-prefix "$prefix")
plugin_args=(etcd="$ETCD_ENDPOINTS" etcd-prefix="$prefix" size=8M replicas=1 timeout=5
             lease=$lease)
# record FIELD...: print the record's donors, or (with "since") its unreachable times, as
# NAME=T lines.
record() {
    "$PYTHON" - "${holders[0]}" "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
if sys.argv[2] == "donors":
    print("\n".join(r["donors"]))
else:
    for k, v in sorted(r.get("unreachable_since", {}).items()):
        print("%s=%d" % (k, v))
EOF
}
# (Through a variable: grep -q leaving early would fail the pipe under pipefail.)
in_record() { local d; d=$(record donors); grep -qx "$1" <<<"$d"; }
# start NAME [NBDKIT_ARGS...]: start_nbdkit, then wait until it serves (nbdkit makes its
# socket before the plugin's start is done: a SIGTERM before that fails the start).
start() {
    local name=$1
    shift
    start_nbdkit "$name" "$@" -- "${plugin_args[@]}"
    nbdsh_run -u "$NBDKIT_URI" -c 'h.get_size()' >/dev/null || fail "nbdkit $name does not serve"
}

# ---- 1. A and B serve a first run ----
start_memserver 16M 1M "${reg_args[@]}"
a_pid=$MEMSERVER_PID a_addr=$MEMSERVER_ADDR
start_memserver 16M 1M "${reg_args[@]}"
b_addr=$MEMSERVER_ADDR
for x in "$a_addr" "$b_addr"; do wait_until 10 "registration of $x" registered "$x"; done
start first
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"\x5a" * 65536, 0)' || fail "first write failed"
stop_nbdkit_clean
holders=("$STATE_DIRECTORY"/volume.key.*.holders)
[[ -f ${holders[0]} ]] || fail "no holders record beside the volume key in $STATE_DIRECTORY"
[[ $(record donors | sort) == $(printf '%s\n' "$a_addr" "$b_addr" | sort) ]] ||
    fail "the first run's record does not name A and B: $(record donors)"
[[ -z $(record since) ]] || fail "the first run's record has unreachable times: $(record since)"

# ---- 2. A is gone: a restart keeps it, with the time it found it unreachable ----
kill -TERM "$a_pid" # (a clean stop: it deregisters at once)
wait "$a_pid" || true
wait_until 10 "$a_addr unregistered" unregistered "$a_addr"
t2=$(date +%s)
start second
grep -q "warning: plugin: memserver $a_addr is not reachable" "$NBDKIT_LOG" ||
    fail "the restart did not say that the recorded donor A is not reachable"
in_record "$a_addr" || fail "A left the record within its lease: $(record donors)"
since=$(record since)
[[ $since =~ ^$a_addr=([0-9]+)$ ]] || fail "the record has no unreachable time for A alone: $since"
t_a=${BASH_REMATCH[1]}
((t_a >= t2 && t_a <= $(date +%s))) || fail "A's unreachable time $t_a is not this start's ($t2..)"
log "restart 1: A kept, unreachable since $t_a"
# A comes back while nbdkit runs and is connected (a member of the donor set): the record
# says first that it is reachable again (it may get slabs of this run).
MEMSERVER_FIXED_PORT=${a_addr##*:} start_memserver 16M 1M "${reg_args[@]}"
a_pid=$MEMSERVER_PID
no_time_for_a() { [[ -z $(record since) ]]; }
wait_until 30 "A connected at runtime, its unreachable time cleared" no_time_for_a
in_record "$a_addr" || fail "A left the record when it came back: $(record donors)"
stop_nbdkit_clean
kill -TERM "$a_pid" # (gone again, for good)
wait "$a_pid" || true
wait_until 10 "$a_addr unregistered" unregistered "$a_addr"

# ---- 3. A record of the old format: A unreachable since now ----
"$PYTHON" - "${holders[0]}" <<'EOF' || fail "cannot edit the holders record"
import json, os, sys
path = sys.argv[1]
r = json.load(open(path))
r.pop("unreachable_since", None)
with open(path + ".new", "w") as f:
    json.dump(r, f)
os.chmod(path + ".new", 0o600)
os.rename(path + ".new", path)
EOF
t3=$(date +%s)
start third
stop_nbdkit_clean
in_record "$a_addr" || fail "A left a record of the old format: $(record donors)"
[[ $(record since) =~ ^$a_addr=([0-9]+)$ ]] || fail "no unreachable time for A: $(record since)"
t_a=${BASH_REMATCH[1]}
((t_a >= t3)) || fail "an old-format record did not mean 'unreachable since now': $t_a < $t3"
log "restart 2 (old-format record): A kept, unreachable since $t_a"

# ---- 4. Past the lease: A leaves the record, B stays ----
while (($(date +%s) - t_a <= lease)); do sleep 0.2; done
start fourth -v # (-v: the drop is an info line)
stop_nbdkit_clean
grep -q "the holders record drops 1 donor(s) not contacted now (not reachable for longer than lease=$lease s" "$NBDKIT_LOG" ||
    fail "the restart past the lease did not drop A: $(grep holders "$NBDKIT_LOG")"
[[ $(record donors) == "$b_addr" ]] || fail "the record names $(record donors | tr '\n' ' '), expected $b_addr alone"
[[ -z $(record since) ]] || fail "unreachable times left: $(record since)"
grep -q 'terminate called' "$tmpdir"/nbdkit-*.log && fail "nbdkit aborted"
log "restart 3, $(($(date +%s) - t_a)) s after A's time (lease=$lease): A dropped, B kept"
log "PASS"
