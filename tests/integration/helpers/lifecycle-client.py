#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# lifecycle-client.py HOST PORT KEYFILE LOGFILE PAUSE_SECONDS: try to interleave session
# transitions on a memserver started with RDMASWAP_TEST_LIFECYCLE_PAUSE_MS (it sleeps inside
# the detach of a session and inside a takeover, after logging "lifecycle pause"), and check
# that no transition is lost:
#   rejoin:   a bound session's last connection closes; while its detach is paused, its client
#             joins it again with its token, then allocates a new slab and reads the old one:
#             the old slab must still be the session's, with its bytes (the old memserver freed
#             it, the LIFO free list handed it back as the "new" slab, and the old grant read
#             zeros with success).
#   takeover: while a bound session's detach is paused, a new session binds the same volume:
#             it must take over every slab, with its bytes (the old memserver freed them
#             between the bind and the move, and the takeover got 0 slabs).
#   ended:    an unbound session whose last connection closed can no longer be joined
#             (ENOENT), and its slabs are freed.
# Prints one line per case; exits 1 if a check failed.
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

host, port, key = sys.argv[1], int(sys.argv[2]), wire.load_key(sys.argv[3])
logfile, pause = sys.argv[4], float(sys.argv[5])
volume_secret = os.urandom(32)  # this client's volume key (one host: every bind proves it)
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr, flush=True)


def pattern(tag, n):
    return bytes((tag * 31 + i * 7) & 0xff for i in range(n))


def wait_log(needle, timeout=10):
    """Wait until the memserver's log has a line containing `needle`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(logfile, errors="replace") as f:
            if needle in f.read():
                return True
        time.sleep(0.02)
    return False


def bound_session(volume, nslabs):
    """A new session bound to `volume` (lease 30 s) with `nslabs` slabs, each written with its
    own pattern. Returns (socket, hello reply, {slab: bytes})."""
    s, info = wire.session(host, port, key)
    st, _ = wire.bind(s, info, wire.VolumeKey(volume_secret, volume), 30)
    if st:
        raise RuntimeError("BIND %s: errno %d" % (volume, st))
    slab = info["slab_size"]
    written = {}
    for k in range(nslabs):
        st, sid = wire.alloc(s)
        if st:
            raise RuntimeError("ALLOC: errno %d" % st)
        data = pattern(sid + k + 1, slab)
        st, _ = wire.io(s, wire.WRITE, sid, 0, slab, data)
        if st:
            raise RuntimeError("WRITE: errno %d" % st)
        written[sid] = data
    return s, info, written


def read_back(s, written, who):
    for sid, data in written.items():
        st, got = wire.io(s, wire.READ, sid, 0, len(data))
        check(st == 0, "%s: READ of its slab %d answered errno %d" % (who, sid, st))
        if st == 0:
            check(got == data, "%s: slab %d does not hold its bytes (%s)" %
                  (who, sid, "zeros" if got == bytes(len(got)) else "other bytes"))


def rejoin():
    s1, info, written = bound_session("race-rejoin", 1)
    sid = info["session_id"]
    (old,) = written
    s1.close()
    check(wait_log("lifecycle pause of %d ms in the detach of session %016x"
                   % (pause * 1000, sid)), "rejoin: no lifecycle pause in the memserver's log")
    t0 = time.monotonic()
    s2 = wire.connect(host, port, timeout=pause + 20)
    check(wire.authenticate(s2, key) == 0, "rejoin: authentication refused")
    st, _ = wire.hello(s2, sid, info["token"])
    took = time.monotonic() - t0
    check(st == 0, "rejoin: HELLO join of the detached session answered errno %d" % st)
    # Whatever the memserver was doing in the pause is over now.
    time.sleep(max(0.0, pause + 0.5 - took))
    st, new = wire.alloc(s2)
    check(st == 0, "rejoin: ALLOC answered errno %d" % st)
    check(new != old, "rejoin: ALLOC handed out slab %d again, which the session still held"
          % old)
    read_back(s2, written, "rejoin")
    st, ids = wire.list_slabs(s2)
    check(st == 0 and old in ids, "rejoin: LIST %s lacks the session's slab %d" % (ids, old))
    print("rejoin: HELLO join during the detach took %.2f s; the session's slab %d, its new "
          "slab %d" % (took, old, new))
    s2.close()


def takeover():
    s1, info, written = bound_session("race-takeover", 3)
    sid = info["session_id"]
    s1.close()
    check(wait_log("lifecycle pause of %d ms in the detach of session %016x"
                   % (pause * 1000, sid)), "takeover: no lifecycle pause in the memserver's log")
    s3, info3 = wire.session(host, port, key)
    s3.settimeout(2 * pause + 20)
    t0 = time.monotonic()
    st, rep = wire.bind(s3, info3, wire.VolumeKey(volume_secret, "race-takeover"), 30)
    took = time.monotonic() - t0
    check(st == 0, "takeover: BIND answered errno %d" % st)
    check(rep.get("reattached") == 1, "takeover: BIND did not take the volume over: %s" % rep)
    check(rep.get("slabs") == len(written), "takeover: BIND took over %s slabs, not %d"
          % (rep.get("slabs"), len(written)))
    read_back(s3, written, "takeover")
    st, ids = wire.list_slabs(s3)
    check(st == 0 and sorted(ids) == sorted(written),
          "takeover: LIST %s, expected %s" % (ids, sorted(written)))
    print("takeover: BIND during the detach took %.2f s and took over %s of %d slabs"
          % (took, rep.get("slabs"), len(written)))
    s3.close()


def ended():
    s, info = wire.session(host, port, key)
    st, sid = wire.alloc(s)
    check(st == 0, "ended: ALLOC answered errno %d" % st)
    s.close()
    end = time.monotonic() + 10
    while True:
        s2 = wire.connect(host, port)
        check(wire.authenticate(s2, key) == 0, "ended: authentication refused")
        st, _ = wire.hello(s2, info["session_id"], info["token"])
        s2.close()
        # The close may not have been seen yet: then the join succeeds and is left again.
        if st == wire.ENOENT or time.monotonic() > end:
            break
        time.sleep(0.1)
    check(st == wire.ENOENT, "ended: HELLO join of an ended session answered %d, not ENOENT"
          % st)
    print("ended: joining an ended session is refused with errno %d" % st)


for case in (rejoin, takeover, ended):
    try:
        case()
    except (OSError, wire.Closed, RuntimeError) as e:
        check(False, "%s: %s: %s" % (case.__name__, type(e).__name__, e))
sys.exit(1 if failures else 0)
