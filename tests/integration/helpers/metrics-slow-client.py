#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Slow clients against the memserver's /metrics (test-metrics-slow.sh), all at once:
# - SLOW connections from 127.0.0.1 that trickle a request one byte every 0.3 s and never
#   finish it, each reconnecting as soon as the server closes it (a slowloris at one address);
# - one trickler from 127.0.0.3, whose connection must be closed at the server's request
#   deadline: prints "trickler_closed_after=SECONDS" (or "never" within the run);
# - SCRAPES scrapes from 127.0.0.2, one every 0.4 s, each given BOUND seconds: prints
#   "scrapes_ok=N", "scrape_max=SECONDS", "slow_held_max=N" (the most slow connections the
#   server held open at once, as their clients saw it).
# Usage: metrics-slow-client.py PORT SLOW SCRAPES BOUND
import socket
import sys
import threading
import time

port, slow, scrapes, bound = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 4000
stop = threading.Event()
held = 0
held_max = 0
lock = threading.Lock()


def connect(src, timeout):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def closed_by_peer(s):
    """True if the server closed (or reset) the connection: a non-blocking peek sees EOF."""
    try:
        s.setblocking(False)
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


def trickle(s, period):
    """Sends REQUEST one byte per `period` until the server closes; False if it never did."""
    for i in range(len(REQUEST)):
        if stop.is_set():
            return False
        try:
            s.send(REQUEST[i:i + 1])
        except OSError:
            return True
        end = time.monotonic() + period
        while time.monotonic() < end:
            if closed_by_peer(s):
                return True
            time.sleep(0.02)
    return False


def slow_client():
    global held, held_max
    while not stop.is_set():
        try:
            s = connect("127.0.0.1", 2)
        except OSError:
            time.sleep(0.05)
            continue
        # The server closes a refused connection at once: within 50 ms here, but a sanitizer
        # build beside another on two cores took longer (a refused one was counted as held).
        # A held one stays open until the request deadline (2 s), so half a second tells them
        # apart either way.
        refused = False
        end = time.monotonic() + 0.5
        while not refused and time.monotonic() < end:
            time.sleep(0.02)
            refused = closed_by_peer(s)
        if refused:
            s.close()
            time.sleep(0.05)
            continue
        with lock:
            held += 1
            held_max = max(held_max, held)
        trickle(s, 0.3)
        with lock:
            held -= 1
        s.close()


trickler_result = ["never"]


def trickler():
    time.sleep(0.5)
    try:
        s = connect("127.0.0.3", 2)
    except OSError as e:
        trickler_result[0] = "connect failed: %s" % e
        return
    start = time.monotonic()
    if trickle(s, 0.2):
        trickler_result[0] = "%.2f" % (time.monotonic() - start)
    s.close()


threads = [threading.Thread(target=slow_client, daemon=True) for _ in range(slow)]
threads.append(threading.Thread(target=trickler, daemon=True))
for t in threads:
    t.start()
time.sleep(1.0)  # the slow clients hold their connections

ok = 0
worst = 0.0
for i in range(scrapes):
    t0 = time.monotonic()
    try:
        s = connect("127.0.0.2", bound)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if time.monotonic() - t0 > bound:
                raise TimeoutError("slower than the bound")
        s.close()
        took = time.monotonic() - t0
        if data.startswith(b"HTTP/1.1 200") and b"\r\n\r\n" in data and took <= bound:
            ok += 1
            worst = max(worst, took)
        else:
            print("scrape %d: %r after %.2f s" % (i, data[:40], took), file=sys.stderr)
    except OSError as e:
        print("scrape %d failed after %.2f s: %s" % (i, time.monotonic() - t0, e), file=sys.stderr)
    time.sleep(max(0.0, 0.4 - (time.monotonic() - t0)))

# The trickler's answer comes at most 5 s after it started.
deadline = time.monotonic() + 5
while trickler_result[0] == "never" and time.monotonic() < deadline and threads[-1].is_alive():
    time.sleep(0.1)
stop.set()
print("scrapes_ok=%d" % ok)
print("scrape_max=%.2f" % worst)
print("slow_held_max=%d" % held_max)
print("trickler_closed_after=%s" % trickler_result[0])
