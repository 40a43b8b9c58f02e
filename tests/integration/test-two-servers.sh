#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One device over two memservers with replicas=1: slabs are spread over both and every byte reads
# back. When one memserver is killed, slabs it held fail with EIO while slabs on the other still read
# their data (never zeros or wrong data), and new slabs are placed on the survivor.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

start_memserver 8M 1M
a_port=$MEMSERVER_PORT
start_memserver 8M 1M
b_pid=$MEMSERVER_PID b_port=$MEMSERVER_PORT
# replicas=1: each slab on exactly one of them (striping; replication has its own tests).
start_nbdkit two -- server="127.0.0.1:$a_port" server="127.0.0.1:$b_port" size=16M timeout=5 replicas=1

export a_port b_port b_pid ctl="$RDMASWAPCTL"
NBDSH_TIMEOUT=55 nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import errno, os, signal, subprocess, sys, time
slab = 1 << 20
def used(port):
    out = subprocess.run([os.environ["ctl"], "status", "server=127.0.0.1:" + port,
                         "auth-key=" + os.environ["AUTH_KEY"]],
                         check=True, capture_output=True, text=True, timeout=10).stdout
    return int(next(l.split("=", 1)[1] for l in out.splitlines() if l.startswith("slabs_used=")))

# 12 of the 16 slabs, in one request per slab, unaligned edges inside each slab.
data = {i: os.urandom(slab - 100) for i in range(12)}
for i, d in data.items():
    h.pwrite(d, i * slab + 50)
h.flush()
ua, ub = used(os.environ["a_port"]), used(os.environ["b_port"])
print("slabs used: a=%d b=%d" % (ua, ub))
if ua + ub != 12:
    sys.exit("the memservers hold %d slabs, expected 12" % (ua + ub))
if ua == 0 or ub == 0:
    sys.exit("all slabs went to one memserver")
for i, d in data.items():
    if h.pread(slab, i * slab) != bytes(50) + d + bytes(50):
        sys.exit("slab %d does not read back" % i)

os.kill(int(os.environ["b_pid"]), signal.SIGKILL)
time.sleep(0.5)
ok, failed = [], []
for i, d in data.items():
    t = time.monotonic()
    try:
        got = h.pread(slab - 100, i * slab + 50)
    except nbd.Error as e:
        if e.errnum != errno.EIO:
            sys.exit("slab %d: errno %s, expected EIO" % (i, e.errnum))
        failed.append(i)
        continue
    finally:
        if time.monotonic() - t > 15:
            sys.exit("slab %d: pread took %.1fs" % (i, time.monotonic() - t))
    if got != d:
        sys.exit("slab %d read %s after the other memserver died"
                 % (i, "zeros" if not any(got) else "wrong data"))
    ok.append(i)
print("after killing b: readable slabs %s, EIO slabs %s" % (ok, failed))
if len(ok) != ua or len(failed) != ub:
    sys.exit("expected %d readable and %d failing slabs" % (ua, ub))

# Writes to a surviving slab work; a new slab goes to the survivor.
h.pwrite(b"s" * 4096, ok[0] * slab)
assert h.pread(4096, ok[0] * slab) == b"s" * 4096
before = used(os.environ["a_port"])
if before < 8:
    h.pwrite(b"n" * 4096, 13 * slab)
    h.flush()
    assert h.pread(4096, 13 * slab) == b"n" * 4096, "new slab does not read back"
    assert used(os.environ["a_port"]) == before + 1, "new slab not placed on the surviving memserver"
PY
