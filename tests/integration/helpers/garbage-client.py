#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# garbage-client.py HOST PORT STATEFILE STOPFILE KEYFILE: hammer a memserver's TCP port with
# malformed and hostile input until STOPFILE exists. Each round:
#   random bytes; a truncated header; valid headers with a huge or wrong body_len; a WRITE whose
#   payload stops half-way; a header with a bad magic/version/op/flags; requests (HELLO, ALLOC,
#   STATS, READ, WRITE) without authentication or after a wrong AUTH_PROOF; an idle connection
#   left open (a few at a time); and an authenticated session (KEYFILE) that READs, WRITEs and
#   FREEs slabs it never allocated (other sessions' slabs).
# After every round it rewrites STATEFILE with
#   "rounds=N accepted_foreign=M accepted_unauth=U refused=K".
# accepted_foreign counts foreign-slab operations the server answered with status 0, and
# accepted_unauth requests it answered with status 0 before authentication: both are bugs.
# Exits 1 if the server stops accepting connections.
import os, random, socket, struct, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rdmaswap_wire import (ALLOC, AUTH, AUTH_PROOF, FREE, HELLO, READ, RESPONSE, STATS, VERSION,
                           WRITE, Closed, call, header, key_id, load_key)
import rdmaswap_wire as wire

host, port, statefile, stopfile = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
key = load_key(sys.argv[5])
rng = random.Random(int(os.environ.get("GARBAGE_SEED", "7")))
rounds = accepted_foreign = accepted_unauth = refused = 0
idle = []


def connect():
    for _ in range(50):
        try:
            return socket.create_connection((host, port), timeout=5)
        except ConnectionRefusedError:
            # Only a dead server refuses; give it a moment in case the listen backlog is full.
            time.sleep(0.1)
    sys.exit("garbage-client: memserver at %s:%d refuses connections" % (host, port))


def send_and_close(data, linger=0.0):
    s = connect()
    try:
        s.sendall(data)
        if linger:
            s.settimeout(linger)
            try:
                while s.recv(65536):
                    pass
            except (socket.timeout, OSError):
                pass
    except OSError:
        pass                       # the server may (rightly) hang up on us mid-send
    finally:
        s.close()


def unauthenticated(op, body, wrong_proof=False):
    """A request without (or after a failed) authentication: it must be refused."""
    global accepted_unauth, refused
    s = connect()
    try:
        if wrong_proof:
            st, reply = call(s, AUTH, os.urandom(32) + struct.pack("<QQ", key_id(key), 0))
            if st == 0:
                st, _ = call(s, AUTH_PROOF, os.urandom(32))
                if st == 0:
                    accepted_unauth += 1
        st, _ = call(s, op, body)
        if st == 0:
            accepted_unauth += 1
            print("garbage-client: server ANSWERED op %d without authentication" % op,
                  file=sys.stderr, flush=True)
        else:
            refused += 1
    except (OSError, Closed):
        refused += 1               # hanging up is a fine answer too
    finally:
        s.close()


def hostile_session():
    """A real session that touches slabs it never allocated."""
    global accepted_foreign, refused
    s = connect()
    try:
        if wire.authenticate(s, key) != 0:
            return
        status, info = wire.hello(s)
        if status != 0:
            return
        slab_size, slabs_total = info["slab_size"], info["slabs_total"]
        rid = 2
        for _ in range(8):
            slab = rng.randrange(max(slabs_total, 1) + 2)      # also ids past the end
            off = rng.randrange(slab_size // 4096) * 4096 if slab_size >= 4096 else 0
            kind = rng.randrange(3)
            if kind == 0:
                st, _ = call(s, READ, struct.pack("<IIQ", slab, 4096, off), rid)
            elif kind == 1:
                st, _ = call(s, WRITE, struct.pack("<IIQ", slab, 4096, off) + rng.randbytes(4096), rid)
            else:
                st, _ = call(s, FREE, struct.pack("<II", slab, 0), rid)
            rid += 1
            if st == 0:
                accepted_foreign += 1
                print("garbage-client: server ACCEPTED op %d on slab %d (not allocated by this "
                      "session)" % ((READ, WRITE, FREE)[kind], slab), file=sys.stderr, flush=True)
            else:
                refused += 1
        # Also out-of-range offsets and lengths on any slab.
        st, _ = call(s, READ, struct.pack("<IIQ", 0, 4096, (1 << 63)), rid)
        if st == 0:
            accepted_foreign += 1
        st, _ = call(s, READ, struct.pack("<IIQ", 0, 0xFFFFFFFF, 0), rid + 1)
        if st == 0:
            accepted_foreign += 1
    except (OSError, Closed):
        pass                       # hanging up on a hostile client is a fine answer
    finally:
        s.close()


def one_round():
    # Random bytes of random length.
    send_and_close(rng.randbytes(rng.randint(1, 8192)))
    # A truncated header (valid start), then close.
    send_and_close(header(STATS, 0)[: rng.randint(1, 31)])
    # Huge body_len on every op, with some bytes after.
    for op in (HELLO, ALLOC, FREE, READ, WRITE, STATS, 0, 7, 255):
        send_and_close(header(op, 0xFFFFFFFF) + rng.randbytes(rng.randint(0, 64)), linger=0.05)
    # A WRITE just over the maximum I/O size.
    send_and_close(header(WRITE, 16 + (1 << 20) + 1) + bytes(16) + rng.randbytes(4096), linger=0.05)
    # A WRITE whose payload stops half-way, then close.
    send_and_close(header(WRITE, 16 + 65536) + struct.pack("<IIQ", 0, 65536, 0) + rng.randbytes(1000))
    # Bad magic, version, flags, reserved, a response sent as a request, a request with a status.
    for h in (header(STATS, 0, magic=0xDEADBEEF), header(STATS, 0, version=99),
              header(STATS, 0, flags=0x8000), header(STATS, 0, reserved=1),
              header(STATS, 80, flags=RESPONSE), header(STATS, 0, status=5)):
        send_and_close(h + rng.randbytes(80), linger=0.05)
    # I/O before HELLO.
    send_and_close(header(READ, 16) + struct.pack("<IIQ", 0, 4096, 0), linger=0.05)
    send_and_close(header(WRITE, 16 + 4096) + struct.pack("<IIQ", 0, 4096, 0) + rng.randbytes(4096),
                   linger=0.05)
    # Requests without authentication, and after a wrong proof: refused.
    unauthenticated(HELLO, struct.pack("<IIQQQ", VERSION, 0, 0, 0, 0))
    unauthenticated(STATS, b"")
    unauthenticated(ALLOC, b"", wrong_proof=True)
    unauthenticated(READ, struct.pack("<IIQ", 0, 4096, 0), wrong_proof=True)
    # Idle connections that never send a full header, kept open (up to 16 at a time).
    s = connect()
    s.sendall(header(HELLO, 24)[:5])
    idle.append(s)
    while len(idle) > 16:
        idle.pop(0).close()
    hostile_session()


def save_state():
    tmp = statefile + ".tmp"
    with open(tmp, "w") as f:
        f.write("rounds=%d accepted_foreign=%d accepted_unauth=%d refused=%d\n"
                % (rounds, accepted_foreign, accepted_unauth, refused))
    os.rename(tmp, statefile)


deadline = time.monotonic() + 100          # never outlive the test
while not os.path.exists(stopfile) and time.monotonic() < deadline:
    one_round()
    rounds += 1
    save_state()
save_state()
