#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A memserver that stops answering (SIGSTOP) makes requests fail with EIO within the plugin's
# timeout (timeout=3 here), never hang; reads of never-written ranges still read zeros. After
# SIGCONT the plugin reconnects by itself: data written before the stop reads back intact, new
# writes work, and no slab is leaked on the memserver.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

start_memserver 16M 1M
start_nbdkit stopped -- server="$MEMSERVER_ADDR" size=16M timeout=3

export memserver_pid="$MEMSERVER_PID"
NBDSH_TIMEOUT=55 nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import errno, os, signal, sys, time
sys.path.insert(0, os.environ["RDMASWAP_SOURCE"] + "/tests/integration/helpers")
import sigstop
slab = 1 << 20
pid = int(os.environ["memserver_pid"])
data = os.urandom(4 * slab)
h.pwrite(data, 0)
h.flush()

try:
    sigstop.stop(pid)
    def must_fail(what, fn):
        t = time.monotonic()
        try:
            fn()
        except nbd.Error as e:
            took = time.monotonic() - t
            print("%s: %s after %.1fs" % (what, e.string, took))
            if e.errnum != errno.EIO:
                sys.exit("%s: errno %s, expected EIO" % (what, e.errnum))
            # timeout=3; allow one retry's worth plus scheduling slack.
            if took > 8:
                sys.exit("%s took %.1fs to fail with timeout=3" % (what, took))
            return
        sys.exit("%s succeeded while the memserver was stopped" % what)

    must_fail("pread of written data", lambda: h.pread(4096, slab))
    must_fail("pwrite to a live slab", lambda: h.pwrite(b"x" * 4096, 3 * slab))
    must_fail("pwrite needing a new slab", lambda: h.pwrite(b"y" * 4096, 10 * slab))
    t = time.monotonic()
    assert h.pread(4096, 12 * slab) == bytes(4096), "never-written range is not zeros"
    assert time.monotonic() - t < 1, "never-written range took long to read"
finally:
    os.kill(pid, signal.SIGCONT)

# Recovery: the plugin reconnects (with backoff up to a few seconds). Slab 3's content is
# unspecified after the failed write, slabs 0-2 are not.
deadline = time.monotonic() + 30
while True:
    try:
        got = h.pread(3 * slab, 0)
        break
    except nbd.Error as e:
        if time.monotonic() > deadline:
            sys.exit("no recovery 30 s after SIGCONT: %s" % e.string)
        time.sleep(0.5)
if got != data[:3 * slab]:
    sys.exit("data written before the stop differs after recovery")
new = os.urandom(slab + 4096)
h.pwrite(new, 3 * slab - 2048)
h.flush()
assert h.pread(len(new), 3 * slab - 2048) == new, "write after recovery does not read back"
print("recovered after SIGCONT")
PY

# No slab leaked: an ALLOC that timed out while the memserver was stopped may still have been
# granted once it resumed; zeroing the whole device must give every slab back.
nbdsh_run -u "$NBDKIT_URI" -c 'h.zero(h.get_size(), 0); h.flush()'
used=
for ((i = 0; i < 50; i++)); do
    used=$(ctl_get "$MEMSERVER_PORT" slabs_used)
    [[ $used -eq 0 ]] && break
    sleep 0.2
done
[[ $used -eq 0 ]] || fail "after zeroing the whole device the memserver still has $used slab(s) in use: leaked"
