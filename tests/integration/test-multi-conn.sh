#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two connections to one nbdkit: what one writes and flushes, the other reads (both ways, same
# slab and across slabs); and two concurrent writer processes on disjoint ranges, checked from a
# third connection. The plugin advertises multi-conn, so this consistency is what it promises.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

start_memserver 32M 1M
start_nbdkit mc -- server="$MEMSERVER_ADDR" size=32M

NBDSH_TIMEOUT=50 nbdsh_run -c - <<PY
import os, random, sys
uri = "$NBDKIT_URI"
h1 = nbd.NBD(); h1.connect_uri(uri)
h2 = nbd.NBD(); h2.connect_uri(uri)
assert h1.can_multi_conn(), "plugin does not advertise multi-conn"
rng = random.Random(3)
slab = 1 << 20
for i in range(200):
    a, b = (h1, h2) if i % 2 == 0 else (h2, h1)
    n = rng.choice([1, 4096, 32768, 131072, slab + 3])
    off = rng.randrange(32 * slab - n)
    data = rng.randbytes(n)
    a.pwrite(data, off)
    a.flush()
    got = b.pread(n, off)
    if got != data:
        sys.exit("round %d: write of %d bytes at %d on one connection not seen by the other" % (i, n, off))
# Same slab, interleaved small writes from both, then both read the whole slab.
want = bytearray(h1.pread(slab, 5 * slab))
for i in range(64):
    a = h1 if i % 2 else h2
    d = rng.randbytes(512)
    a.pwrite(d, 5 * slab + i * 1000)
    want[i * 1000:i * 1000 + 512] = d
h1.flush(); h2.flush()
assert h1.pread(slab, 5 * slab) == want, "h1 sees a different slab 5"
assert h2.pread(slab, 5 * slab) == want, "h2 sees a different slab 5"
h1.shutdown(); h2.shutdown()
PY

# Two concurrent writers (separate processes, separate connections) on interleaved 64K stripes
# of the same 16M, so both hit every slab at once.
export URI="$NBDKIT_URI"
writer() {
    nbdsh_run -c - <<'PY'
import os, random
h.connect_uri(os.environ["URI"])
me = int(os.environ["ME"])
rng = random.Random(me)
stripe = 65536
for k in range(me, 16 * 1024 * 1024 // stripe, 2):
    h.aio_pwrite(rng.randbytes(stripe), k * stripe)
    while h.aio_in_flight() > 16:
        h.poll(-1)
while h.aio_in_flight() > 0:
    h.poll(-1)
h.flush()
PY
}
ME=0 writer & w0=$!
ME=1 writer & w1=$!
cleanup_pid "$w0"; cleanup_pid "$w1"
rc0=0 rc1=0
wait "$w0" || rc0=$?
wait "$w1" || rc1=$?
[[ $rc0 -eq 0 && $rc1 -eq 0 ]] || fail "concurrent writers failed: exit $rc0, $rc1"

nbdsh_run -c - <<'PY'
import os, random, sys
h.connect_uri(os.environ["URI"])
stripe = 65536
gens = [random.Random(0), random.Random(1)]
for k in range(16 * 1024 * 1024 // stripe):
    want = gens[k % 2].randbytes(stripe)
    if h.pread(stripe, k * stripe) != want:
        sys.exit("stripe %d (writer %d) differs when read from a third connection" % (k, k % 2))
PY
