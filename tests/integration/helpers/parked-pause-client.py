#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# parked-pause-client.py HOST PORT KEYFILE LOGFILE PAUSE_SECONDS MESSAGE_TIMEOUT: a parked
# connection's queued replies still go out and still time out while its worker is busy, against a
# memserver started with RDMASWAP_TEST_LIFECYCLE_PAUSE_MS (it sleeps inside a takeover, on the
# BIND's worker, with the BIND's connection parked) and --message-timeout shorter than the pause.
#   1. A session bound to a volume (with a lease) closes and detaches.
#   2. Connection A (a new session) sends 8 READs of 1 MiB of its own slab, then a BIND of the
#      volume: the takeover parks A for the pause. A reads its replies as they come: all 8 must
#      arrive within a second or two, long before the BIND's reply (the memserver this test was
#      written for sent no more of a parked connection's replies than its socket took at once).
#   3. Connection B (another session) sends 8 READs of 1 MiB of its slab, reads none, then a
#      BIND of another volume, which waits for the takeover's lifecycle mutex: B is parked too.
#      The memserver must drop B within the message timeout (+ slack), while A's takeover is
#      still paused (it used to check no deadline of a parked connection).
#   4. A's BIND then answers with the volume taken over.
# Prints one line per step; exits 1 if a check failed.
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

host, port, key = sys.argv[1], int(sys.argv[2]), wire.load_key(sys.argv[3])
logfile, pause, timeout = sys.argv[4], float(sys.argv[5]), float(sys.argv[6])
mult = wire.SLOW
slack = 1.5 * mult
secret = os.urandom(32)
TCP_ESTABLISHED = 1
check, failures = wire.check, wire.failures


def log_has(needle):
    with open(logfile, errors="replace") as f:
        return needle in f.read()


def wait_log(needle, wait):
    end = time.monotonic() + wait
    while time.monotonic() < end:
        if log_has(needle):
            return True
        time.sleep(0.02)
    return False


def bind_message(s, info, volume, lease_s, request_id):
    """A BIND request of `volume` for the session of `info` (connection `s`), not sent."""
    vkey = wire.VolumeKey(secret, volume)
    proof = vkey.sign(wire.bind_message(info["challenge"], info["session_id"], volume, lease_s,
                                        vkey.public))
    body = volume.encode().ljust(64, b"\0") + struct.pack("<II", lease_s, 0) + vkey.public + proof
    return wire.header(wire.BIND, len(body), request_id) + body


def reads(slab, first_id):
    return b"".join(wire.header(wire.READ, 16, first_id + k) + struct.pack("<IIQ", slab, 1 << 20, 0)
                    for k in range(8))


def session(rcvbuf=None):
    s, info = wire.session(host, port, key, timeout=10 * mult, rcvbuf=rcvbuf)
    st, slab = wire.alloc(s)
    if st:
        raise RuntimeError("ALLOC answered errno %d" % st)
    return s, info, slab


# 1. A detached session of volume "pp-v".
s, info, _ = session()
st, _ = wire.bind(s, info, wire.VolumeKey(secret, "pp-v"), 60)
check(st == 0, "BIND of the first session answered errno %d" % st)
s.close()
detached = "session %016x detached" % info["session_id"]
check(wait_log(detached, pause + 10 * mult), "the first session did not detach")

# 2. A: 8 READs and the takeover, replies read as they come.
a, ainfo, aslab = session()
b, binfo, bslab = session(rcvbuf=4096)
t0 = time.monotonic()
a.sendall(reads(aslab, 100) + bind_message(a, ainfo, "pp-v", 0, 200))
# 3. B: 8 READs never read, and a BIND that waits for the lifecycle mutex, which the takeover
# holds through its pause (so B's BIND goes after it has begun).
check(wait_log("in the takeover of session %016x" % ainfo["session_id"], 5 * mult),
      "A: the takeover did not begin (no lifecycle pause in the log)")
t_b = time.monotonic()
b.sendall(reads(bslab, 300) + bind_message(b, binfo, "pp-w", 0, 400))
got, bind_reply = 0, None
a.settimeout(0.2)
buf = b""
b_closed = None
while time.monotonic() - t0 < pause + 10 * mult and (got < 8 or bind_reply is None):
    try:
        chunk = a.recv(1 << 20)
        if not chunk:
            break
        buf += chunk
    except (TimeoutError, socket.timeout):
        pass
    while len(buf) >= 32:
        h = wire.parse_header(buf[:32])
        if len(buf) < 32 + h["body_len"]:
            break
        body, buf = buf[32:32 + h["body_len"]], buf[32 + h["body_len"]:]
        if h["op"] == wire.READ:
            got += 1
            check(h["status"] == 0 and len(body) == 1 << 20, "A: READ answered %d" % h["status"])
            if got == 8:
                t_reads = time.monotonic() - t0
                paused = not log_has("took over")
        elif h["op"] == wire.BIND:
            bind_reply = (h["status"], struct.unpack("<IIQ", body) if len(body) == 16 else None)
            t_bind = time.monotonic() - t0
    if b_closed is None and b.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] != \
            TCP_ESTABLISHED:
        b_closed = time.monotonic() - t_b
        b_paused = not log_has("took over")

check(got == 8, "A: %d of 8 READ replies arrived" % got)
if got == 8:
    print("A: 8 READ replies (8 MiB) taken %.2f s after the takeover began (%s)"
          % (t_reads, "during its pause" if paused else "after it"), flush=True)
    check(paused and t_reads < 2 * mult, "A: the READ replies of a parked connection came %.2f s "
          "after the requests, %s" % (t_reads, "during the pause" if paused else "after the pause"))
print("B: %s" % ("dropped %.2f s after its requests (%s)" % (b_closed, "the takeover still paused"
                 if b_paused else "after the takeover") if b_closed else "not dropped"), flush=True)
check(b_closed is not None and b_closed < timeout + slack and b_paused,
      "B: a parked connection with untaken replies was not dropped within --message-timeout "
      "%.0f s (+%.1f) while its worker waited" % (timeout, slack))
check(bind_reply is not None and bind_reply[0] == 0 and bind_reply[1] and bind_reply[1][0] == 1,
      "A: the takeover BIND answered %s" % (bind_reply,))
if bind_reply:
    print("A: BIND answered %s after %.2f s" % (bind_reply, t_bind), flush=True)
a.close()
b.close()
sys.exit(1 if failures else 0)
