#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# challenge-proxy.py TARGET_PORT STATEFILE: a loopback TCP proxy in front of a memserver on
# 127.0.0.1:TARGET_PORT that forwards both directions unchanged, except that it flips one bit of
# the challenge in every HELLO reply. A client's BIND then signs another challenge than the
# memserver's, which must answer EPERM (a stand-in for any memserver that refuses the proof).
# STATEFILE gets "port=P connections=N hellos=H". Runs until killed.
import os
import socket
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdmaswap_wire as wire

target, statefile = int(sys.argv[1]), sys.argv[2]
lock = threading.Lock()
count = hellos = 0

ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 0))
ls.listen(64)
port = ls.getsockname()[1]


def save():
    tmp = statefile + ".tmp"
    with open(tmp, "w") as f:
        f.write("port=%d connections=%d hellos=%d\n" % (port, count, hellos))
    os.rename(tmp, statefile)


def close(*socks):
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def client_to_server(c, s):
    try:
        while True:
            data = c.recv(65536)
            if not data:
                break
            s.sendall(data)
    except OSError:
        pass
    close(c, s)


def server_to_client(s, c):
    """Forward whole responses (header, then body), changing HELLO replies' challenges."""
    global hellos
    try:
        while True:
            hdr = wire.recv_exact(s, 32)
            h = wire.parse_header(hdr)
            body = wire.recv_exact(s, h["body_len"])
            if h["op"] == wire.HELLO and h["status"] == 0 and len(body) == 80:
                body = body[:48] + bytes([body[48] ^ 1]) + body[49:]
                with lock:
                    hellos += 1
                    save()
            c.sendall(hdr + body)
    except (OSError, wire.Closed):
        pass
    close(c, s)


save()
while True:
    c, _ = ls.accept()
    s = socket.create_connection(("127.0.0.1", target))
    with lock:
        count += 1
        save()
    threading.Thread(target=client_to_server, args=(c, s), daemon=True).start()
    threading.Thread(target=server_to_client, args=(s, c), daemon=True).start()
