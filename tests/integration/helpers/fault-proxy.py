#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# fault-proxy.py --target HOST:PORT --port-file FILE [options]: a loopback TCP proxy in front of
# one memserver that injects network faults, chosen by a seeded random generator, into the
# connections the plugin opens through it (its control connection and its data connections).
#
# Faults, per connection and per direction (c2s: plugin -> memserver, s2c: the replies):
#   hold        c2s: from the start of the next WRITE request on a data connection, pass nothing
#               on for --hold seconds (longer than the plugin's timeout=), then deliver the held
#               bytes late and in order. When the plugin gives up on the connection meanwhile
#               (it shuts its socket down: the proxy reads EOF), the held bytes are delivered
#               --release-after-close seconds after that EOF and the memserver side is then
#               half-closed, as a kernel would still send what was in its socket buffer. This is
#               what makes a timed-out WRITE land after a newer acknowledged one sent on
#               another of the donor's connections.
#   hold-reply  s2c: the same for the replies (the memserver applied a write the plugin saw fail).
#   delay       either direction: nothing passed on for a short time (below the timeout).
#   cut         both sides closed (FIN), anything held dropped.
#   reset       both sides reset (RST: SO_LINGER 0), anything held dropped.
# At most --max-holds connections are held at once (default 1): one of the donor's connections
# is held while the others flow.
#
# Faults come at --rate per second (Poisson; kinds weighted by --kinds), only while injecting:
# from the start unless --quiet-start, after SIGUSR2; SIGUSR1 stops injecting and releases every
# hold and delay at once (for a quiescent phase). Every fault is logged, one line each, to --log
# (and stdout with -v): "FAULT t=<time.monotonic()> kind=K conn=N role=R dir=D ..." so a checker
# can count faults by kind and place them in a block's history. The seed is printed at start.
#
# Only ever connects to the --target address, which must be a loopback address; listens on
# 127.0.0.1. Exits on SIGTERM/SIGINT or after --max-seconds.
import argparse
import asyncio
import ipaddress
import os
import random
import signal
import socket
import struct
import sys
import time

HEADER = struct.Struct("<IBBHIIQQ")  # magic, version, op, flags, status, body_len, id, reserved
MAGIC = 0x57534452
OP_NAMES = {1: "hello", 2: "alloc", 3: "free", 4: "read", 5: "write", 6: "stats", 7: "list",
            8: "bind", 9: "alloc", 10: "settag", 11: "vlist", 12: "giveback", 13: "wanted",
            14: "gbstatus", 15: "lend", 16: "auth", 17: "authproof"}
KINDS = ("hold", "hold-reply", "delay", "cut", "reset")
ARM_SECONDS = 2.0  # a hold armed for a connection's next WRITE lapses if none comes this soon


def parse_kinds(text):
    weights = {}
    for part in text.split(","):
        if not part:
            continue
        name, _, w = part.partition("=")
        if name not in KINDS:
            raise argparse.ArgumentTypeError("unknown fault kind %r (known: %s)" %
                                             (name, ", ".join(KINDS)))
        weights[name] = float(w or 1)
    return weights


def parse_range(text):
    lo, _, hi = text.partition(":")
    lo = float(lo)
    hi = float(hi) if hi else lo
    if hi < lo or lo < 0:
        raise argparse.ArgumentTypeError("bad range %r" % text)
    return lo, hi


ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--target", required=True, help="HOST:PORT of the memserver (loopback only)")
ap.add_argument("--port-file", required=True, help="written with the listening port once ready")
ap.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one)")
ap.add_argument("--log", default=None, help="fault log file (one line per fault)")
ap.add_argument("-v", "--verbose", action="store_true", help="also print faults on stdout")
ap.add_argument("--rate", type=float, default=2.0, help="faults per second while injecting")
ap.add_argument("--kinds", type=parse_kinds,
                default=parse_kinds("hold=6,hold-reply=1,delay=2,cut=1,reset=1"),
                help="fault kinds and weights, e.g. hold=6,delay=2,cut=1")
ap.add_argument("--hold", type=parse_range, default=(1.5, 3.0),
                help="MIN:MAX seconds a hold lasts (make it longer than timeout=)")
ap.add_argument("--release-after-close", type=parse_range, default=(0.01, 0.12),
                help="MIN:MAX seconds after the plugin closed a held connection that the held "
                     "bytes are delivered")
ap.add_argument("--delay", type=parse_range, default=(0.05, 0.4), help="MIN:MAX seconds of a delay")
ap.add_argument("--max-holds", type=int, default=1, help="connections held at once")
ap.add_argument("--quiet-start", action="store_true", help="inject nothing until SIGUSR2")
ap.add_argument("--max-seconds", type=float, default=3600.0, help="exit after this long")
args = ap.parse_args()

host, _, port = args.target.rpartition(":")
host = host.strip("[]")
if not ipaddress.ip_address(host).is_loopback:
    sys.exit("fault-proxy: refusing non-loopback target %s" % args.target)
target = (host, int(port))
seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
rng = random.Random(seed)
logf = open(args.log, "a", buffering=1) if args.log else None


