# SPDX-License-Identifier: MIT
# The rdmaswap wire protocol (common/wire/protocol.h), its authentication (common/wire/auth.h) and volume
# keys (common/wire/volume_key.h) in a few lines of Python, for test clients and impostor servers that
# speak it byte by byte. Volume keys need python3-cryptography (Ed25519).
import hashlib
import hmac
import os
import socket
import struct
import sys

MAGIC, VERSION = 0x57534452, 2
HELLO, ALLOC, FREE, READ, WRITE, STATS, LIST = 1, 2, 3, 4, 5, 6, 7
AUTH, AUTH_PROOF = 16, 17
RESPONSE = 1
EACCES, ENOENT, EPERM = 13, 2, 1
HEADER = struct.Struct("<IBBHIIQQ")


# Sanitizer builds run everything several times slower (the TSan run uses a 3x multiplier):
# a test client's time bounds are multiplied by this.
SLOW = 3.0 if os.environ.get("RDMASWAP_SANITIZER") or os.environ.get("RDMASWAP_NBDKIT_PRELOAD") \
    else 1.0

# A test client's failed checks (check()): it exits 1 if there is any.
failures = []


def check(ok, what):
    """Record and print `what` as a failure unless `ok`; returns `ok`."""
    if not ok:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr, flush=True)
    return ok


class Closed(Exception):
    """The peer closed the connection."""


def header(op, body_len, request_id=1, flags=0, status=0, magic=MAGIC, version=VERSION, reserved=0):
    return HEADER.pack(magic, version, op, flags, status, body_len, request_id, reserved)


