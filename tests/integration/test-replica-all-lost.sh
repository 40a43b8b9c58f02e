#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Three memservers, replicas=2; two are killed at once. Slabs whose both copies were on them
# must fail with EIO; every other slab still reads exactly what was written. Never zeros or
# other data.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

ports=() pids=()
for _ in 1 2 3; do
	start_memserver 64M 1M
	ports+=("$MEMSERVER_PORT") pids+=("$MEMSERVER_PID")
done
start_nbdkit lost -- server=127.0.0.1:${ports[0]} server=127.0.0.1:${ports[1]} \
	server=127.0.0.1:${ports[2]} size=32M replicas=2 timeout=3
export victims="${pids[0]} ${pids[1]}"
NBDSH_TIMEOUT=100 nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import errno, os, signal, sys
slab = 1 << 20
data = {i: os.urandom(slab) for i in range(32)}
for i, d in data.items():
    h.pwrite(d, i * slab)
for pid in os.environ["victims"].split():
    os.kill(int(pid), signal.SIGKILL)
ok = lost = 0
for i, d in data.items():
    try:
        got = h.pread(slab, i * slab)
    except nbd.Error as e:
        if e.errnum != errno.EIO:
            sys.exit("slab %d: errno %s, expected EIO" % (i, e.errnum))
        lost += 1
        continue
    if got != d:
        sys.exit("slab %d read back different bytes (zeros: %s)" % (i, got == bytes(slab)))
    ok += 1
print("slabs intact: %d, failing with EIO: %d" % (ok, lost))
if ok == 0 or lost == 0:
    sys.exit("expected both intact and lost slabs (placement spreads pairs over 3 donors)")
# A lost slab stays an error (not zeros) on a second read, and writing to it fails too.
for i in range(32):
    try:
        h.pread(4096, i * slab)
    except nbd.Error:
        try:
            h.pwrite(b"x" * 4096, i * slab)
        except nbd.Error as e:
            assert e.errnum == errno.EIO
            break
        sys.exit("a write to a slab with no replica left succeeded")
PY
