#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# many-conn-client.py MODE HOST PORT KEYFILE STOPFILE MAX_SECONDS ARGS...: connections that cost
# a memserver nothing but their existence (test-many-connections.sh), speaking the wire
# protocol byte by byte (rdmaswap_wire.py). Each mode sets itself up, prints one line starting
# with "ready:", then sits until the file STOPFILE exists (at most MAX_SECONDS), and prints
# what became of its connections.
#   idle SESSIONS PER_SESSION: SESSIONS new sessions, each with PER_SESSION connections (the
#       first says HELLO for a new session, the others join it), all authenticated, then idle.
#       At the end every one of them must still be open (the server closed none).
#   nonreader: one session that ALLOCs a slab and sends READs of 1 MiB of it, whole requests
#       only, as fast as it can and never reads a reply, until it cannot send for 1 s (its
#       send buffer and the server's receive buffer are full), then sits there.
# Exits 1 if the setup or a check failed.
import os
import select
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

mode, host, port, key = sys.argv[1], sys.argv[2], int(sys.argv[3]), wire.load_key(sys.argv[4])
stopfile, max_seconds = sys.argv[5], float(sys.argv[6])
args = sys.argv[7:]
start = time.monotonic()


def sit():
    """Wait for STOPFILE (at most MAX_SECONDS from the start); False if the time ran out."""
    while not os.path.exists(stopfile):
        if time.monotonic() - start > max_seconds:
            return False
        time.sleep(0.2)
    return True


def peer_closed(s):
    """True if the server has closed `s` (it sends an idle connection nothing)."""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(4096) == b""
    except OSError:
        return True


def authenticated():
    s = wire.connect(host, port)
    st = wire.authenticate(s, key)
    if st:
        sys.exit("authentication refused: errno %d" % st)
    return s


def idle(sessions, per_session):
    socks = []
    for i in range(sessions):
        s = authenticated()
        st, info = wire.hello(s)
        if st:
            sys.exit("HELLO of session %d answered errno %d" % (i, st))
        socks.append(s)
        for j in range(per_session - 1):
            t = authenticated()
            st, _ = wire.hello(t, info["session_id"], info["token"])
            if st:
                sys.exit("HELLO joining session %d (connection %d) answered errno %d"
                         % (i, j + 2, st))
            socks.append(t)
    print("ready: %d idle connections in %d sessions, opened in %.1f s"
          % (len(socks), sessions, time.monotonic() - start), flush=True)
    in_time = sit()
    gone = sum(1 for s in socks if peer_closed(s))
    print("idle: %d of %d connections still open after %.1f s%s"
          % (len(socks) - gone, len(socks), time.monotonic() - start,
             "" if in_time else " (no stop file: MAX_SECONDS ran out)"), flush=True)
    if gone or not in_time:
        sys.exit(1)


def nonreader():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A small receive buffer (set before connecting, so that the window is small too): the
    # server's replies back up at once.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect((host, port))
    st = wire.authenticate(s, key)
    if st:
        sys.exit("authentication refused: errno %d" % st)
    st, _ = wire.hello(s)
    if st:
        sys.exit("HELLO answered errno %d" % st)
    st, slab = wire.alloc(s)
    if st:
        sys.exit("ALLOC answered errno %d" % st)
    batch = 64
    sent = 0
    idle_since = time.monotonic()
    # Whole requests only: a batch goes out when the socket is writable, which on Linux means
    # far more room than one batch; a rare partial send is finished before stopping.
    while time.monotonic() - idle_since < 1.0 and sent < (1 << 22):
        if time.monotonic() - start > max_seconds:
            sys.exit("nonreader: still sending after %.0f s" % max_seconds)
        if not select.select([], [s], [], 0.1)[1]:
            continue
        buf = b"".join(wire.header(wire.READ, 16, sent + k + 1) +
                       struct.pack("<IIQ", slab, 1 << 20, 0) for k in range(batch))
        try:
            n = s.send(buf, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        except OSError as e:
            sys.exit("nonreader: send failed after %d requests: %s" % (sent, e))
        if n < len(buf):
            s.settimeout(5)
            try:
                s.sendall(buf[n:])
            except OSError as e:
                sys.exit("nonreader: could not finish a partly sent batch: %s" % e)
        sent += batch
        idle_since = time.monotonic()
    print("ready: nonreader sent %d READs of 1 MiB in %.1f s and reads no reply"
          % (sent, time.monotonic() - start), flush=True)
    in_time = sit()
    print("nonreader: connection %s after %.1f s%s"
          % ("closed by the server" if peer_closed(s) else "still open",
             time.monotonic() - start, "" if in_time else " (no stop file: MAX_SECONDS ran out)"),
          flush=True)
    if not in_time:
        sys.exit(1)


{"idle": lambda: idle(*map(int, args)), "nonreader": nonreader}[mode]()