def note(line):
    if logf:
        logf.write(line + "\n")
    if args.verbose or not logf:
        print(line, flush=True)


def fault(kind, conn, direction, **extra):
    tail = "".join(" %s=%s" % (k, ("%.3f" % v) if isinstance(v, float) else v)
                   for k, v in extra.items())
    note("FAULT t=%.6f kind=%s conn=%d role=%s dir=%s%s" % (
        time.monotonic(), kind, conn.n, conn.role, direction, tail))


class Pipe:
    """One direction of a connection: bytes read, queued, and passed on unless held."""

    def __init__(self, conn, name, reader, writer):
        self.conn, self.name, self.reader, self.writer = conn, name, reader, writer
        self.queue = []               # (bytes, hold_token) chunks not yet passed on
        self.gate = asyncio.Event()   # set: bytes flow
        self.gate.set()
        self.wake = asyncio.Event()   # pump_out: bytes queued or the source closed
        self.timer = asyncio.Event()  # a hold's release timer: its release time moved
        self.eof = False              # the source closed
        self.hold_until = 0.0         # while held: when the bytes go
        self.held = False
        self.arm_write_hold = None    # c2s: (seconds, armed at): a hold for the next WRITE
        self.parse_need = 0           # c2s: bytes of the current message still to come
        self.parse_hdr = b""
        self.parse_ok = True

    def hold(self, seconds, kind):
        self.held = True
        self.gate.clear()
        self.hold_until = time.monotonic() + seconds
        if kind != "delay":
            self.conn.proxy.holds.add(self)
        fault(kind, self.conn, self.name, seconds=seconds)
        asyncio.get_running_loop().create_task(self._release_later(self.hold_until))

    async def _release_later(self, when):
        while self.held:
            left = self.hold_until - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self.timer.wait(), left)
            except asyncio.TimeoutError:
                pass
            self.timer.clear()
        self.release("timer")

    def source_closed(self):
        """The sender gave up: a held pipe delivers its bytes soon, late and in order."""
        if self.held and self.conn.proxy.injecting:
            after = rng.uniform(*args.release_after_close)
            self.hold_until = min(self.hold_until, time.monotonic() + after)
            self.timer.set()

    def release(self, why):
        if not self.held:
            return
        self.held = False
        self.conn.proxy.holds.discard(self)
        held_bytes = sum(len(b) for b in self.queue)
        note("RELEASE t=%.6f conn=%d role=%s dir=%s bytes=%d why=%s%s" % (
            time.monotonic(), self.conn.n, self.conn.role, self.name, held_bytes, why,
            " after-close" if self.eof else ""))
        self.gate.set()

    def split_messages(self, data):
        """c2s: cut `data` at request boundaries so a hold can start exactly at a WRITE; learn
        the connection's role (control or data) from the ops it sends."""
        out = []
        i = 0
        while i < len(data):
            if not self.parse_ok:
                out.append((data[i:], None))
                break
            if self.parse_need > 0:
                n = min(self.parse_need, len(data) - i)
                out.append((data[i:i + n], None))
                self.parse_need -= n
                i += n
                continue
            take = min(HEADER.size - len(self.parse_hdr), len(data) - i)
            start_of_message = not self.parse_hdr
            self.parse_hdr += data[i:i + take]
            out.append((data[i:i + take], "start" if start_of_message else None))
            i += take
            if len(self.parse_hdr) == HEADER.size:
                magic, _, op, _, _, body_len, _, _ = HEADER.unpack(self.parse_hdr)
                self.parse_hdr = b""
                if magic != MAGIC:
                    self.parse_ok = False
                    continue
                self.parse_need = body_len
                name = OP_NAMES.get(op, "op%d" % op)
                if name in ("read", "write"):
                    self.conn.role = "data"
                elif name in ("alloc", "free", "list", "stats", "bind", "settag", "wanted"):
                    if self.conn.role == "?":
                        self.conn.role = "control"
                # The message's first bytes are the last "start" piece appended.
                for j in range(len(out) - 1, -1, -1):
                    if out[j][1] == "start":
                        out[j] = (out[j][0], name)
                        break
        return out

    async def pump_in(self):
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                pieces = self.split_messages(data) if self.name == "c2s" else [(data, None)]
                for chunk, op in pieces:
                    if op == "write" and self.arm_write_hold is not None and not self.held:
                        seconds, armed = self.arm_write_hold
                        self.arm_write_hold = None
                        if time.monotonic() - armed < ARM_SECONDS:
                            self.hold(seconds, "hold")
                    self.queue.append(chunk)
                self.wake.set()
        except (OSError, asyncio.IncompleteReadError):
            pass
        self.eof = True
        self.source_closed()
        self.wake.set()

    async def pump_out(self):
        """Pass the queued bytes on, in order, whenever the gate is open."""
        try:
            while True:
                await self.gate.wait()
                if self.queue:
                    data = b"".join(self.queue)
                    self.queue.clear()
                    self.writer.write(data)
                    await self.writer.drain()
                    continue
                if self.eof:
                    break
                self.wake.clear()
                if self.queue or self.eof:
                    continue
                await self.wake.wait()
        except (OSError, ConnectionError):
            pass
        if self.held:
            self.release("closed")
        # Half-close: what was passed on still gets applied, as after a shutdown by the plugin.
        try:
            if self.writer.can_write_eof():
                self.writer.write_eof()
        except (OSError, RuntimeError):
            pass


