#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The plugin under nbdkit's retry filter. A memserver that stalls for less than the retry budget
# turns into a delay instead of an error: a read and a write issued while it is stopped complete
# once it resumes, with the right bytes. A memserver that is gone for good still ends in EIO once
# the retries are used up (never zeros).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires nbdkit --filter=retry null --dump-plugin
requires_nbdsh
requires_build memserver plugin ctl

start_memserver 16M 1M
start_nbdkit retry --filter=retry -- server="$MEMSERVER_ADDR" size=16M timeout=2 \
    retries=6 retry-delay=1 retry-exponential=no

export memserver_pid="$MEMSERVER_PID"
NBDSH_TIMEOUT=60 nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import os, signal, sys, threading, time
sys.path.insert(0, os.environ["RDMASWAP_SOURCE"] + "/tests/integration/helpers")
import sigstop
slab = 1 << 20
pid = int(os.environ["memserver_pid"])
data = os.urandom(2 * slab)
h.pwrite(data, 0)
h.flush()

sigstop.stop(pid)
# Resume the memserver after 4 s: longer than timeout=2, shorter than the retry budget (6 x 1 s
# plus the reconnects).
timer = threading.Timer(4.0, lambda: os.kill(pid, signal.SIGCONT))
timer.start()
try:
    t = time.monotonic()
    got = h.pread(64 * 1024, slab - 32 * 1024)
    took = time.monotonic() - t
finally:
    timer.join()
    os.kill(pid, signal.SIGCONT)
if got != data[slab - 32 * 1024:slab + 32 * 1024]:
    sys.exit("read through the retry filter returned wrong bytes")
print("read during a 4 s stall completed after %.1f s" % took)
if took < 3:
    sys.exit("the read did not wait for the stall (%.1f s): was the memserver stopped?" % took)

sigstop.stop(pid)
timer = threading.Timer(4.0, lambda: os.kill(pid, signal.SIGCONT))
timer.start()
new = os.urandom(128 * 1024)
try:
    h.pwrite(new, slab + 4096)
finally:
    timer.join()
    os.kill(pid, signal.SIGCONT)
h.flush()
if h.pread(len(new), slab + 4096) != new:
    sys.exit("write retried through a stall does not read back")
if h.pread(4096, 0) != data[:4096]:
    sys.exit("data before the stall changed")
print("write during a 4 s stall completed and reads back")
PY

# Gone for good: the retries run out and the read fails with EIO.
kill -KILL "$MEMSERVER_PID"
NBDSH_TIMEOUT=60 nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import errno, sys, time
t = time.monotonic()
try:
    h.pread(4096, 0)
except nbd.Error as e:
    print("after the memserver died: %s after %.1f s" % (e.string, time.monotonic() - t))
    if e.errnum != errno.EIO:
        sys.exit("errno %s, expected EIO" % e.errnum)
else:
    sys.exit("read succeeded with the only memserver dead")
PY
