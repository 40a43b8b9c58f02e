#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# drive.py URI SIZE REQUESTS CTL:OUT[,CTL:OUT...]: drive an NBD server with random 4 KiB and
# 128 KiB reads and writes in a steady state while processes count their heap allocations.
#
# Opens CONNECTIONS (4) NBD connections, writes the whole device once (so every slab exists),
# then runs WARMUP random requests per connection (so every server thread has done reads and
# writes of both sizes). Then it starts counting in every process (writes 1 to its control FIFO
# CTL and waits for OUT to say "counting", see alloc_counter.c), runs REQUESTS random requests
# spread over the connections with DEPTH (16) in flight on each, and stops counting (writes 0,
# waits for the counts in OUT). Connections stay open until counting has stopped. Any failed
# request is an error (exit 1).
import random
import sys
import threading
import time

import nbd

CONNECTIONS = 4
DEPTH = 16
WARMUP = 4000
SMALL, LARGE = 4096, 128 * 1024


def run_requests(h, count, size, seed, errors):
    """Issue `count` random requests on handle h, DEPTH in flight at a time."""
    rng = random.Random(seed)
    # Per slot, one buffer of each size, reused (a write sends whatever was last read).
    bufs = [{n: nbd.Buffer.from_bytearray(bytearray(rng.randbytes(n))) for n in (SMALL, LARGE)}
            for _ in range(DEPTH)]
    slots = {}  # cookie -> slot
    free = list(range(DEPTH))
    issued = done = 0
    try:
        while done < count:
            while free and issued < count:
                slot = free.pop()
                length = LARGE if rng.random() < 0.5 else SMALL
                offset = rng.randrange(0, (size - length) // 4096 + 1) * 4096
                if rng.random() < 0.5:
                    cookie = h.aio_pread(bufs[slot][length], offset)
                else:
                    cookie = h.aio_pwrite(bufs[slot][length], offset)
                slots[cookie] = slot
                issued += 1
            h.poll(-1)
            for cookie in [c for c in slots if h.aio_command_completed(c)]:
                free.append(slots.pop(cookie))
                done += 1
    except nbd.Error as e:
        errors.append(str(e))


def control(counters, command, answer):
    """Send `command` to every counter and wait (10 s at most) until each answered."""
    for ctl, out in counters:
        with open(ctl, "w") as f:
            f.write(command)
    deadline = time.monotonic() + 10
    for ctl, out in counters:
        while True:
            try:
                with open(out) as f:
                    if f.read().startswith(answer):
                        break
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                sys.exit("%s did not answer %r within 10 s (shim not loaded?)" % (out, command))
            time.sleep(0.01)


def main():
    uri, size, requests = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    counters = [c.split(":", 1) for c in sys.argv[4].split(",") if c]
    handles = []
    for _ in range(CONNECTIONS):
        h = nbd.NBD()
        h.connect_uri(uri)
        handles.append(h)
    if handles[0].get_size() != size:
        sys.exit("device size %d, expected %d" % (handles[0].get_size(), size))

    # Write every byte once, 128 KiB at a time: every slab is allocated now.
    data = bytes(range(256)) * (LARGE // 256)
    for i, off in enumerate(range(0, size, LARGE)):
        handles[i % CONNECTIONS].pwrite(data, off)

    def phase(per_conn, seed):
        errors = []
        threads = [threading.Thread(target=run_requests,
                                    args=(h, per_conn, size, seed + i, errors))
                   for i, h in enumerate(handles)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            sys.exit("requests failed: %s" % errors[:3])
        return time.monotonic() - t0

    phase(WARMUP, 1000)
    per_conn = (requests + CONNECTIONS - 1) // CONNECTIONS
    control(counters, "1", "counting")
    secs = phase(per_conn, 2000)
    control(counters, "0", "allocs=")
    print("drive: %d requests (%d connections x %d, depth %d, 4K/128K, read/write) in %.1f s"
          % (per_conn * CONNECTIONS, CONNECTIONS, per_conn, DEPTH, secs))
    for h in handles:
        h.shutdown()


if __name__ == "__main__":
    main()
