#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# A cluster-key holder that tries the admin ops, and a client on another address that looks at
# the session list (tests/integration/test-admin.sh).
#
#   admin-client.py refused HOST PORT CLUSTER_KEY
#       GIVEBACK and LEND with the cluster key get EPERM (and the connection goes on serving);
#       GIVEBACK before authentication gets EACCES. Exit 0 if so.
#   admin-client.py other HOST PORT CLUSTER_KEY SOURCE_ADDR SECONDS
#       From SOURCE_ADDR: make a session, list the sessions with the cluster key (only those
#       of SOURCE_ADDR may show), print "session=ID", then hold the session SECONDS seconds.
import struct
import sys
import time

import rdmaswap_wire as w

GIVEBACK, GIVEBACK_STATUS, LEND = 12, 14, 15
EPERM = 1
SESSION_ENTRY = 160


def fail(msg):
    print("admin-client: FAIL: " + msg, flush=True)
    sys.exit(1)


def sessions(s):
    """Every session this connection may list (VOLUME_LIST what=2, page by page)."""
    out = []
    while True:
        st, body = w.call(s, w.VOLUME_LIST, struct.pack("<IIQ", 2, 0, len(out)))
        if st:
            fail("VOLUME_LIST sessions: errno %d" % st)
        n = struct.unpack_from("<I", body)[0]
        for i in range(n):
            e = body[4 + i * SESSION_ENTRY: 4 + (i + 1) * SESSION_ENTRY]
            sid = struct.unpack_from("<Q", e)[0]
            volume = e[32:96].rstrip(b"\0").decode()
            peer = e[96:160].rstrip(b"\0").decode()
            out.append((sid, volume, peer))
        if n < (1048576 - 4) // SESSION_ENTRY:
            return out


def refused(host, port, key):
    s = w.connect(host, port)
    if w.authenticate(s, key):
        fail("authentication with the cluster key refused")
    body = struct.pack("<Q", 1 << 20)
    for op, name in ((GIVEBACK, "GIVEBACK"), (LEND, "LEND")):
        st, _ = w.call(s, op, body)
        if st != EPERM:
            fail("%s with the cluster key: status %d, expected EPERM" % (name, st))
        print("%s with the cluster key: EPERM" % name, flush=True)
    st, _ = w.call(s, GIVEBACK_STATUS)  # capacity figures are anyone's
    if st:
        fail("GIVEBACK_STATUS after the refusals: errno %d" % st)
    st, _ = w.call(s, w.STATS)
    if st:
        fail("STATS after the refusals: errno %d" % st)
    s.close()
    s = w.connect(host, port)
    st, _ = w.call(s, GIVEBACK, body)
    if st != w.EACCES:
        fail("GIVEBACK before authentication: status %d, expected EACCES" % st)
    print("GIVEBACK before authentication: EACCES", flush=True)


def other(host, port, key, source, seconds):
    s = w.socket.create_connection((host, port), timeout=10, source_address=(source, 0))
    if w.authenticate(s, key):
        fail("authentication refused")
    st, info = w.hello(s)
    if st:
        fail("HELLO: errno %d" % st)
    listed = sessions(s)
    for sid, volume, peer in listed:
        if not peer.startswith(source + ":"):
            fail("a cluster-key holder on %s was shown session %016x of %s (volume %r)" %
                 (source, sid, peer, volume))
    if info["session_id"] not in [sid for sid, _, _ in listed]:
        fail("our own session %016x is not listed: %r" % (info["session_id"], listed))
    print("listed=%d (all from %s)" % (len(listed), source), flush=True)
    print("session=%016x" % info["session_id"], flush=True)
    time.sleep(seconds)


def main():
    mode, host, port, key = sys.argv[1], sys.argv[2], int(sys.argv[3]), w.load_key(sys.argv[4])
    if mode == "refused":
        refused(host, port, key)
    elif mode == "other":
        other(host, port, key, sys.argv[5], float(sys.argv[6]))
    else:
        fail("unknown mode " + mode)


if __name__ == "__main__":
    main()
