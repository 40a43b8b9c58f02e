#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# After the memserver is killed (SIGKILL), reads of data it held fail with EIO (not stale data, not
# zeros) within a bounded time, writes fail too, and nbdkit itself survives. Data must never
# silently come back as zeros.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

start_memserver 16M 1M
# timeout=5: the contract bounds a hang by the plugin's timeout (default 10 s).
start_nbdkit killed -- server="$MEMSERVER_ADDR" size=16M timeout=5

export memserver_pid="$MEMSERVER_PID"
NBDSH_TIMEOUT=60 nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import errno, os, signal, sys, time
slab = 1 << 20
data = os.urandom(3 * slab)
h.pwrite(data, slab // 2)             # slabs 0-3
h.flush()
assert h.pread(len(data), slab // 2) == data, "read-back before the kill differs"

os.kill(int(os.environ["memserver_pid"]), signal.SIGKILL)
time.sleep(0.2)

def must_fail(what, fn, limit=30):
    t = time.monotonic()
    try:
        r = fn()
    except nbd.Error as e:
        took = time.monotonic() - t
        print("%s failed after %.1fs: %s (errno %s)" % (what, took, e.string, e.errnum))
        if took > limit:
            sys.exit("%s took %.1fs to fail, more than %ds" % (what, took, limit))
        if e.errnum != errno.EIO:
            sys.exit("%s failed with errno %s, expected EIO (%d)" % (what, e.errnum, errno.EIO))
        return
    took = time.monotonic() - t
    if isinstance(r, bytes):
        kind = "zeros" if not any(r) else ("the old data" if r in data else "other data")
        sys.exit("%s after the memserver was killed returned %s after %.1fs" % (what, kind, took))
    sys.exit("%s after the memserver was killed succeeded after %.1fs" % (what, took))

must_fail("pread 4K of written data", lambda: h.pread(4096, slab))
must_fail("pread 1M across slabs", lambda: h.pread(slab, slab // 2 + 12345))
must_fail("pwrite 4K", lambda: h.pwrite(os.urandom(4096), 2 * slab))
must_fail("pwrite + FUA", lambda: h.pwrite(os.urandom(4096), 0, nbd.CMD_FLAG_FUA))
# Asking again fails the same way (no late success from a half-dead state).
must_fail("pread again", lambda: h.pread(4096, slab))
PY

kill -0 "$NBDKIT_PID" 2>/dev/null || fail "nbdkit died when its memserver was killed"

# A new connection: either it is refused at open or its reads fail; it never reads zeros or data.
rc=0
NBDSH_TIMEOUT=40 nbdsh_run -c - <<PY >"$tmpdir/new.out" 2>&1 || rc=$?
import sys
try:
    h.connect_uri("$NBDKIT_URI")
except nbd.Error as e:
    print("new connection refused:", e.string)
    sys.exit(0)
try:
    r = h.pread(4096, 1 << 20)
except nbd.Error as e:
    print("new connection: pread failed:", e.string)
    sys.exit(0)
print("new connection: pread returned", "zeros" if not any(r) else "data")
sys.exit(3)
PY
cat "$tmpdir/new.out" >&2
[[ $rc -eq 0 ]] || fail "a new connection after the memserver died read without error (or hung): exit $rc"
kill -0 "$NBDKIT_PID" 2>/dev/null || fail "nbdkit died"
