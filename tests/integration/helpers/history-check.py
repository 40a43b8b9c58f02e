#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# history-check.py --uri NBD_URI [options]: drive an NBD export with concurrent writes, reads,
# trims and zeroes of whole 4 KiB blocks from several NBD connections, record every operation's
# interval [start, end] (time.monotonic) and result, and check the history against the
# guarantee below. Exits 1 on any violation (each printed with the block's history), 0 otherwise.
#
# The guarantee ("never wrong bytes"), per 4 KiB block:
#   - once a write has succeeded and no other write to the block is in flight, every later read
#     returns exactly its bytes;
#   - a failed write leaves the block unspecified only until the next successful write to it:
#     its effect is confined to its own interval [start, end];
#   - no read ever returns bytes never written to that block: zeros only while the block has
#     never been written successfully, or after a trim (or a zero); never torn or mixed
#     contents, never the bytes of another block.
# Formally: a successful write takes effect at one point within its interval; a failed write
# (EIO or any other error) and a trim (advisory: it may or may not zero) maybe take effect at
# one point within theirs; a successful zero is a write of zeros. A read R of a block returning
# v is legal iff v is the bytes of a write W of that block (zeros: the initial contents, a
# "successful write" at time -inf, a zero or a trim) with W.start < R.end, and there is no
# successful write W2 of that block with W.end < W2.start and W2.end < R.start.
# A read overlapping a write (or a trim, or following a failed write not yet overwritten)
# may return a byte-wise mix of the values it may return by that rule, each byte from one of
# them: a block device promises no atomicity to overlapping requests (the memserver copies a
# WRITE into the slab while another loop may copy the same bytes out for a READ), and the
# kernel never reads a page while writing it. Counted as "mixed-in-flux"; --strict-atomic
# makes them violations. Mixed bytes with only one legal value, or with a byte that none of
# them has, are violations.
# Not checked: that two reads agree with each other (a failed write's bytes may come and go
# until the next successful write; the rule above allows it).
#
# Every block written names its write: magic, run tag, block number, a unique write id, filler
# derived from those, and a SHA-256 of the rest; a read's bytes are compared whole with the
# bytes that write had. The workload: a hot set of blocks takes most operations, so rewrites
# after failures are frequent; a failed write is written again later with new contents, as the
# kernel writes a re-dirtied page again; a block written successfully is read back a little
# later; whole-slab trims (--slab-size) make the plugin give slabs back and allocate new ones.
# After --seconds the fault proxies (--proxy-pid) are told to stop injecting (SIGUSR1; SIGUSR2
# at start turns them on), every block whose last write failed is written until it succeeds,
# and every block of the export is read back, all of it checked the same way.
#
# Summary line: ops by kind, EIO count, faults by kind (from the proxies' --proxy-log),
# violations, the longest request.
import argparse
import bisect
import collections
import errno
import hashlib
import os
import random
import re
import signal
import struct
import sys
import threading
import time

import nbd

BLOCK = 4096
MAGIC = b"RSWHIST1"
HDR = struct.Struct("<8sQQQ")          # magic, run tag, block, write id
SUM_AT = BLOCK - 32
ZERO = 0                               # the "write id" of zeros
ZERO_BLOCK = bytes(BLOCK)
INF = float("inf")

ap = argparse.ArgumentParser(description="concurrent NBD history checker")
ap.add_argument("--uri", help="NBD URI of the export")
ap.add_argument("--self-test", action="store_true", help="check the checker on made-up histories")
ap.add_argument("--seconds", type=float, default=30.0, help="length of the faulty phase")
ap.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one)")
ap.add_argument("--threads", type=int, default=8, help="threads, each with its own NBD connection")
ap.add_argument("--hot", type=int, default=24, help="blocks in the hot set")
ap.add_argument("--hot-fraction", type=float, default=0.8,
                help="share of operations on the hot set")
ap.add_argument("--slab-size", type=int, default=1 << 20,
                help="memserver slab size (whole-slab trims)")
