#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# volume-key-client.py HOST PORT AUTHKEY OWNER_VOLUME_KEY VOLUME: a cluster-key holder without the
# owner's volume key tries to bind the owner's detached volume VOLUME on the memserver:
#   - with the owner's public key (computed from the owner's key file, as the public key is no
#     secret) and a signature by another key, by the right key over another challenge, a
#     flipped bit of a real-looking proof, or no proof: each BIND must be refused with EPERM;
#   - with a public key of its own and a valid proof: BIND succeeds but takes nothing over (a
#     different volume), and LIST shows no slab;
#   - a client of protocol version 1 gets an error header of version 2 before the close.
# Prints one line per attempt; exits 1 if a check failed. Never sees the owner's secret except
# to compute the public key (the test's stand-in for reading it off the wire).
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

host, port = sys.argv[1], int(sys.argv[2])
key = wire.load_key(sys.argv[3])
owner = wire.VolumeKey(wire.load_key(sys.argv[4]), sys.argv[5])
volume = sys.argv[5]
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, file=sys.stderr if not ok else sys.stdout,
          flush=True)
    if not ok:
        failures.append(what)


def attempt(what, make_proof):
    s, info = wire.session(host, port, key)
    try:
        msg = wire.bind_message(info["challenge"], info["session_id"], volume, 30, owner.public)
        st, rep = wire.bind(s, info, owner, 30, proof=make_proof(msg, info))
        check(st == wire.EPERM, "%s: BIND of %s with the owner's public key: errno %s %s "
              "(want EPERM)" % (what, volume, st, rep))
        st, ids = wire.list_slabs(s)
        check(st == 0 and ids == [], "%s: the session holds slabs %s" % (what, ids))
    finally:
        s.close()


thief = wire.VolumeKey(os.urandom(32), volume)
attempt("another key's signature", lambda m, i: thief.sign(m))
attempt("the owner's key over another challenge",
        lambda m, i: owner.sign(wire.bind_message(os.urandom(32), i["session_id"], volume, 30,
                                                  owner.public)))
attempt("a flipped bit", lambda m, i: bytes([owner.sign(m)[0] ^ 1]) + owner.sign(m)[1:])
attempt("no proof", lambda m, i: bytes(64))

# Its own key, the same name: bound, but a volume of its own.
s, info = wire.session(host, port, key)
st, rep = wire.bind(s, info, thief, 30)
check(st == 0 and rep.get("reattached") == 0 and rep.get("slabs") == 0,
      "own key: BIND errno %s %s (want 0, nothing taken over)" % (st, rep))
st, ids = wire.list_slabs(s)
check(st == 0 and ids == [], "own key: the session holds slabs %s" % ids)
s.close()

# A client of protocol version 1 (before volume keys): answered in version 2, then closed.
s = wire.connect(host, port)
s.sendall(wire.header(wire.AUTH, 48, request_id=7, version=1) + os.urandom(32) + bytes(16))
try:
    h = wire.parse_header(wire.recv_exact(s, 32))
    check(h["version"] == wire.VERSION and h["status"] != 0 and h["request_id"] == 7 and
          h["body_len"] == 0, "version 1: answered %s" % h)
except wire.Closed as e:
    check(False, "version 1: closed without an answer (%s)" % e)
s.close()

sys.exit(1 if failures else 0)