def parse_header(b):
    magic, version, op, flags, status, body_len, request_id, reserved = HEADER.unpack(b)
    return dict(magic=magic, version=version, op=op, flags=flags, status=status,
                body_len=body_len, request_id=request_id, reserved=reserved)


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise Closed("connection closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def call(s, op, body=b"", request_id=1):
    """Send a request, return (status, reply body). Raises Closed if the server hangs up."""
    s.sendall(header(op, len(body), request_id) + body)
    h = parse_header(recv_exact(s, 32))
    payload = recv_exact(s, h["body_len"]) if h["body_len"] <= (1 << 21) else b""
    return h["status"], payload


def load_key(path):
    with open(path, "rb") as f:
        return f.read().rstrip(b"\r\n\t ")


def mac(key, label, *parts):
    return hmac.new(key, label + b"".join(parts), hashlib.sha256).digest()


def key_id(key):
    return struct.unpack("<Q", mac(key, b"rdmaswap-key-id-v1")[:8])[0]


def authenticate(s, key):
    """Run AUTH + AUTH_PROOF with `key`. Returns 0 or the errno the server answered; raises
    ValueError if the server did not prove it holds the key."""
    nc = os.urandom(32)
    status, body = call(s, AUTH, nc + struct.pack("<QQ", key_id(key), 0))
    if status:
        return status
    ns, smac = body[:32], body[32:64]
    if not hmac.compare_digest(smac, mac(key, b"rdmaswap-auth-server-v1", nc, ns)):
        raise ValueError("server failed to prove it holds the key")
    status, _ = call(s, AUTH_PROOF, mac(key, b"rdmaswap-auth-client-v1", nc, ns))
    return status


def hello(s, session_id=0, token=0):
    """HELLO (a new session unless given one). Returns (status, dict of the reply); its
    `challenge` is what a BIND on this connection signs."""
    status, body = call(s, HELLO, struct.pack("<IIQQQ", VERSION, 0, session_id, token, 0))
    if status or len(body) != 80:
        return status or -1, {}
    sid, tok, slab_size, total, free, max_io, flags, conn = struct.unpack_from("<QQQIIIIQ", body)
    return 0, dict(session_id=sid, token=tok, slab_size=slab_size, slabs_total=total,
                   slabs_free=free, max_io=max_io, conn_id=conn, challenge=body[48:80])


def connect(host, port, timeout=10):
    return socket.create_connection((host, port), timeout=timeout)


def session(host, port, key, timeout=10, rcvbuf=None):
    """An authenticated connection with a new session: (socket, hello reply). `rcvbuf`: the
    socket's SO_RCVBUF, set before connecting (so that the window the peer sees stays small)."""
    if rcvbuf:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        s.connect((host, port))
    else:
        s = connect(host, port, timeout)
    st = authenticate(s, key)
    if st:
        raise RuntimeError("authentication refused: errno %d" % st)
    st, info = hello(s)
    if st:
        raise RuntimeError("HELLO refused: errno %d" % st)
    return s, info


def io(s, op, slab, off, length, data=b"", request_id=1):
    body = struct.pack("<IIQ", slab, length, off)
    return call(s, op, body + data, request_id)


def alloc(s):
    status, body = call(s, ALLOC)
    if status:
        return status, None
    return 0, struct.unpack_from("<I", body)[0]


def free(s, slab):
    return call(s, FREE, struct.pack("<II", slab, 0))[0]


BIND, ALLOC_TAGGED, SET_TAG, VOLUME_LIST = 8, 9, 10, 11
EBUSY = 16


class VolumeKey:
    """The Ed25519 key of volume `name` derived from a host's volume secret (the bytes of its
    volume key file, as load_key reads them): seed = HMAC(V, "rdmaswap-volume-seed-v1" | name)."""

    def __init__(self, secret, name):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        self.name = name
        self._key = Ed25519PrivateKey.from_private_bytes(
            mac(secret, b"rdmaswap-volume-seed-v1", name.encode()))
        self.public = self._key.public_key().public_bytes(serialization.Encoding.Raw,
                                                          serialization.PublicFormat.Raw)

    def sign(self, msg):
        return self._key.sign(msg)


def bind_message(challenge, session_id, name, lease_s, public):
    """What a BIND's proof signs (common/wire/volume_key.h, bind_proof_message)."""
    return (b"rdmaswap-volume-bind-v1" + challenge + struct.pack("<Q", session_id) +
            name.encode().ljust(64, b"\0") + struct.pack("<I", lease_s) + public)


def bind(s, info, vkey, lease_s, name=None, public=None, proof=None):
    """BIND the session of `info` (the HELLO reply of connection `s`) to volume vkey.name,
    proving vkey. `name`, `public` and `proof` override what is sent (a hostile client).
    Returns (status, dict of the reply)."""
    name = vkey.name if name is None else name
    public = vkey.public if public is None else public
    if proof is None:
        proof = vkey.sign(bind_message(info["challenge"], info["session_id"], name, lease_s,
                                       public))
    status, body = call(s, BIND, name.encode().ljust(64, b"\0") +
                        struct.pack("<II", lease_s, 0) + public + proof)
    if status or len(body) != 16:
        return status or -1, {}
    reattached, slabs, detached_ms = struct.unpack("<IIQ", body)
    return 0, dict(reattached=reattached, slabs=slabs, detached_ms=detached_ms)


def list_slabs(s):
    """LIST: (status, the ids of the slabs the session holds)."""
    status, body = call(s, LIST)
    if status:
        return status, []
    n = struct.unpack_from("<I", body)[0]
    return 0, list(struct.unpack_from("<%dI" % n, body, 4))


def stats(s):
    """STATS: (status, dict with capacity, slab_size, slabs_total, slabs_free, sessions,
    connections)."""
    status, body = call(s, STATS)
    if status:
        return status, {}
    capacity, slab_size, total, free_, sessions = struct.unpack_from("<QQIII", body)
    connections = struct.unpack_from("<I", body, 68)[0]
    return 0, dict(capacity=capacity, slab_size=slab_size, slabs_total=total, slabs_free=free_,
                   sessions=sessions, connections=connections)
