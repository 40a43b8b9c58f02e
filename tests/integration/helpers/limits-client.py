#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# limits-client.py MODE HOST PORT KEYFILE ARGS...: a key holder that runs into the memserver's
# per-peer limits, speaking the wire protocol byte by byte (rdmaswap_wire.py).
#   refusals MAX_LEASE MAX_FLOORS MAX_SESSIONS SECONDS: BIND with lease MAX_LEASE+1 must get
#       ERANGE (MAX_LEASE itself is accepted); MAX_FLOORS epoch floors are set, one more gets
#       ENOSPC; MAX_SESSIONS sessions are opened from 127.0.0.4, one more gets EUSERS, and
#       after one of them closes a new one is accepted again. Round after round, for at least
#       SECONDS (each round's volume takes over the last one's detached session).
#   legit SRC N RATE TIMEOUT: N connections from source address SRC, started RATE per second,
#       each must finish AUTH + HELLO within TIMEOUT seconds; prints how many did.
#   churn N: N sessions opened and closed one after the other, as fast as possible.
#   floors SESSIONS FLOORS LEASE: SESSIONS sessions, each bound to a volume with LEASE seconds
#       and given FLOORS epoch floors, then closed (detached: kept for the lease).
# Prints one line per check; exits 1 if a check failed.
import os
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

ERANGE, ENOSPC, EUSERS = 34, 28, 87
mode, host, port, key = sys.argv[1], sys.argv[2], int(sys.argv[3]), wire.load_key(sys.argv[4])
args = sys.argv[5:]
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def session_from(src, timeout=10):
    """An authenticated connection from source address `src` and HELLO: (socket, status)."""
    s = wire.socket.create_connection((host, port), timeout=timeout, source_address=(src, 0))
    st = wire.authenticate(s, key)
    if st:
        return s, st
    st, info = wire.hello(s)
    _hello_info[s] = info
    return s, st


_hello_info = {}      # socket -> its HELLO reply (what a BIND on it signs)
_secret = os.urandom(32)  # this client's volume key


def bind(s, name, lease_s):
    """BIND the session of connection `s` to `name`, with a valid proof of our volume key."""
    return wire.bind(s, _hello_info[s], wire.VolumeKey(_secret, name), lease_s)


def set_floor(s, chunk, epoch):
    return wire.call(s, wire.SET_TAG, struct.pack("<IIQQ", 0xffffffff, 0, chunk, epoch))[0]


def refusals(max_lease, max_floors, max_sessions):
    s, st = session_from("127.0.0.1")
    check(st == 0, "HELLO answered %d" % st)
    st, _ = bind(s, "limits-big-lease", max_lease + 1)
    check(st == ERANGE, "BIND with lease %d (--max-lease %d) answered %d, want ERANGE"
          % (max_lease + 1, max_lease, st))
    st, _ = bind(s, "limits-vol", max_lease)
    check(st == 0, "BIND with lease %d (= --max-lease) answered %d" % (max_lease, st))
    # Floors: pipelined, so that a large limit takes no round trip per floor.
    batch = 256
    statuses = []
    for start in range(1, max_floors + 2, batch):    # floors 1 .. max_floors + 1
        n = min(batch, max_floors + 2 - start)
        s.sendall(b"".join(wire.header(wire.SET_TAG, 24, start + k) +
                           struct.pack("<IIQQ", 0xffffffff, 0, start + k, 7) for k in range(n)))
        for _ in range(n):
            statuses.append(wire.parse_header(wire.recv_exact(s, 32))["status"])
    check(all(x == 0 for x in statuses[:max_floors]),
          "%d floors set (--max-floors %d): %d refused"
          % (max_floors, max_floors, sum(1 for x in statuses[:max_floors] if x)))
    check(statuses[max_floors] == ENOSPC, "floor %d answered %d, want ENOSPC"
          % (max_floors + 1, statuses[max_floors]))
    # Replacing an existing floor and removing one are still allowed at the limit.
    check(set_floor(s, 1, 9) == 0, "raising an existing floor at the limit")
    check(set_floor(s, 1, 0) == 0, "removing a floor")
    check(set_floor(s, max_floors + 5, 9) == 0, "a new floor after one was removed")
    set_floor(s, max_floors + 5, 0)    # the next round's takeover finds max_floors - 1
    s.close()
    # Sessions from one address (127.0.0.4: no other test client uses it).
    socks = []
    for i in range(max_sessions):
        t, st = session_from("127.0.0.4")
        socks.append(t)
        if st:
            check(False, "session %d of %d from 127.0.0.4 answered %d" % (i + 1, max_sessions, st))
            break
    t, st = session_from("127.0.0.4")
    check(st == EUSERS, "session %d from 127.0.0.4 (--max-peer-sessions %d) answered %d, want "
          "EUSERS" % (max_sessions + 1, max_sessions, st))
    t.close()
    t, st = session_from("127.0.0.5")
    check(st == 0, "a session from another address (127.0.0.5) answered %d" % st)
    t.close()
    socks.pop().close()           # one ends: its count is released
    deadline = time.monotonic() + 5
    while True:
        t, st = session_from("127.0.0.4")
        t.close()
        if st == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    check(st == 0, "a new session from 127.0.0.4 after one ended answered %d" % st)
    for t in socks:
        t.close()


