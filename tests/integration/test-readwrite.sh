#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Read-after-write at random offsets and sizes (unaligned, cross-slab, first and last byte) against a
# shadow copy; never-written ranges read as zeros. Every byte of the device is compared at the end,
# also from a second, new connection.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

# Slab 1M, device 40M + 4K (the last slab partly used), memserver with room for all of it.
start_memserver 64M 1M
start_nbdkit rw -- server="$MEMSERVER_ADDR" size=$((40 * 1024 * 1024 + 4096))
slab=$(ctl_get "$MEMSERVER_PORT" slab_size)
seed=${RDMASWAP_TEST_SEED:-$RANDOM}
log "seed $seed (set RDMASWAP_TEST_SEED=$seed to repeat)"

export slab seed shadow="$tmpdir/shadow"
nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import os, random, sys
slab = int(os.environ["slab"])
rng = random.Random(int(os.environ["seed"]))
size = h.get_size()
assert size == 40 * 1024 * 1024 + 4096, size
shadow = bytearray(size)          # what the device must contain: zeros until written

def check(off, n, what):
    got = h.pread(n, off)
    want = bytes(shadow[off:off + n])
    if got != want:
        i = next(i for i in range(n) if got[i] != want[i])
        sys.exit("%s: mismatch at byte %d (offset %d of pread(%d, %d)): got %r want %r"
                 % (what, off + i, i, n, off, got[i:i+16], want[i:i+16]))

def write(off, n):
    data = rng.randbytes(n)
    h.pwrite(data, off)
    shadow[off:off + n] = data

def rand_range():
    kind = rng.randrange(6)
    if kind == 0:                  # tiny, unaligned
        n = rng.randint(1, 600)
        off = rng.randrange(size - n + 1)
    elif kind == 1:                # page-sized and page-aligned (what swap sends)
        n = 4096 * rng.choice([1, 8, 32])
        off = rng.randrange((size - n) // 4096 + 1) * 4096
    elif kind == 2:                # straddles a slab boundary, unaligned on both ends
        b = rng.randrange(1, size // slab) * slab
        n = rng.randint(2, 300000)
        off = max(0, b - rng.randint(1, n - 1))
        n = min(n, size - off)
    elif kind == 3:                # spans whole slabs: starts mid-slab, ends mid-slab 2-3 slabs on
        off = rng.randrange(size - 4 * slab)
        n = rng.randint(2 * slab, 3 * slab)
    elif kind == 4:                # exactly one slab
        off = rng.randrange(size // slab) * slab
        n = slab
    else:                          # anything up to 2 MiB
        n = rng.randint(1, 2 * 1024 * 1024)
        off = rng.randrange(size - n + 1)
    return off, n

# Never-written device reads as zeros, including across slabs and at the very end.
check(0, 2 * slab + 17, "fresh start")
check(size - slab - 4096, slab + 4096, "fresh end")

# Edges: first byte, last byte, the partial last slab.
write(0, 1); write(size - 1, 1); write(size - 4096 - 3, 4096 + 2)
check(0, 4096, "first byte"); check(size - 8192, 8192, "last bytes")

writes = 0
for i in range(400):
    off, n = rand_range()
    if rng.random() < 0.6:
        write(off, n)
        writes += 1
        check(off, n, "read-after-write #%d" % i)
        # The bytes around the write are untouched.
        lo = max(0, off - 4099); hi = min(size, off + n + 4099)
        check(lo, hi - lo, "neighbourhood of write #%d" % i)
    else:
        check(off, n, "read #%d" % i)

h.flush()
# Every byte, in 4 MiB preads that start at an odd offset so none is slab-aligned.
check(0, 3, "head")
off = 3
while off < size:
    n = min(4 * 1024 * 1024, size - off)
    check(off, n, "full sweep")
    off += n
# Never-written slabs must still exist as zeros: count them so the test knows it checked some.
untouched = sum(1 for s in range(0, size, slab) if not any(shadow[s:s + slab]))
print("writes=%d untouched_slabs=%d" % (writes, untouched))
open(os.environ["shadow"], "wb").write(shadow)
PY

# A new connection (new plugin handle) sees the same bytes.
nbdcopy -- "$NBDKIT_URI" "$tmpdir/copy"
cmp "$tmpdir/shadow" "$tmpdir/copy" || fail "second connection does not see the written bytes"
