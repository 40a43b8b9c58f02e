#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# trickle-proxy.py TARGET_PORT STATEFILE [--mode normal|trickle|stall] [--interval SECONDS]:
# a loopback TCP proxy in front of a memserver on 127.0.0.1:TARGET_PORT that forwards both
# directions, and, when told, slows the server->client direction of every connection (open
# and future): "trickle" passes on 1 byte every --interval seconds (default 1), "stall" passes
# on nothing (the connection stays open). The client->server direction is always forwarded.
# Control: SIGUSR1 trickle, SIGUSR2 stall, SIGHUP normal (or start in a mode with --mode).
# STATEFILE gets "port=P mode=M connections=N" at start and after every change. Runs until
# killed.
import argparse
import os
import signal
import socket
import threading

ap = argparse.ArgumentParser()
ap.add_argument("target_port", type=int)
ap.add_argument("statefile")
ap.add_argument("--mode", choices=("normal", "trickle", "stall"), default="normal")
ap.add_argument("--interval", type=float, default=1.0)
args = ap.parse_args()

cond = threading.Condition()
mode = args.mode
count = 0

ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 0))
ls.listen(64)
port = ls.getsockname()[1]


def save():
    tmp = args.statefile + ".tmp"
    with open(tmp, "w") as f:
        f.write("port=%d mode=%s connections=%d\n" % (port, mode, count))
    os.rename(tmp, args.statefile)


def set_mode(new):
    global mode
    with cond:
        mode = new
        cond.notify_all()
    save()


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
    try:
        while True:
            data = s.recv(65536)
            if not data:
                break
            while data:
                with cond:
                    while mode == "stall":
                        cond.wait()
                    m = mode
                if m == "normal":
                    c.sendall(data)
                    data = b""
                    continue
                c.sendall(data[:1])
                data = data[1:]
                with cond:  # a mode change ends the pause early
                    cond.wait_for(lambda: mode != "trickle", timeout=args.interval)
    except OSError:
        pass
    close(c, s)


signal.signal(signal.SIGUSR1, lambda *_: set_mode("trickle"))
signal.signal(signal.SIGUSR2, lambda *_: set_mode("stall"))
signal.signal(signal.SIGHUP, lambda *_: set_mode("normal"))
save()
while True:
    try:
        c, _ = ls.accept()
    except InterruptedError:
        continue
    try:
        s = socket.create_connection(("127.0.0.1", args.target_port))
    except OSError:
        c.close()
        continue
    for x in (c, s):
        x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    count += 1
    save()
    threading.Thread(target=client_to_server, args=(c, s), daemon=True).start()
    threading.Thread(target=server_to_client, args=(s, c), daemon=True).start()