ap.add_argument("--max-blocks", type=int, default=8, help="most blocks in one write or read")
ap.add_argument("--mix", default="write=45,read=40,trim=4,slabtrim=1,zero=2",
                help="operation weights")
ap.add_argument("--proxy-pid", type=int, action="append", default=[],
                help="fault proxy to turn on at start (SIGUSR2) and off at the end (SIGUSR1)")
ap.add_argument("--proxy-log", action="append", default=[],
                help="fault proxy log to count faults from")
ap.add_argument("--settle", type=float, default=2.5,
                help="seconds to wait after the faults stop before the final phase")
ap.add_argument("--recovery-seconds", type=float, default=None,
                help="after the faults, how long each of the rewrite and the read-back may retry "
                     "(default 20 with --require-recovery, else 3)")
ap.add_argument("--require-recovery", action="store_true",
                help="fail unless every block can be written and read back after the faults "
                     "(not with faults on every replica: a slab that lost them all fails for good)")
ap.add_argument("--strict-atomic", action="store_true",
                help="a read overlapping a write must return one value whole, not a mix")
ap.add_argument("--max-print", type=int, default=5, help="violations printed with their history")
ap.add_argument("--op-timeout", type=float, default=60.0,
                help="a request taking longer than this is reported (a hang)")
args = ap.parse_args()
if not args.uri and not args.self_test:
    ap.error("--uri is required")
if args.recovery_seconds is None:
    args.recovery_seconds = 20.0 if args.require_recovery else 3.0

seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
run_tag = int.from_bytes(hashlib.sha256(b"%d %d" % (seed, os.getpid())).digest()[:8], "little")


