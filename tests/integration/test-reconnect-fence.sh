#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A write that timed out on a stalled memserver (SIGSTOP) is still in the old connection's
# socket buffer when the memserver resumes. The plugin's reconnect must fence that connection
# (the memserver applies nothing more from it once the new one is established), so a newer
# write to the same place always wins: never stale data.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

start_memserver 16M 1M
start_nbdkit fence -- server="$MEMSERVER_ADDR" size=16M timeout=2 channels=1
export memserver_pid="$MEMSERVER_PID"
NBDSH_TIMEOUT=60 nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import errno, os, signal, sys, time
sys.path.insert(0, os.environ["RDMASWAP_SOURCE"] + "/tests/integration/helpers")
import sigstop
pid = int(os.environ["memserver_pid"])
a, b, c = (bytes([x]) * 65536 for x in (0xaa, 0xbb, 0xcc))
h.pwrite(a, 4096)
sigstop.stop(pid)
try:
    h.pwrite(b, 4096)   # times out: B stays queued on the old connection
    sys.exit("write to a stopped memserver succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EIO, e
os.kill(pid, signal.SIGCONT)
deadline = time.monotonic() + 20
while True:             # the plugin reconnects (with backoff) and fences the old connection
    try:
        h.pwrite(c, 4096)
        break
    except nbd.Error:
        if time.monotonic() > deadline:
            sys.exit("no recovery after SIGCONT")
        time.sleep(0.2)
time.sleep(0.5)         # anything the old connection could still apply would land by now
got = h.pread(65536, 4096)
if got != c:
    sys.exit("newest write lost: read back 0x%02x" % got[0])
print("newest write wins after reconnect")
PY
# The reconnect named the connection it replaces (fenced if it was still open, or already
# closed after draining its buffered requests: either way nothing from it can follow).
grep -q "replaced by a reconnect of its client" "$MEMSERVER_LOG" ||
	{ tail -20 "$MEMSERVER_LOG" >&2; fail "the reconnect did not replace the old connection"; }