class Conn:
    def __init__(self, proxy, n, creader, cwriter, sreader, swriter):
        self.proxy, self.n, self.role = proxy, n, "?"
        self.writers = (cwriter, swriter)
        self.c2s = Pipe(self, "c2s", creader, swriter)
        self.s2c = Pipe(self, "s2c", sreader, cwriter)
        self.closed = False

    async def run(self):
        tasks = [asyncio.create_task(p()) for p in (self.c2s.pump_in, self.c2s.pump_out,
                                                    self.s2c.pump_in, self.s2c.pump_out)]
        await asyncio.gather(*tasks, return_exceptions=True)
        self.close()

    def close(self, reset=False):
        if self.closed:
            return
        self.closed = True
        self.proxy.conns.discard(self)
        for p in (self.c2s, self.s2c):
            p.held = False
            p.timer.set()
            self.proxy.holds.discard(p)
            p.queue.clear()
            p.eof = True
            p.gate.set()
            p.wake.set()
        for w in self.writers:
            sock = w.get_extra_info("socket")
            if reset and sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            if reset and w.transport is not None:
                w.transport.abort()
            else:
                w.close()


class Proxy:
    def __init__(self):
        self.conns = set()
        self.holds = set()
        self.count = 0
        self.injecting = not args.quiet_start
        self.stop = asyncio.Event()

    async def accept(self, creader, cwriter):
        try:
            sreader, swriter = await asyncio.open_connection(*target)
        except OSError:
            cwriter.close()
            return
        for w in (cwriter, swriter):
            s = w.get_extra_info("socket")
            if s is not None:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.count += 1
        conn = Conn(self, self.count, creader, cwriter, sreader, swriter)
        self.conns.add(conn)
        await conn.run()

    def set_injecting(self, on):
        self.injecting = on
        note("%s t=%.6f" % ("INJECT-ON" if on else "INJECT-OFF", time.monotonic()))
        if not on:
            for p in list(self.holds):
                p.release("inject-off")
            for c in self.conns:
                c.c2s.arm_write_hold = None

    def inject_one(self):
        conns = [c for c in self.conns if not c.closed]
        if not conns:
            return
        kinds = sorted(args.kinds)
        kind = rng.choices(kinds, weights=[args.kinds[k] for k in kinds])[0]
        data = sorted((c for c in conns if c.role == "data"), key=lambda c: c.n)
        conns.sort(key=lambda c: c.n)
        if kind in ("hold", "hold-reply"):
            now = time.monotonic()
            armed = sum(1 for c in conns if c.c2s.arm_write_hold is not None
                        and now - c.c2s.arm_write_hold[1] < ARM_SECONDS)
            if len(self.holds) + armed >= args.max_holds or not data:
                return
            conn = rng.choice(data)
            seconds = rng.uniform(*args.hold)
            if kind == "hold":
                conn.c2s.arm_write_hold = (seconds, now)  # starts at the connection's next WRITE
            else:
                conn.s2c.hold(seconds, "hold-reply")
        elif kind == "delay":
            conn = rng.choice(conns)
            pipe = rng.choice((conn.c2s, conn.s2c))
            if pipe.held:
                return
            pipe.hold(rng.uniform(*args.delay), "delay")
        else:
            # Cut and reset go to data connections mostly, the control connection sometimes.
            conn = rng.choice(data) if data and rng.random() < 0.8 else rng.choice(conns)
            fault(kind, conn, "both")
            conn.close(reset=(kind == "reset"))

    async def injector(self):
        while True:
            await asyncio.sleep(rng.expovariate(args.rate) if args.rate > 0 else 3600)
            if self.injecting:
                self.inject_one()

    async def main(self):
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, self.set_injecting, False)
        loop.add_signal_handler(signal.SIGUSR2, self.set_injecting, True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        server = await asyncio.start_server(self.accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        note("START t=%.6f seed=%d listen=127.0.0.1:%d target=%s:%d rate=%g kinds=%s" % (
            time.monotonic(), seed, port, target[0], target[1], args.rate,
            ",".join("%s=%g" % kv for kv in sorted(args.kinds.items()))))
        print("fault-proxy: seed=%d listen=127.0.0.1:%d target=%s:%d" % (seed, port, *target),
              flush=True)
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.rename(tmp, args.port_file)
        inj = asyncio.create_task(self.injector())
        try:
            await asyncio.wait_for(self.stop.wait(), args.max_seconds)
        except asyncio.TimeoutError:
            pass
        inj.cancel()
        server.close()
        for c in list(self.conns):
            c.close()
        note("STOP t=%.6f connections=%d" % (time.monotonic(), self.count))


asyncio.run(Proxy().main())