def legit(src, n, rate, timeout):
    n, rate, timeout = int(n), float(rate), float(timeout)
    ok = [0]
    errors = {}
    lock = threading.Lock()

    def one():
        t0 = time.monotonic()
        try:
            s, st = session_from(src, timeout)
            s.close()
            good = st == 0 and time.monotonic() - t0 <= timeout
            why = "errno %d" % st if st else "slow"
        except (OSError, wire.Closed) as e:
            good, why = False, type(e).__name__
        with lock:
            if good:
                ok[0] += 1
            else:
                errors[why] = errors.get(why, 0) + 1

    threads = []
    start = time.monotonic()
    for i in range(n):
        due = start + i / rate
        time.sleep(max(0.0, due - time.monotonic()))
        th = threading.Thread(target=one)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    print("legit: %d of %d connections from %s finished AUTH+HELLO within %.0f s (%.0f%%) "
          "in %.1f s; failures: %s" % (ok[0], n, src, timeout, 100.0 * ok[0] / n,
                                        time.monotonic() - start, errors or "none"), flush=True)


def churn(n):
    n = int(n)
    t0 = time.monotonic()
    bad = 0
    for _ in range(n):
        s, st = session_from("127.0.0.1")
        bad += st != 0
        s.close()
    took = time.monotonic() - t0
    print("churn: %d sessions opened and closed in %.1f s (%.0f/s), %d refused"
          % (n, took, n / took, bad), flush=True)
    check(bad == 0, "every churned session was accepted")


def set_floors(s, first, count, epoch=7, batch=512):
    """Set `count` floors from chunk `first`, pipelined; returns how many were refused."""
    bad = 0
    for start in range(first, first + count, batch):
        n = min(batch, first + count - start)
        s.sendall(b"".join(wire.header(wire.SET_TAG, 24, start + k) +
                           struct.pack("<IIQQ", 0xffffffff, 0, start + k, epoch)
                           for k in range(n)))
        for _ in range(n):
            bad += wire.parse_header(wire.recv_exact(s, 32))["status"] != 0
    return bad


def floors(sessions, count, lease):
    for k in range(int(sessions)):
        s, st = session_from("127.0.0.1")
        check(st == 0, "HELLO answered %d" % st)
        st, _ = bind(s, "floors-%d" % k, int(lease))
        check(st == 0, "BIND answered %d" % st)
        bad = set_floors(s, 0, int(count))
        check(bad == 0, "session %d: %s floors set, %d refused" % (k, count, bad))
        s.close()


def refusal_rounds(max_lease, max_floors, max_sessions, seconds):
    end = time.monotonic() + seconds
    rounds = 0
    while not failures and (rounds == 0 or time.monotonic() < end):
        refusals(max_lease, max_floors, max_sessions)
        rounds += 1
        time.sleep(0.5)    # below --connect-rate (50/s) from 127.0.0.4
    print("refusals: %d rounds" % rounds, flush=True)


{"refusals": lambda: refusal_rounds(*map(int, args)), "legit": lambda: legit(*args),
 "churn": lambda: churn(*args), "floors": lambda: floors(*args)}[mode]()
sys.exit(1 if failures else 0)
