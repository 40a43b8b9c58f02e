#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# isolation-client.py HOST PORT KEYFILE: two authenticated sessions, A and B, on one memserver.
# A fills slabs with a pattern; B tries every slab id (and some past the end) at several
# offsets with READ, WRITE and FREE: every attempt must be refused. A's bytes are unchanged.
# Then A frees one slab and drops its session (freeing the rest); B allocates every slab and
# reads each one whole: all zeros. Prints a summary; exits 1 on any breach.
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

host, port, key = sys.argv[1], int(sys.argv[2]), wire.load_key(sys.argv[3])
breaches = []


def pattern(slab, off, n):
    return (struct.pack("<IQ", slab, off) * (n // 12 + 1))[:n]


a, ainfo = wire.session(host, port, key)
b, binfo = wire.session(host, port, key)
slab_size, total = ainfo["slab_size"], ainfo["slabs_total"]
chunk = min(slab_size, ainfo["max_io"])
a_slabs = []
for _ in range(3):
    st, sid = wire.alloc(a)
    assert st == 0, "A could not allocate: errno %d" % st
    a_slabs.append(sid)
for sid in a_slabs:
    for off in range(0, slab_size, chunk):
        st, _ = wire.io(a, wire.WRITE, sid, off, chunk, pattern(sid, off, chunk))
        assert st == 0, "A's write failed: errno %d" % st

offsets = sorted({0, 4096, slab_size // 2, slab_size - 4096})
attempts = 0
for sid in range(total + 2):
    for off in offsets:
        for op in (wire.READ, wire.WRITE):
            data = b"\xee" * 4096 if op == wire.WRITE else b""
            st, body = wire.io(b, op, sid, off, 4096, data)
            attempts += 1
            if st == 0:
                breaches.append("B %s slab %d offset %d succeeded" % ("read" if op == wire.READ else "wrote", sid, off))
    st = wire.free(b, sid)
    attempts += 1
    if st == 0:
        breaches.append("B freed slab %d" % sid)
# Ranges that straddle or leave A's slab, through A's own session: refused too.
for off, n in ((slab_size - 2048, 4096), (slab_size, 4096), (1 << 62, 4096)):
    st, _ = wire.io(a, wire.READ, a_slabs[0], off, n)
    attempts += 1
    if st == 0:
        breaches.append("A read outside its slab at offset %d" % off)

# A's data is intact.
for sid in a_slabs:
    for off in range(0, slab_size, chunk):
        st, body = wire.io(a, wire.READ, sid, off, chunk)
        if st != 0 or body != pattern(sid, off, chunk):
            breaches.append("A's slab %d offset %d changed (status %d)" % (sid, off, st))

# Freed slabs (FREE, and the end of A's session) read as zeros to B.
assert wire.free(a, a_slabs[0]) == 0
a.close()
b_slabs = []
deadline = time.monotonic() + 10           # the server ends A's session when it sees the close
while not set(a_slabs) <= set(b_slabs) and time.monotonic() < deadline:
    st, sid = wire.alloc(b)
    if st:
        time.sleep(0.1)
        continue
    b_slabs.append(sid)
if sorted(set(a_slabs) - set(b_slabs)):
    breaches.append("B could not get A's old slabs %s (got %s)" % (a_slabs, b_slabs))
zero = bytes(chunk)
for sid in b_slabs:
    for off in range(0, slab_size, chunk):
        st, body = wire.io(b, wire.READ, sid, off, chunk)
        if st != 0 or body != zero:
            breaches.append("B's fresh slab %d offset %d is not zeros (status %d)" % (sid, off, st))
            break
print("isolation-client: %d foreign attempts refused, %d slabs of A reused by B read as zeros"
      % (attempts - len(breaches), len(set(a_slabs) & set(b_slabs))))
for line in breaches:
    print("BREACH: " + line, file=sys.stderr)
sys.exit(1 if breaches else 0)
