#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Bad configuration makes nbdkit fail at startup, quickly, with a message that names the problem:
# an unknown key, a missing size, a bad size, a size too large, a bad transport, no server, an
# unreachable server.
# (Authentication mistakes: test-auth.sh.)
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_build memserver plugin ctl

# A live memserver, so that every case except "unreachable" has a good server= and fails for its
# own reason only.
start_memserver 16M 1M
good="server=$MEMSERVER_ADDR"

# A port nobody listens on: bound, never listening, kept bound so nobody else takes it meanwhile.
"$PYTHON" -c '
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
open(sys.argv[1] + ".tmp", "w").write("%d\n" % s.getsockname()[1])
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)' "$tmpdir/deadport" &
cleanup_pid $!
wait_until 10 "dead port reserved" test -s "$tmpdir/deadport"
deadport=$(cat "$tmpdir/deadport")

n=0
# expect_fail REGEX PLUGIN_ARGS...: nbdkit must exit non-zero within 20 s and print REGEX (grep -Ei)
# on stderr (PLUGIN_ARGS get auth-key=$AUTH_KEY unless they choose otherwise). With -f and no --run, a server that does not fail would run until timeout kills it.
expect_fail() {
    local regex=$1 rc=0 start
    shift
    n=$((n + 1))
    local err="$tmpdir/bad-$n.err"
    start=$SECONDS
    has_auth_arg "$@" || set -- "$@" auth-key="$AUTH_KEY"
    timeout 20 nbdkit -f -U "$tmpdir/bad-$n.sock" "$PLUGIN" "$@" </dev/null >/dev/null 2>"$err" || rc=$?
    log "case $n: nbdkit rdmaswap $* -> exit $rc after $((SECONDS - start))s: $(tr '\n' ' ' <"$err")"
    [[ $rc -ne 124 ]] || fail "nbdkit rdmaswap $* did not fail within 20 s (still serving)"
    [[ $rc -ne 0 ]] || fail "nbdkit rdmaswap $* exited 0"
    [[ $rc -lt 128 ]] || fail "nbdkit rdmaswap $* died of a signal (exit $rc): $(cat "$err")"
    grep -Eqi -- "$regex" "$err" || fail "nbdkit rdmaswap $* failed without a message matching /$regex/: $(cat "$err")"
}

# The control case: the good configuration starts (otherwise every case below proves nothing).
start_nbdkit good -- "$good" size=16M
timeout 20 nbdinfo --size "$NBDKIT_URI" | grep -qx 16777216 || fail "good configuration does not serve 16M"

# realtime= (default 1): with CAP_SYS_NICE every thread nbdkit serves with is SCHED_RR (policy,
# field 41 of stat, is 2; $40 once "pid (comm) " is cut to "pid ")
capeff=$(awk '$1 == "CapEff:" { print $2 }' /proc/self/status)
if (((0x${capeff:-0} >> 23) & 1)); then # CAP_SYS_NICE
    policies=$(for st in /proc/"$NBDKIT_PID"/task/*/stat; do
        sed 's/^\([0-9]*\) .*) /\1 /' "$st" | awk '{ print $40 }'; done | sort | uniq -c | tr '\n' ' ')
    log "nbdkit thread policies (count policy): $policies"
    # (Under ThreadSanitizer one thread may not be: its own background thread, which it starts
    # at the process's first pthread_create, the start-up probes' in get_ready, before
    # after_fork sets the priority that later threads inherit.)
    if [[ ${RDMASWAP_SANITIZER:-} == thread ]]; then
        [[ $policies =~ ^(\ *1\ 0)?\ *[0-9]+\ 2\ $ ]] ||
            fail "realtime=1 (default): nbdkit threads not all SCHED_RR (TSan's aside): $policies"
    else
        [[ $policies =~ ^\ *[0-9]+\ 2\ $ ]] || fail "realtime=1 (default): nbdkit threads not all SCHED_RR: $policies"
    fi
else
    log "no CAP_SYS_NICE: realtime=1 cannot take effect here, not checked"
fi

# busy-poll= is decided once at start and logged (nbdkit -v); with it on, the data still flows.
start_nbdkit spin -v -- "$good" size=16M volume=spin busy-poll=on
# (Logged by after_fork, which may still run when the socket and pid file exist.)
wait_until 10 "busy-poll=on: the choice logged" grep -q 'busy-poll=on: on' "$NBDKIT_LOG"
nbdsh_run -u "$NBDKIT_URI" -c 'b = bytes(range(256)) * 1024; h.pwrite(b, 4096); assert h.pread(len(b), 4096) == b'

expect_fail 'bogus'                 "$good" size=16M bogus=1
expect_fail 'realtime'              "$good" size=16M realtime=100
expect_fail 'realtime'              "$good" size=16M realtime=high
expect_fail 'busy-poll'             "$good" size=16M busy-poll=sometimes
expect_fail 'size'                  "$good"
expect_fail 'size'                  "$good" size=banana
expect_fail 'size'                  "$good" size=-1M
# Beyond 2^20 slabs (here 1 MiB ones): refused with the maximum, not a bare std::bad_alloc.
expect_fail 'size=1125899906842624 is too large.*maximum size is 1 TiB' "$good" size=1P
expect_fail 'transport'             "$good" size=16M transport=carrier-pigeon
expect_fail 'server'                size=16M
expect_fail 'server|port|address'   "server=127.0.0.1:notaport" size=16M
# Unreachable: the message names the address and says it could not connect.
expect_fail "127\.0\.0\.1:$deadport" "server=127.0.0.1:$deadport" size=16M
grep -Eqi 'connect|refused|unreachable' "$tmpdir/bad-$n.err" ||
    fail "unreachable server: message does not say it could not connect: $(cat "$tmpdir/bad-$n.err")"
