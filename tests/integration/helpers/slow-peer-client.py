#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# slow-peer-client.py HOST PORT KEYFILE MEMSERVER_PID MESSAGE_TIMEOUT MODE: key holders that
# start a message and never finish it, against a memserver started with --message-timeout.
#   MODE=free:   a session starts a WRITE to its slab and trickles the payload, one byte every
#                0.25 s; another connection of the session FREEs that slab meanwhile (the
#                release waits for the WRITE's access), and a third session writes and reads
#                back its own slab every 20 ms. The trickler must be dropped within the
#                timeout (+ slack), the FREE must then succeed, the memserver must not spin
#                while the release waits (its CPU time over the window, from /proc/PID/stat,
#                under a quarter of the window), and the verifier must see no error.
#   MODE=attack: 3 rounds of 4 tricklers (each in its own session, on its own slab) and a
#                slow reader (8 pipelined 1 MiB READs, replies never read): each must be
#                closed by the server within the timeout (+ slack).
# Prints one line per check; exits 1 if one failed.
import os
import select
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

host, port, key = sys.argv[1], int(sys.argv[2]), wire.load_key(sys.argv[3])
pid, timeout, mode = int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
slack = 1.5
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr, flush=True)


def cpu_seconds():
    """utime + stime of the memserver, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def closed(s, wait):
    """True if the server closes `s` within `wait` seconds (reading whatever it sent)."""
    s.settimeout(0.2)
    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            if not s.recv(1 << 20):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except (TimeoutError, OSError):
            pass
    return False


def peer_closed(s):
    """True if the server has closed `s` (it sends a trickler nothing before that)."""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(4096) == b""
    except OSError:
        return True


def trickle(s, slab, length, stop, times, step=0.25):
    """Start a WRITE of `length` bytes to `slab` and send its payload one byte every `step`
    seconds until the server closes the connection or `stop` is set. Sets times[0] to when the
    message started and times[1] to when the server closed the connection (0: it did not)."""
    s.sendall(wire.header(wire.WRITE, 16 + length) + struct.pack("<IIQ", slab, length, 0))
    times[0] = time.monotonic()
    while not stop.is_set():
        try:
            s.sendall(b"\x5a")
        except OSError:
            times[1] = time.monotonic()
            return
        end = time.monotonic() + step
        while time.monotonic() < end and not stop.is_set():
            if peer_closed(s):
                times[1] = time.monotonic()
                return
            time.sleep(0.01)


def verifier(stop, result):
    """Write and read back 4 KiB blocks of its own slab until `stop`: result = [ops, errors]."""
    s, _ = wire.session(host, port, key)
    st, slab = wire.alloc(s)
    if st:
        result[1] += 1
        return
    i = 0
    while not stop.is_set():
        data = os.urandom(4096)
        off = (i % 16) * 4096
        st, _ = wire.io(s, wire.WRITE, slab, off, 4096, data)
        st2, got = wire.io(s, wire.READ, slab, off, 4096)
        result[0] += 1
        if st or st2 or got != data:
            result[1] += 1
        i += 1
        stop.wait(0.02)
    s.close()


def mode_free():
    t, info = wire.session(host, port, key)
    st, slab = wire.alloc(t)
    check(st == 0, "ALLOC answered errno %d" % st)
    f = wire.connect(host, port, timeout=timeout + 30)
    check(wire.authenticate(f, key) == 0, "authentication refused")
    st, _ = wire.hello(f, info["session_id"], info["token"])
    check(st == 0, "HELLO join answered errno %d" % st)
    stop = threading.Event()
    vres = [0, 0]
    v = threading.Thread(target=verifier, args=(stop, vres))
    v.start()
    time.sleep(0.3)
    times = [0.0, 0.0]
    cpu0, t0 = cpu_seconds(), time.monotonic()
    tt = threading.Thread(target=trickle, args=(t, slab, 65536, stop, times))
    tt.start()
    time.sleep(0.3)
    # The FREE waits in release() for the trickling WRITE's access.
    f.sendall(wire.header(wire.FREE, 8) + struct.pack("<II", slab, 0))
    free_status = None
    try:
        h = wire.parse_header(wire.recv_exact(f, 32))
        free_status = h["status"]
    except (OSError, wire.Closed) as e:
        check(False, "no reply to FREE: %s" % e)
    freed = time.monotonic()
    cpu1 = cpu_seconds()
    tt.join(max(0.0, t0 + timeout + slack - time.monotonic()))
    dropped = times[1] != 0
    stop.set()
    tt.join()
    v.join()
    window = freed - t0
    cpu = cpu1 - cpu0
    print("free: the trickling WRITE was %s after %.2f s, the FREE answered %s after %.2f s; "
          "memserver CPU %.3f s over those %.2f s; verifier: %d write+read, %d errors"
          % ("dropped" if dropped else "NOT dropped", (times[1] or freed) - t0, free_status,
             window, cpu, window, vres[0], vres[1]))
    check(dropped and times[1] - t0 <= timeout + slack,
          "the trickler was not dropped within --message-timeout %.0f s (+%.1f)" % (timeout, slack))
    check(window <= timeout + slack, "the FREE waited %.2f s" % window)
    check(free_status == 0, "FREE of the slab answered %s, not 0" % free_status)
    check(cpu < 0.25 * window, "the memserver used %.3f s of CPU in %.2f s while a release "
          "waited (spinning?)" % (cpu, window))
    check(vres[0] >= 10 and vres[1] == 0, "verifier: %d ops, %d errors" % tuple(vres))
    f.close()


def slow_reader():
    s, _ = wire.session(host, port, key)
    st, slab = wire.alloc(s)
    check(st == 0, "slow reader: ALLOC answered errno %d" % st)
    # Small receive buffer, so that the server's replies back up at once.
    s.setsockopt(wire.socket.SOL_SOCKET, wire.socket.SO_RCVBUF, 4096)
    for k in range(8):
        s.sendall(wire.header(wire.READ, 16, k + 1) + struct.pack("<IIQ", slab, 1 << 20, 0))
    return s


def mode_attack():
    for rnd in range(3):
        stop = threading.Event()
        socks, threads, times = [], [], []
        for _ in range(4):
            s, _ = wire.session(host, port, key)
            st, slab = wire.alloc(s)
            check(st == 0, "trickler: ALLOC answered errno %d" % st)
            ts = [0.0, 0.0]
            th = threading.Thread(target=trickle, args=(s, slab, 1 << 20, stop, ts))
            th.start()
            socks.append(s)
            threads.append(th)
            times.append(ts)
        reader = slow_reader()
        t0 = time.monotonic()
        time.sleep(timeout + slack)
        reader_closed = closed(reader, 3)
        stop.set()
        for th in threads:
            th.join()
        late = [a for a, b in times if not b or b - a > timeout + slack]
        print("attack round %d: %d of 4 tricklers dropped in time, slow reader %s after %.1f s"
              % (rnd, 4 - len(late), "closed" if reader_closed else "NOT closed",
                 time.monotonic() - t0))
        check(not late, "round %d: %d tricklers outlived --message-timeout" % (rnd, len(late)))
        check(reader_closed, "round %d: a peer that does not read its replies was not dropped"
              % rnd)
        for s in socks + [reader]:
            s.close()


{"free": mode_free, "attack": mode_attack}[mode]()
sys.exit(1 if failures else 0)
