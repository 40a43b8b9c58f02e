#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# No exception reaches std::terminate (issue 29; docs/architecture.md, "Exception boundaries"),
# proved with the plugin's test hook RDMASWAP_TEST_THROW=write,membership: the first write
# request throws inside its callback, and the first three steps of the membership thread throw.
# The write fails with EIO and the next ones succeed; the membership thread logs one error and
# carries on (a donor down at start joins once it answers); nbdkit never aborts, every byte
# reads back, and SIGTERM still ends it cleanly. Then RDMASWAP_TEST_THROW=start fails the start
# once the volume's and the membership's threads run: nbdkit exits 1, never of a signal (S11).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

status() { cat "$tmpdir/status" 2>/dev/null; }
donor_is() { status | grep -q "^donor\.[0-9]*=$1 state=$2 "; }

start_memserver 32M 1M
a_addr=$MEMSERVER_ADDR
b_port=$(free_port)
RDMASWAP_TEST_THROW=write,membership start_nbdkit boundary -- server="$a_addr" \
    server="127.0.0.1:$b_port" size=8M replicas=1 lease=0 timeout=5 statusfile="$tmpdir/status"

# ---- A callback that throws: that request fails with EIO, the next ones succeed ----
nbdsh_run -u "$NBDKIT_URI" -c '
import errno, os
try:
    h.pwrite(b"\x01" * 4096, 0)
    raise SystemExit("the first write succeeded: the test hook did not throw")
except nbd.Error as e:
    # (libnbd gives the errno by name)
    assert e.errno in ("EIO", errno.EIO), "the first write failed with %r, not EIO" % (e.errno,)
data = os.urandom(2 << 20)
h.pwrite(data, 1 << 20)
assert h.pread(2 << 20, 1 << 20) == data, "the bytes read back differ"
' || fail "the write that threw, or the writes after it, did not behave"
grep -q 'rdmaswap: pwrite: test fault (RDMASWAP_TEST_THROW=write)' "$NBDKIT_LOG" ||
    fail "the write callback's exception was not logged"

# ---- The membership thread that throws: one error line, and it carries on ----
wait_until 20 "the membership thread's failure logged" grep -q 'a membership step failed' "$NBDKIT_LOG"
MEMSERVER_FIXED_PORT=$b_port start_memserver 32M 1M
wait_until 30 "the donor down at start (127.0.0.1:$b_port) added after the steps that threw" \
    donor_is "127.0.0.1:$b_port" ok
n=$(grep -c 'a membership step failed' "$NBDKIT_LOG" || true)
[[ $n == 1 ]] || fail "the membership thread's failures were logged $n times, expected once"
grep -q 'error: membership: a membership step failed: test fault' "$NBDKIT_LOG" ||
    fail "the failure was not logged as an error: $(grep 'membership step failed' "$NBDKIT_LOG")"

grep -q 'terminate called' "$NBDKIT_LOG" && fail "nbdkit aborted: $(grep -A1 'terminate called' "$NBDKIT_LOG")"
kill -0 "$NBDKIT_PID" 2>/dev/null || fail "nbdkit exited"
kill -TERM "$NBDKIT_PID"
rc=0
wait "$NBDKIT_PID" || rc=$?
[[ $rc == 0 ]] || fail "nbdkit exited with $rc after SIGTERM"
log "a write that threw failed with EIO; 3 membership steps that threw logged once; nbdkit served on"

# ---- A start-up that fails once the volume's threads run (S11): a clean exit 1, no crash ----
# (RDMASWAP_TEST_THROW=start throws at the end of after_fork; before the fix the threads ran on
# while exit() tore the globals and OpenSSL down, and nbdkit died of a signal.)
start_log=$tmpdir/nbdkit-start.log
rc=0
for i in 1 2 3; do
    RDMASWAP_TEST_THROW=start timeout 30 nbdkit -f -U "$tmpdir/start-$i.sock" "$PLUGIN" \
        server="$a_addr" size=8M replicas=1 lease=0 timeout=5 auth-key="$AUTH_KEY" </dev/null >"$start_log" 2>&1 || rc=$?
    [[ $rc == 1 ]] || fail "a failed start exited with $rc, not 1: $(tail -n 5 "$start_log")"
    grep -q 'test fault (RDMASWAP_TEST_THROW=start)' "$start_log" ||
        fail "the start's failure was not logged: $(tail -n 5 "$start_log")"
    grep -qE 'terminate called|Segmentation|Aborted|sanitizer' "$start_log" &&
        fail "a failed start crashed: $(tail -n 5 "$start_log")"
done
log "a start that failed after its threads started exited 1, 3 of 3, no crash"
log "PASS"
