#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""SIGSTOP a process and wait until every one of its threads has stopped.

kill() returns once the signal is queued. The process stops only when the one thread the kernel
chose to take the signal runs; its other threads go on meanwhile (an event loop keeps serving
requests), on a loaded machine for many milliseconds. A test that needs a hung peer must wait.

Import it (nbdsh scripts: sys.path gets $RDMASWAP_SOURCE/tests/integration) and call stop(pid),
or run it: sigstop.py PID (functions.sh: sigstop PID). Raises / exits 1 if the threads have not
all stopped within `within` seconds.
"""
import os
import signal
import sys
import time


def all_stopped(pid):
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue  # the thread ended
        if state != "T":
            return False
    return True


def stop(pid, within=5.0):
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + within
    while not all_stopped(pid):
        if time.monotonic() > deadline:
            raise RuntimeError("pid %d: threads not all stopped %.0f s after SIGSTOP" % (pid, within))
        time.sleep(0.005)


if __name__ == "__main__":
    try:
        stop(int(sys.argv[1]))
    except (RuntimeError, OSError) as e:
        sys.exit("sigstop.py: %s" % e)
