#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# impostor-server.py PORT STATEFILE MODE: pretend to be a memserver on 127.0.0.1:PORT (0: any free
# port) without holding the cluster key, answering every connection according to MODE:
#   garbage    random bytes, then close
#   wrong-mac  a well-formed AUTH reply whose MAC is random (a server with another key)
#   huge       a response header announcing a body of 4 GiB - 16, then a few bytes, held open
#   truncated  half a response header, held open
#   silent     reads, never answers, held open
#   insecure   answers AUTH with EOPNOTSUPP (a memserver run with --insecure)
# STATEFILE gets "port=P connections=N" after every connection. Runs until killed.
import os
import random
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

port, statefile, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
rng = random.Random(5)
lock = threading.Lock()
count = 0
held = []

ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(64)
port = ls.getsockname()[1]


def save():
    tmp = statefile + ".tmp"
    with open(tmp, "w") as f:
        f.write("port=%d connections=%d\n" % (port, count))
    os.rename(tmp, statefile)


def reply(s, op, status, body):
    s.sendall(wire.header(op, len(body), 0, flags=wire.RESPONSE, status=status) + body)


def serve(s):
    try:
        s.settimeout(30)
        h = wire.parse_header(wire.recv_exact(s, 32))
        if h["body_len"] <= 4096:
            wire.recv_exact(s, h["body_len"])
        op = h["op"]
        if mode == "garbage":
            s.sendall(rng.randbytes(64))
            s.close()
            return
        if mode == "wrong-mac":
            reply(s, op, 0, os.urandom(64))
        elif mode == "huge":
            s.sendall(wire.header(op, 0xFFFFFFF0, 0, flags=wire.RESPONSE) + rng.randbytes(100))
        elif mode == "truncated":
            s.sendall(wire.header(op, 64, 0, flags=wire.RESPONSE)[:16])
        elif mode == "insecure":
            reply(s, op, 95, b"")           # EOPNOTSUPP
        held.append(s)                        # keep it open: the client must time out
    except (OSError, wire.Closed):
        s.close()


save()
while True:
    s, _ = ls.accept()
    with lock:
        count += 1
        save()
    threading.Thread(target=serve, args=(s,), daemon=True).start()