def block_bytes(block, wid):
    """The exact 4096 bytes write `wid` puts in `block`."""
    head = HDR.pack(MAGIC, run_tag, block, wid)
    fill = hashlib.sha256(head).digest() * ((SUM_AT - HDR.size) // 32 + 1)
    body = head + fill[:SUM_AT - HDR.size]
    return body + hashlib.sha256(body).digest()


def decode(block, data):
    """What a read of `block` returned: ("zero", 0), ("write", wid), or ("bad", why, data)."""
    why = decode_bad(block, data)
    if why is None:
        return "write", HDR.unpack_from(data)[3]
    if why == "zeros":
        return "zero", ZERO
    return "bad", why, bytes(data)


def decode_bad(block, data):
    """None if `data` is a write's bytes of `block`, "zeros", or what is wrong with it."""
    if data == ZERO_BLOCK:
        return "zeros"
    magic, tag, blk, wid = HDR.unpack_from(data)
    if magic != MAGIC:
        nz = sum(1 for b in data if b)
        return "unknown bytes (%d of 4096 non-zero, first 16: %s)" % (nz, data[:16].hex())
    if hashlib.sha256(data[:SUM_AT]).digest() != data[SUM_AT:]:
        # A torn block: which writes do its pieces come from?
        return "torn or mixed contents (header: block %d write %d%s; checksum wrong)" % (
            blk, wid, "" if tag == run_tag else ", another run's tag")
    if tag != run_tag:
        return "bytes of another run (tag %x, block %d write %d)" % (tag, blk, wid)
    if blk != block:
        return "bytes of block %d (write %d), not of this block" % (blk, wid)
    if data != block_bytes(block, wid):
        return "write %d's header with other contents" % wid
    return None


# The history: per block, a list of events (kind, start, end, result, value, op id).
# kind: "write" (value = write id), "zero" (value 0), "trim" (value 0), "read" (value = what
# decode() returned). result: 0, or the errno of a failed request.
history = collections.defaultdict(list)
hist_mu = threading.Lock()
counts = collections.Counter()       # ops by kind and result
errnos = collections.Counter()
longest = [0.0, ""]
next_wid = iter(range(1, 1 << 62))
wid_mu = threading.Lock()
op_ids = iter(range(1, 1 << 62))
violations = []


def new_wid():
    with wid_mu:
        return next(next_wid)


def record(blocks, kind, start, end, result, values):
    with hist_mu:
        op = next(op_ids)
        for b, v in zip(blocks, values):
            history[b].append((kind, start, end, result, v, op))
        counts[kind] += 1
        counts[kind + (" ok" if result == 0 else " failed")] += 1
        if result:
            errnos[errno.errorcode.get(result, str(result))] += 1
        if end - start > longest[0]:
            longest[0], longest[1] = end - start, "%s of %d block(s) at block %d%s" % (
                kind, len(blocks), blocks[0], "" if result == 0 else " (failed)")


def call(fn, *a):
    """Run an NBD request; return (start, end, errno or 0, result)."""
    start = time.monotonic()
    try:
        res = fn(*a)
        err = 0
    except nbd.Error as e:
        res = None
        err = e.errnum or errno.EIO
    end = time.monotonic()
    return start, end, err, res


class Client:
    def __init__(self, idx):
        self.idx = idx
        self.rng = random.Random(seed * 1000003 + idx)
        self.h = nbd.NBD()
        self.h.connect_uri(args.uri)

    def write(self, first, n):
        blocks = list(range(first, first + n))
        wids = [new_wid() for _ in blocks]
        buf = b"".join(block_bytes(b, w) for b, w in zip(blocks, wids))
        start, end, err, _ = call(self.h.pwrite, buf, first * BLOCK)
        record(blocks, "write", start, end, err, wids)
        return err

    def zero(self, first, n):
        blocks = list(range(first, first + n))
        start, end, err, _ = call(self.h.zero, n * BLOCK, first * BLOCK)
        record(blocks, "zero", start, end, err, [ZERO] * n)
        return err

    def trim(self, first, n):
        blocks = list(range(first, first + n))
        start, end, err, _ = call(self.h.trim, n * BLOCK, first * BLOCK)
        record(blocks, "trim", start, end, err, [ZERO] * n)
        return err

    def read(self, first, n):
        blocks = list(range(first, first + n))
        start, end, err, data = call(self.h.pread, n * BLOCK, first * BLOCK)
        if err:
            record(blocks, "read", start, end, err, [None] * n)
            return err
        values = [decode(b, data[i * BLOCK:(i + 1) * BLOCK]) for i, b in enumerate(blocks)]
        record(blocks, "read", start, end, 0, values)
        return 0


checked = collections.Counter()


def mixture_of(block, data, values):
    """None if every byte of `data` is the byte at that place of one of `values` (write ids,
    or ZERO) of `block`; else the first offset that none of them explains."""
    cands = [ZERO_BLOCK if v == ZERO else block_bytes(block, v) for v in values]
    for i in range(0, BLOCK, 64):
        piece = data[i:i + 64]
        if any(c[i:i + 64] == piece for c in cands):
            continue
        for j in range(i, i + 64):
            if all(c[j] != data[j] for c in cands):
                return j
    return None


def check_block(block, evs):
    """The reads of one block's history that break the guarantee: [(event, why)]."""
    bad = []
    writes = [e for e in evs if e[0] in ("write", "zero", "trim")]
    succ = sorted((e[1], e[2]) for e in writes if e[0] != "trim" and e[3] == 0)
    succ_starts = [s for s, _ in succ]
    # suffix_min[i]: the earliest end of the successful writes from the i-th start on
    suffix_min = [INF] * (len(succ) + 1)
    for i in range(len(succ) - 1, -1, -1):
        suffix_min[i] = min(succ[i][1], suffix_min[i + 1])
    by_wid = {e[4]: e for e in writes if e[0] == "write"}
    # Zeros: the initial contents (a successful write at -inf), zeroes and trims.
    zeros = sorted([(-INF, -INF)] + [(e[1], e[2]) for e in writes if e[4] == ZERO])
    zero_starts = [s for s, _ in zeros]
    zero_prefix_max = []
    m = -INF
    for _, e in zeros:
        m = max(m, e)
        zero_prefix_max.append(m)

    def overwritten(after, before):
        """A successful write of this block that started after `after` and ended before `before`."""
        i = bisect.bisect_right(succ_starts, after)
        return suffix_min[i] < before

    def legal_values(start, end):
        """What a read over [start, end] may return: write ids, and ZERO."""
        vals = {e[4] for e in writes if e[1] < end and not overwritten(e[2], start)}
        if not overwritten(-INF, start):
            vals.add(ZERO)
        return vals

    for ev in evs:
        kind, start, end, result, value, op = ev
        if kind != "read" or result:
            continue
        checked["reads"] += 1
        what, v = value[:2]
        why = None
        if what == "bad":
            # Mixed bytes are legal only while the block is in flux: a read overlapping a write
            # (or a trim, or a failed write that may still land) may see any byte of each value
            # it may return (block devices promise no atomicity to overlapping requests; the
            # kernel never reads a page it is writing). Each byte must still come from one.
            legal = legal_values(start, end)
            off = mixture_of(block, value[2], legal) if len(legal) > 1 else 0
            if off is None and not args.strict_atomic:
                checked["mixed reads while in flux"] += 1
            else:
                names = sorted("zeros" if x == ZERO else "w%d" % x for x in legal)
                why = "%s; it may return only %s%s" % (
                    v, " or ".join(names[:8]) + (" ..." if len(names) > 8 else ""),
                    "" if off is None else " (byte %d is none of them)" % off)
        elif what == "zero":
            checked["zero reads"] += 1
            # The candidate that ended last among those started before the read ended.
            i = bisect.bisect_left(zero_starts, end)
            if overwritten(zero_prefix_max[i - 1], start):
                why = "zeros after a successful write, with no trim or zero since"
        else:
            checked["data reads"] += 1
            w = by_wid.get(v)
            if w is None:
                why = "write %d's bytes, never written to this block" % v
            elif w[1] >= end:
                why = "write %d's bytes before that write started" % v
            elif overwritten(w[2], start):
                why = "write %d's bytes (%s) after a newer successful write had ended" % (
                    v, "it failed" if w[3] else "it succeeded")
        if why:
            bad.append((ev, why))
    return bad


def self_test():
    """The check on made-up histories: legal ones pass, each kind of wrong bytes is caught."""
    W = lambda s, e, wid, r=0: ("write", s, e, r, wid, 0)
    R = lambda s, e, v: ("read", s, e, 0, v, 0)
    T = lambda s, e: ("trim", s, e, 0, ZERO, 0)
    Z = lambda s, e, r=0: ("zero", s, e, r, ZERO, 0)
    d = lambda wid: ("write", wid)
    z = ("zero", 0)
    torn = block_bytes(0, 1)[:1000] + block_bytes(0, 2)[1000:]
    foreign = block_bytes(0, 1)[:1000] + block_bytes(0, 5)[1000:]
    half0 = block_bytes(0, 1)[:1000] + ZERO_BLOCK[1000:]
    cases = [  # (name, history, violations expected)
        ("never written reads zeros", [R(0, 1, z)], 0),
        ("last write wins", [W(0, 1, 1), W(2, 3, 2), R(4, 5, d(2))], 0),
        ("older write after a newer one ended", [W(0, 1, 1), W(2, 3, 2), R(4, 5, d(1))], 1),
        ("concurrent writes: either", [W(0, 3, 1), W(1, 2, 2), R(4, 5, d(1)), R(4, 5, d(2))], 0),
        ("read overlapping a write: old or new", [W(0, 1, 1), W(2, 5, 2), R(3, 4, d(1)),
                                                  R(3, 4, d(2))], 0),
        ("write's bytes before it started", [W(5, 6, 1), R(0, 1, d(1))], 1),
        ("zeros after a write", [W(0, 1, 1), R(2, 3, z)], 1),
        ("zeros after a trim", [W(0, 1, 1), T(2, 3), R(4, 5, z)], 0),
        ("data after a trim (advisory)", [W(0, 1, 1), T(2, 3), R(4, 5, d(1))], 0),
        ("zeros after a zero", [W(0, 1, 1), Z(2, 3), R(4, 5, z)], 0),
        ("zeros after trim then write", [T(0, 1), W(2, 3, 1), R(4, 5, z)], 1),
        ("failed write maybe", [W(0, 1, 1), W(2, 3, 2, errno.EIO), R(4, 5, d(1)),
                                R(4, 5, d(2))], 0),
        ("failed write lands after the retry (the known defect)",
         [W(0, 1, 1), W(2, 3, 2, errno.EIO), W(4, 5, 3), R(6, 7, d(2))], 1),
        ("failed write overlapping the next write", [W(2, 4.5, 2, errno.EIO), W(4, 5, 3),
                                                      R(6, 7, d(2))], 0),
        ("never written id", [W(0, 1, 1), R(2, 3, d(7))], 1),
        ("torn, nothing in flight", [W(0, 1, 1), R(2, 3, ("bad", "torn", torn))], 1),
        ("torn, overlapping the write", [W(0, 1, 1), W(2, 4, 2), R(3, 5, ("bad", "t", torn))], 0),
        ("torn after a failed write", [W(0, 1, 1), W(2, 3, 2, errno.EIO),
                                       R(4, 5, ("bad", "t", torn))], 0),
        ("torn after the failed write's retry", [W(0, 1, 1), W(2, 3, 2, errno.EIO), W(4, 5, 3),
                                                 R(6, 7, ("bad", "t", torn))], 1),
        ("torn with foreign bytes", [W(0, 1, 1), W(2, 4, 2), R(3, 5, ("bad", "t", foreign))], 1),
        ("torn with zeros", [W(0, 1, 1), W(2, 4, 2), R(3, 5, ("bad", "t", half0))], 1),
        ("torn with zeros while trimmed", [W(0, 1, 1), T(2, 4), R(3, 5, ("bad", "t", half0))], 0),
    ]
    bad = 0
    for name, evs, want in cases:
        got = len(check_block(0, evs))
        if got != want:
            print("self-test FAILED: %s: %d violations, expected %d" % (name, got, want))
            bad += 1
    blk = block_bytes(3, 9)
    for data, want in ((blk, ("write", 9)), (ZERO_BLOCK, ("zero", 0))):
        if decode(3, data) != want:
            print("self-test FAILED: decode %r" % (want,))
            bad += 1
    for name, data in (("other block", block_bytes(4, 9)),
                       ("torn", blk[:2048] + block_bytes(3, 10)[2048:]),
                       ("half zeros", blk[:2048] + ZERO_BLOCK[2048:]),
                       ("garbage", bytes(range(256)) * 16)):
        if decode(3, data)[0] != "bad":
            print("self-test FAILED: decode of %s passed" % name)
            bad += 1
    print("history-check: self-test: %d cases, %d failed" % (len(cases) + 6, bad))
    sys.exit(1 if bad else 0)


if args.self_test:
    self_test()
print("history-check: seed=%d uri=%s seconds=%g threads=%d hot=%d" % (
    seed, args.uri, args.seconds, args.threads, args.hot), flush=True)


size = nbd.NBD()
size.connect_uri(args.uri)
nblocks = size.get_size() // BLOCK
can_trim, can_zero = size.can_trim(), size.can_zero()
size.shutdown()
if nblocks < 2:
    sys.exit("history-check: export too small")
mix = {}
for part in args.mix.split(","):
    k, _, w = part.partition("=")
    mix[k] = float(w)
if not can_trim:
    mix.pop("trim", None)
    mix.pop("slabtrim", None)
if not can_zero:
    mix.pop("zero", None)
master = random.Random(seed)
hot = sorted(master.sample(range(nblocks), min(args.hot, nblocks)))
slab_blocks = max(1, args.slab_size // BLOCK)

pending = {}           # block -> when to write it again (its last write failed)
pending_mu = threading.Lock()
stop = threading.Event()


def note_result(blocks, err, when):
    with pending_mu:
        for b in blocks:
            if err:
                pending[b] = when + 0.05
            else:
                pending.pop(b, None)


def worker(c):
    try:
        work(c)
    except Exception as e:  # a bug of the checker: must not pass as a clean run
        violations.append((None, None, "checker thread %d died: %r" % (c.idx, e)))
        stop.set()


def work(c):
    rng = c.rng
    kinds = sorted(mix)
    weights = [mix[k] for k in kinds]
    verify = []        # (when, block): read back a block written successfully a little earlier
    while not stop.is_set():
        now = time.monotonic()
        if verify and verify[0][0] <= now and rng.random() < 0.5:
            _, b = verify.pop(0)
            c.read(b, 1)
            continue
        retry = None
        if rng.random() < 0.5:
            with pending_mu:
                due = [b for b, t in pending.items() if t <= now]
                if due:
                    retry = rng.choice(due)
                    pending[retry] = now + 0.5   # not by two threads at once, unless it is late
        if retry is not None:
            err = c.write(retry, 1)
            note_result([retry], err, time.monotonic())
            if not err:
                verify.append((time.monotonic() + rng.uniform(0.05, 0.4), retry))
            continue
        kind = rng.choices(kinds, weights)[0]
        if kind == "slabtrim":
            s = rng.choice(hot) // slab_blocks if rng.random() < 0.7 else rng.randrange(
                max(1, nblocks // slab_blocks))
            first = s * slab_blocks
            n = min(slab_blocks, nblocks - first)
            err = c.trim(first, n)
            continue
        first = rng.choice(hot) if rng.random() < args.hot_fraction else rng.randrange(nblocks)
        n = 1 if rng.random() < 0.6 else rng.randint(1, args.max_blocks)
        n = min(n, nblocks - first)
        if kind == "write":
            err = c.write(first, n)
            t = time.monotonic()
            note_result(range(first, first + n), err, t)
            if not err and rng.random() < 0.5:
                verify.append((t + rng.uniform(0.05, 0.4), first + rng.randrange(n)))
        elif kind == "read":
            c.read(first, n)
        elif kind == "trim":
            c.trim(first, n)
        elif kind == "zero":
            err = c.zero(first, n)
            note_result(range(first, first + n), err, time.monotonic())
        verify = verify[-32:]


def signal_proxies(sig):
    for pid in args.proxy_pid:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            print("history-check: fault proxy %d is gone" % pid, file=sys.stderr)


clients = [Client(i) for i in range(args.threads)]
t0 = time.monotonic()
signal_proxies(signal.SIGUSR2)
threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in clients]
for t in threads:
    t.start()
stop.wait(args.seconds)
stop.set()
join_deadline = time.monotonic() + args.op_timeout
for t in threads:
    t.join(max(0.0, join_deadline - time.monotonic()))
    if t.is_alive():
        print("history-check: a request hung for more than %g s" % args.op_timeout, file=sys.stderr)
        violations.append((None, None, "a request hung for more than %g s" % args.op_timeout))
        break
t_faults_off = time.monotonic()
signal_proxies(signal.SIGUSR1)
time.sleep(args.settle)

# Quiescent phase: every block whose last write failed is written until it succeeds (the
# kernel's rewrite of a re-dirtied page), then every block is read back; both bounded in time
# (a slab that lost every replica fails with EIO for good, which is allowed: not wrong bytes).
c = clients[0]
deadline = time.monotonic() + args.recovery_seconds
with pending_mu:
    todo = sorted(pending)
unwritten = []
for b in todo:
    while c.write(b, 1):
        if time.monotonic() > deadline:
            unwritten.append(b)
            break
        time.sleep(0.2)
deadline = time.monotonic() + args.recovery_seconds
final_failed = 0
chunk = 64
for first in range(0, nblocks, chunk):
    n = min(chunk, nblocks - first)
    while c.read(first, n):
        if time.monotonic() > deadline:
            final_failed += n
            break
        time.sleep(0.2)
for cl in clients:
    try:
        cl.h.shutdown()
    except nbd.Error:
        pass

# The check.
def describe(ev, t_base):
    kind, start, end, result, value, op = ev
    what = kind
    if kind == "write":
        what += " w%d" % value
    if kind == "read" and result == 0:
        what += " -> " + ("zeros" if value[0] == "zero" else
                          "w%d" % value[1] if value[0] == "write" else value[1])
    if result:
        what += " FAILED %s" % errno.errorcode.get(result, result)
    return "  [%9.4f, %9.4f] op %-7d %s" % (start - t_base, end - t_base, op, what)


for block, evs in history.items():
    violations.extend((block, ev, why) for ev, why in check_block(block, evs))

# The proxies' logs, read once: faults by kind, late deliveries, and every fault and release
# (with its time) to interleave with a violating block's history.
faults = collections.Counter()
late = 0
fault_events = []
for path in args.proxy_log:
    try:
        with open(path) as f:
            for line in f:
                m = re.match(r"FAULT .*kind=(\S+)", line)
                if m:
                    faults[m.group(1)] += 1
                if line.startswith("RELEASE") and "after-close" in line and " bytes=0 " not in line:
                    late += 1
                m = re.match(r"(FAULT|RELEASE) t=(\S+) (.*)", line)
                if m:
                    fault_events.append((float(m.group(2)), "%s %s %s" % (
                        os.path.basename(path), m.group(1).lower(), m.group(3))))
    except OSError as e:
        print("history-check: cannot read %s: %s" % (path, e), file=sys.stderr)

shown = set()
for block, ev, why in violations:
    key = (block, ev[4][:2] if ev else None)
    if key in shown:
        continue
    shown.add(key)
    if len(shown) > args.max_print:
        break
    if block is None:
        print("VIOLATION: %s" % why)
        continue
    print("VIOLATION: block %d: read op %d returned %s" % (block, ev[5], why))
    lo = ev[1] - 1.0
    if ev[4][0] == "write":
        for e in history[block]:
            if e[0] == "write" and e[4] == ev[4][1]:
                lo = e[1] - 0.05
    hi = ev[2] + 0.05
    lines = [(e[1], describe(e, t0), e[0] != "read" or e is ev) for e in history[block]
             if lo <= e[2] and e[1] <= hi]
    lines += [(t, "  [%9.4f]            %s" % (t - t0, text), True) for t, text in fault_events
              if lo <= t <= hi]
    lines.sort(key=lambda x: x[0])
    if len(lines) > 60:  # the reads in between only where they are the last ones
        keep = [x for x in lines[:-20] if x[2]] + lines[-20:]
        lines = keep[:1] + keep[-59:] if len(keep) > 60 else keep
    print("  history of block %d (times in s since the start; the fault proxies' events "
          "interleaved):" % block)
    for _, text, _ in lines:
        print(text)
if len(shown) > args.max_print:
    print("... and more: %d violations in all" % len(violations))

ops = ", ".join("%s=%d" % (k, counts[k]) for k in ("write", "read", "trim", "zero"))
print("history-check: seed=%d ops=%d (%s) failed=%d (%s) reads-checked=%d (data %d, zeros %d) "
      "mixed-in-flux=%d blocks=%d final-read-back=%d-blocks unwritten-after-faults=%d "
      "faults=%d (%s) "
      "late-deliveries=%d violations=%d%s longest=%.3fs (%s)" % (
          seed, sum(counts[k] for k in ("write", "read", "trim", "zero")), ops,
          sum(errnos.values()), ",".join("%s=%d" % kv for kv in sorted(errnos.items())) or "-",
          checked["reads"], checked["data reads"], checked["zero reads"],
          checked["mixed reads while in flux"], len(history),
          nblocks - final_failed, len(unwritten), sum(faults.values()),
          ",".join("%s=%d" % kv for kv in sorted(faults.items())) or "-", late, len(violations),
          " (first read at %.1fs)" % (min(ev[1] for _, ev, _ in violations if ev) - t0)
          if any(ev for _, ev, _ in violations) else "",
          longest[0], longest[1] or "-"), flush=True)
if violations:
    sys.exit(1)
if (final_failed or unwritten) and args.require_recovery:
    print("history-check: FAIL: after the faults stopped, %d blocks could not be read back and "
          "%d could not be written" % (final_failed, len(unwritten)))
    sys.exit(1)
if checked["data reads"] == 0:
    print("history-check: FAIL: no read returned written data: nothing was checked")
    sys.exit(1)
