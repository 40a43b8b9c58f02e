#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# parked-reads-client.py HOST PORT KEYFILE MEMSERVER_PID MESSAGE_TIMEOUT: key holders whose own
# READ replies would hold a worker (issue 25, defect 2). Each of N connections (more than the
# memserver's workers) opens a session, ALLOCs a slab, then sends 8 pipelined 1 MiB READs of it
# and a FREE of it, and never reads a reply (its receive buffer is tiny, so the replies back up
# in the memserver). The FREE parks the connection on a worker; its release must not wait for
# the READ replies that only the parked connection can send. Checks:
#   1. a fresh client completes AUTH, HELLO, ALLOC and FREE within a few seconds meanwhile;
#   2. the memserver drops each hostile connection within the message timeout (+ slack): a
#      parked connection's replies have the same deadline as any other's;
#   3. then every slab is free again (the FREEs took effect, nothing leaked);
#   4. with a second round of hostile connections in place, SIGTERM ends the memserver within a
#      few seconds.
# Prints one line per step; exits 1 if a check failed.
import os
import signal
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

host, port, key = sys.argv[1], int(sys.argv[2]), wire.load_key(sys.argv[3])
pid, timeout = int(sys.argv[4]), float(sys.argv[5])
mult = wire.SLOW
prompt = 3.0 * mult    # a fresh client's handshake, ALLOC and FREE
slack = 2.0 * mult     # beyond the message timeout, for the loop's 100 ms tick and the load
hostile_n = 6          # more than the memserver's 4 workers
TCP_ESTABLISHED = 1    # tcpi_state, the first byte of struct tcp_info
check, failures = wire.check, wire.failures


def hostile():
    """One connection that ALLOCs a slab, then sends 8 READs of 1 MiB and a FREE of it, reading
    none of the replies. Returns the socket (kept open)."""
    s, _ = wire.session(host, port, key, timeout=prompt, rcvbuf=4096)  # a tiny window
    st, slab = wire.alloc(s)
    if st:
        raise RuntimeError("ALLOC refused: errno %d" % st)
    msgs = b"".join(wire.header(wire.READ, 16, 100 + k) + struct.pack("<IIQ", slab, 1 << 20, 0)
                    for k in range(8))
    msgs += wire.header(wire.FREE, 8, 200) + struct.pack("<II", slab, 0)
    s.sendall(msgs)
    return s


def hostiles(what):
    """hostile_n hostile connections; stops at the first that cannot get through its HELLO
    and ALLOC within `prompt` (the workers are held)."""
    socks = []
    for i in range(hostile_n):
        try:
            socks.append(hostile())
        except (OSError, wire.Closed, RuntimeError) as e:
            check(False, "%s: hostile connection %d of %d did not get through: %s: %s"
                  % (what, i + 1, hostile_n, type(e).__name__, e))
            break
    return socks


def fresh_client():
    """AUTH, HELLO, ALLOC, FREE on a new connection, each reply bounded by what is left of
    `prompt`. Returns (seconds taken, error or None)."""
    t0 = time.monotonic()
    try:
        s = wire.connect(host, port, timeout=prompt)
        deadline = t0 + prompt

        def left():
            r = deadline - time.monotonic()
            if r <= 0:
                raise TimeoutError("out of time")
            return r
        s.settimeout(left())
        if wire.authenticate(s, key):
            return time.monotonic() - t0, "authentication refused"
        s.settimeout(left())
        st, _ = wire.hello(s)
        if st:
            return time.monotonic() - t0, "HELLO answered errno %d" % st
        s.settimeout(left())
        st, slab = wire.alloc(s)
        if st:
            return time.monotonic() - t0, "ALLOC answered errno %d" % st
        s.settimeout(left())
        st = wire.free(s, slab)
        if st:
            return time.monotonic() - t0, "FREE answered errno %d" % st
        s.close()
        return time.monotonic() - t0, None
    except (OSError, wire.Closed, RuntimeError) as e:
        return time.monotonic() - t0, "%s: %s" % (type(e).__name__, e)


def closed_by_server(s, until):
    """True if the server closes (or resets) `s` before `until` (monotonic). Reads nothing:
    reading the replies would make the peer a fast one. The socket's TCP state (TCP_INFO)
    leaves ESTABLISHED when the server's FIN or reset arrives."""
    while time.monotonic() < until:
        if s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] != TCP_ESTABLISHED:
            return True
        time.sleep(0.05)
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] != TCP_ESTABLISHED


def stats():
    s = wire.connect(host, port, timeout=5 * mult)
    if wire.authenticate(s, key):
        raise RuntimeError("authentication refused")
    st, info = wire.stats(s)
    s.close()
    if st:
        raise RuntimeError("STATS answered errno %d" % st)
    return info


def exited():
    """True once the memserver has exited (gone, or a zombie its parent has not reaped)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


total = stats()["slabs_total"]

# Round 1: the hostile connections, then a fresh client beside them.
t_round = time.monotonic()
socks = hostiles("round 1")
time.sleep(0.5)  # their FREEs are on the workers by now
took, err = fresh_client()
print("round 1: %d connections with 8 unread 1 MiB READs and a FREE each; a fresh client's "
      "HELLO+ALLOC+FREE took %.2f s (%s)" % (len(socks), took, err or "ok"), flush=True)
check(err is None, "a fresh client did not get through within %.1f s beside %d hostile "
      "connections: %s" % (prompt, len(socks), err))
check(not exited(), "the memserver died")

# The memserver drops every hostile connection once its first reply is overdue.
until = t_round + timeout + slack + 0.5
dropped = sum(closed_by_server(s, until) for s in socks)
print("round 1: %d of %d hostile connections dropped within %.1f s" %
      (dropped, len(socks), until - t_round), flush=True)
check(dropped == len(socks), "%d hostile connections outlived --message-timeout %.0f s (+%.1f)"
      % (len(socks) - dropped, timeout, slack))
for s in socks:
    s.close()

# Every slab comes back (the FREEs took effect once the READ replies were given up).
free = -1
end = time.monotonic() + 5 * mult
while time.monotonic() < end:
    free = stats()["slabs_free"] if not exited() else -1
    if free == total:
        break
    time.sleep(0.1)
print("after round 1: %d of %d slabs free" % (free, total), flush=True)
check(free == total, "%d of %d slabs free after the hostile sessions ended" % (free, total))

# Round 2: SIGTERM with the hostile connections in place.
socks = hostiles("round 2")
time.sleep(0.5)
t0 = time.monotonic()
os.kill(pid, signal.SIGTERM)
bound = 3.0 * mult
while not exited() and time.monotonic() - t0 < bound:
    time.sleep(0.05)
gone = exited()
print("round 2: SIGTERM beside %d hostile connections: memserver %s after %.2f s"
      % (len(socks), "exited" if gone else "still running", time.monotonic() - t0), flush=True)
check(gone, "the memserver did not exit within %.1f s of SIGTERM" % bound)
for s in socks:
    s.close()

sys.exit(1 if failures else 0)
