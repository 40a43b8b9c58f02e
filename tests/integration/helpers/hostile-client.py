#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# hostile-client.py HOST PORT HANDSHAKE_SECONDS MAX_CONNECTIONS: attack a memserver's TCP port
# with what costs it connections rather than parsing, and check it defends itself:
#   slow:  16 connections that trickle a valid header one byte every 0.2 s, never finishing the
#          handshake: each must be closed by the server within HANDSHAKE_SECONDS (+ slack).
#   hold:  MAX_CONNECTIONS + 100 idle connections opened at once: those beyond the limit must be
#          closed at once (< 1 s), and the rest when the handshake time runs out.
#   storm: 2000 connects, half of them sending random bytes, as fast as possible (most are
#          over --connect-rate: closed at once, with a reset).
# A connect that fails with ECONNRESET was refused at once: on loopback the server's reset
# can come before connect() returns.
# Prints one line per phase; exits 1 if a defence failed or the server stopped accepting.
import os
import random
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

host, port = sys.argv[1], int(sys.argv[2])
handshake, limit = float(sys.argv[3]), int(sys.argv[4])
slack = 1.5
failures = []


def closed_by_peer(s, wait):
    """True if the server closes `s` within `wait` seconds (we send nothing meanwhile)."""
    s.settimeout(wait)
    try:
        while True:
            if not s.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def slow():
    socks = [wire.connect(host, port) for _ in range(16)]
    start = time.monotonic()
    hdr = wire.header(wire.AUTH, 48)
    open_ = set(range(len(socks)))
    closed_at = {}
    i = 0
    while open_ and time.monotonic() - start < handshake + slack + 2:
        for k in list(open_):
            try:
                socks[k].sendall(hdr[i % len(hdr):i % len(hdr) + 1])
            except OSError:
                closed_at[k] = time.monotonic() - start
                open_.discard(k)
        i += 1
        time.sleep(0.2)
    for s in socks:
        s.close()
    worst = max(closed_at.values()) if closed_at else float("inf")
    print("slow: %d/%d trickling connections closed by the server, the last after %.1f s"
          % (len(closed_at), len(socks), worst))
    if open_ or worst > handshake + slack:
        failures.append("slow senders held connections beyond the handshake time")


def hold():
    n = limit + 100
    socks = []
    for _ in range(n):
        try:
            socks.append(wire.connect(host, port, timeout=5))
        except ConnectionResetError:
            socks.append(None)    # closed at once, before connect() even returned
        except OSError as e:
            failures.append("hold: connect failed: %s" % e)
            break
    t0 = time.monotonic()
    closed = [s is None or closed_by_peer(s, 0.05) for s in socks]
    took = time.monotonic() - t0
    at_once = sum(closed)
    later = sum(closed_by_peer(s, handshake + slack) for s, c in zip(socks, closed) if not c)
    for s in socks:
        if s:
            s.close()
    print("hold: %d connections opened, %d closed at once (checked within %.1f s), all %d "
          "closed within the handshake time" % (len(socks), at_once, took, at_once + later))
    if at_once < n - limit:
        failures.append("hold: only %d of %d connections beyond --max-connections %d closed at once"
                        % (at_once, n, limit))
    if at_once + later < len(socks):
        failures.append("hold: idle connections outlived the handshake time")


def storm():
    rng = random.Random(3)
    t0 = time.monotonic()
    ok = reset = errors = 0
    for i in range(2000):
        try:
            s = wire.connect(host, port, timeout=5)
        except ConnectionResetError:
            # Refused (over --connect-rate, say) with a reset that came before connect()
            # returned. The server answered: fine.
            reset += 1
            continue
        except OSError:
            errors += 1
            continue
        ok += 1
        try:
            if i % 2:
                s.sendall(rng.randbytes(rng.randint(1, 64)))
        except OSError:
            pass                  # closed by a server at its limit: fine
        s.close()
    print("storm: 2000 connects (%d established, %d reset, %d failed) in %.1f s"
          % (ok, reset, errors, time.monotonic() - t0))
    if ok + reset < 1000:
        failures.append("storm: only %d of 2000 connects were established or reset" % (ok + reset))


for phase in (slow, hold, storm):
    phase()
# The server still accepts and answers.
deadline = time.monotonic() + handshake + 5
while True:
    try:
        s = wire.connect(host, port)
        st, _ = wire.call(s, wire.STATS)       # unauthenticated: must be refused, not ignored
        s.close()
        if st == wire.EACCES:
            break
        failures.append("STATS without authentication answered %d" % st)
        break
    except (OSError, wire.Closed):
        if time.monotonic() > deadline:
            failures.append("the server no longer answers after the attacks")
            break
        time.sleep(0.2)
for f in failures:
    print("FAIL: " + f, file=sys.stderr)
sys.exit(1 if failures else 0)
