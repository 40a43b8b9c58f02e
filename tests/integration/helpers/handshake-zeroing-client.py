#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# handshake-zeroing-client.py HOST PORT KEYFILE METRICS_URL MESSAGE_TIMEOUT: handshakes must not
# wait behind the release and zeroing of slabs (issue 25, defect 6), against a memserver with
# one worker (--workers 1) and --metrics-listen.
#   A. Zeroing an ended session: 4 sessions that hold every slab end at once, and a prober
#      times full handshakes (connect, AUTH, AUTH_PROOF, HELLO) while their slabs are zeroed.
#   B. A release that must wait: a session's first connection leaves 8 1 MiB READ replies of a
#      slab untaken (they hold the slab until --message-timeout), and its second connection
#      FREEs that slab. The FREE is answered, rdmaswap_memserver_slabs_zeroing counts the slab
#      until the READs are given up, and handshakes timed meanwhile are answered at once, with
#      the slab still waiting (read from /metrics after each one). The memserver this test was
#      written for zeroed on its workers, in one FIFO with the handshakes: B's handshakes waited
#      for the message timeout there.
# Then every slab must be free again. Each handshake must take under 1 s (3 s in a sanitizer
# build). Prints one line per phase; exits 1 if a check failed.
import os
import re
import socket
import struct
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

host, port, key = sys.argv[1], int(sys.argv[2]), wire.load_key(sys.argv[3])
metrics_url, timeout = sys.argv[4], float(sys.argv[5])
mult = wire.SLOW
bound = 1.0 * mult
check, failures = wire.check, wire.failures


def metric(name):
    """The value of an unlabelled sample of /metrics, or None if it is not there."""
    with urllib.request.urlopen(metrics_url, timeout=5 * mult) as r:
        text = r.read().decode()
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return int(float(m.group(1))) if m else None


def handshake():
    """Seconds a full handshake on a new connection took (inf if it failed or took over 4x the
    bound: the connection is given up then)."""
    t0 = time.monotonic()
    try:
        s = wire.connect(host, port, timeout=4 * bound)
        if wire.authenticate(s, key):
            return float("inf")
        st, _ = wire.hello(s)
        s.close()
        return time.monotonic() - t0 if st == 0 else float("inf")
    except (OSError, wire.Closed):
        return float("inf")


def stats():
    s, _ = wire.session(host, port, key)
    st, info = wire.stats(s)
    s.close()
    return info


total = stats()["slabs_total"]

# --- A. Four sessions holding every slab end at once; handshakes meanwhile.
holders = []
for _ in range(4):
    s, _ = wire.session(host, port, key)
    holders.append(s)
granted = 0
while True:
    st, slab = wire.alloc(holders[granted % 4])
    if st:
        break
    # Dirty one byte per slab: nothing depends on it, the wipe covers the whole slab anyway.
    wire.io(holders[granted % 4], wire.WRITE, slab, 0, 1, b"\xa5")
    granted += 1
check(granted == total, "A: %d of %d slabs granted" % (granted, total))
for s in holders:
    s.close()
times = [handshake() for _ in range(10)]
print("A: %d slabs freed by 4 sessions ending; 10 handshakes meanwhile: slowest %.3f s"
      % (granted, max(times)), flush=True)
check(max(times) < bound, "A: a handshake took %.2f s while ended sessions' slabs were zeroed "
      "(bound %.1f s)" % (max(times), bound))

# --- B. A FREE whose release waits for a connection's unread READ replies.
end = time.monotonic() + 10 * mult
while stats()["slabs_free"] != total and time.monotonic() < end:
    time.sleep(0.05)
r = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096) # before connect: a tiny window
r.settimeout(10 * mult)
r.connect((host, port))
check(wire.authenticate(r, key) == 0, "B: authentication refused")
st, info = wire.hello(r)
check(st == 0, "B: HELLO answered errno %d" % st)
st, slab = wire.alloc(r)
check(st == 0, "B: ALLOC answered errno %d" % st)
r.sendall(b"".join(wire.header(wire.READ, 16, 10 + k) + struct.pack("<IIQ", slab, 1 << 20, 0)
                   for k in range(8)))
f = wire.connect(host, port, timeout=timeout + 10 * mult)
check(wire.authenticate(f, key) == 0, "B: authentication refused")
st, _ = wire.hello(f, info["session_id"], info["token"])
check(st == 0, "B: HELLO join answered errno %d" % st)
time.sleep(0.3) # the READ replies are queued and stuck by now
t_free = time.monotonic()
freed = []
threading.Thread(target=lambda: freed.append((wire.free(f, slab), time.monotonic() - t_free)),
                 daemon=True).start()
time.sleep(0.3) # the FREE is on the worker (or done)
times, waiting = [], []
for _ in range(5):
    times.append(handshake())
    try:
        waiting.append(metric("rdmaswap_memserver_slabs_zeroing"))
    except OSError as e:
        waiting.append("error: %s" % e)
    time.sleep(0.05)
elapsed = time.monotonic() - t_free
print("B: FREE of a slab with 8 unread READ replies sent %.2f s ago (%s); handshakes meanwhile "
      "took %s s; slabs waiting to be zeroed after each: %s"
      % (elapsed, "answered %s after %.2f s" % freed[0] if freed else "not answered yet",
         " ".join("%.3f" % t for t in times), waiting), flush=True)
check(max(times) < bound, "B: a handshake took %.2f s while a FREE waited for its slab's "
      "accesses (bound %.1f s)" % (max(times), bound))
check(all(isinstance(w, int) and w >= 1 for w in waiting),
      "B: the freed slab was not counted in rdmaswap_memserver_slabs_zeroing while its READ "
      "replies were pending: %s" % waiting)
end = time.monotonic() + 5 * mult
while not freed and time.monotonic() < end:
    time.sleep(0.05)
check(freed and freed[0][0] == 0, "B: the FREE was not answered 0 within 5 s: %s" % freed)

# The READs are given up at the message timeout; then the slab is zeroed and free.
end = t_free + timeout + 5 * mult
free = zeroing = -1
while time.monotonic() < end:
    free, zeroing = stats()["slabs_free"], metric("rdmaswap_memserver_slabs_zeroing")
    if free == total and zeroing == 0:
        break
    time.sleep(0.1)
print("after B: %d of %d slabs free, %s waiting to be zeroed" % (free, total, zeroing), flush=True)
check(free == total and zeroing == 0, "after B: %d of %d slabs free, %s waiting to be zeroed"
      % (free, total, zeroing))
r.close()
f.close()
sys.exit(1 if failures else 0)
