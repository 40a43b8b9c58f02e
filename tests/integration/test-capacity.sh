#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A device larger than the memserver: once every slab is taken, a write that needs a new slab fails
# with ENOSPC (at once, not after a timeout), written data stays intact, reads of unwritten ranges
# are zeros, and trimming a slab makes room for the next write.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

start_memserver 8M 1M
start_nbdkit cap -- server="$MEMSERVER_ADDR" size=16M

export port="$MEMSERVER_PORT" ctl="$RDMASWAPCTL"
nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import errno, os, subprocess, sys, time
slab = 1 << 20
def status(key):
    out = subprocess.run([os.environ["ctl"], "status", "server=127.0.0.1:" + os.environ["port"],
                         "auth-key=" + os.environ["AUTH_KEY"]],
                         check=True, capture_output=True, text=True, timeout=10).stdout
    return int(next(l.split("=", 1)[1] for l in out.splitlines() if l.startswith(key + "=")))

# Fill all 8 slabs of the memserver (slabs 0-7 of the device).
data = os.urandom(8 * slab)
h.pwrite(data, 0)
h.flush()
assert status("slabs_free") == 0, "memserver still has free slabs"

def must_enospc(what, fn):
    t = time.monotonic()
    try:
        fn()
    except nbd.Error as e:
        took = time.monotonic() - t
        print("%s: %s after %.2fs" % (what, e.string, took))
        if e.errnum != errno.ENOSPC:
            sys.exit("%s failed with errno %s, expected ENOSPC" % (what, e.errnum))
        if took > 2:
            sys.exit("%s took %.1fs to fail" % (what, took))
        return
    sys.exit("%s succeeded with no free slab on the memserver" % what)

must_enospc("4K write into slab 9", lambda: h.pwrite(b"a" * 4096, 9 * slab))
must_enospc("write straddling slabs 7|8", lambda: h.pwrite(b"b" * 8192, 8 * slab - 4096))
must_enospc("unaligned write into slab 10", lambda: h.pwrite(os.urandom(512), 10 * slab + 7))

# A failed write must not have touched slabs it could not get; written slabs are intact except
# the range of the straddling write, whose content is unspecified after its failure.
got = h.pread(8 * slab, 0)
if got[:8 * slab - 4096] != data[:8 * slab - 4096]:
    sys.exit("data written before the device filled up changed")
assert h.pread(8 * slab, 8 * slab) == bytes(8 * slab), "slabs 8-15 do not read as zeros"
# Rewrite the straddled range's first half; this slab is live so it works.
h.pwrite(data[8 * slab - 4096:], 8 * slab - 4096)

# Trim one slab: now a write to a new slab succeeds.
h.trim(slab, 3 * slab)
assert status("slabs_free") == 1, "trim did not give the slab back"
h.pwrite(b"c" * 4096, 9 * slab)
h.flush()
assert h.pread(4096, 9 * slab) == b"c" * 4096
assert h.pread(slab, 3 * slab) == bytes(slab), "trimmed slab does not read as zeros"
want = data[:3 * slab] + bytes(slab) + data[4 * slab:]
assert h.pread(8 * slab, 0) == want, "data changed"
print("ok")
PY
