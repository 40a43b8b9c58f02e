#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Quotas per identity (issue 26, S8): owner A (one volume key) takes what its quota allows on a
# donor (--max-owner-share 50: 4 of 8 slabs); its writes beyond fail with ENOSPC at once, also
# after a restart of its nbdkit (its sessions share one count), while owner B (another volume
# key, same address) still gets slabs, starts and serves I/O (bytes compared). A host starting
# against a donor filled by another volume starts, reads zeros, and its writes go to the other
# donor (replicas=2 with one full donor: the start used to fail, "1 of 2 memservers usable").
# One address binds at most --max-peer-owners distinct volume keys (EUSERS, named in the
# plugin's error).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

slab=$((1 << 20))
# ---- 1. The quota of one owner.
start_memserver 8M 1M --max-owner-share 50 --max-peer-owners 3
Q=$MEMSERVER_ADDR QP=$MEMSERVER_PORT QLOG=$MEMSERVER_LOG
start_nbdkit a -- server="$Q" size=8M volume=host-a volume-key="$tmpdir/a.key" lease=60
export slab
nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import errno, os, sys, time
slab = int(os.environ["slab"])
data = bytes([0xa5]) * (4 * slab)
h.pwrite(data, 0)  # slabs 0-3: the quota
h.flush()
t = time.monotonic()
try:
    h.pwrite(b"x" * 4096, 5 * slab)
    sys.exit("owner A got a 5th slab of 8 with --max-owner-share 50")
except nbd.Error as e:
    if e.errnum != errno.ENOSPC:
        sys.exit("over the quota: errno %s, expected ENOSPC" % e.errnum)
    print("over the quota: %s after %.2fs" % (e.string, time.monotonic() - t))
    if time.monotonic() - t > 2:
        sys.exit("the refusal took %.1fs" % (time.monotonic() - t))
assert h.pread(4 * slab, 0) == data, "owner A's bytes changed"
assert h.pread(slab, 5 * slab) == bytes(slab), "a refused slab does not read as zeros"
PY
[[ $(ctl_get "$QP" slabs_free) == 4 ]] || fail "owner A holds more than its quota"

# Its nbdkit restarted (the same volume key reattaches): one count, still at the quota.
stop_nbdkit_clean
start_nbdkit a2 -- server="$Q" size=8M volume=host-a volume-key="$tmpdir/a.key" lease=60
nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import errno, os, sys
slab = int(os.environ["slab"])
assert h.pread(4 * slab, 0) == bytes([0xa5]) * (4 * slab), "owner A's bytes lost at reattach"
try:
    h.pwrite(b"y" * 4096, 6 * slab)
    sys.exit("owner A's restarted nbdkit got a slab beyond the quota")
except nbd.Error as e:
    assert e.errnum == errno.ENOSPC, e.errnum
PY
A_PID=$NBDKIT_PID
# (The first nbdkit asked for no 5th slab: the last grant said none was left for it. The
# restarted one learnt the donor's free count at HELLO, so the memserver refused its ALLOC.)
grep -E "ALLOC refused \(ENOSPC\): volume key [0-9a-f]{64} holds 4 slabs, its quota" "$QLOG" >&2 ||
    fail "no log line for the refused ALLOC"

# Owner B (another volume key, the same address) still gets slabs and serves I/O.
start_nbdkit b -- server="$Q" size=8M volume=host-b volume-key="$tmpdir/b.key"
nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import os
slab = int(os.environ["slab"])
data = os.urandom(4 * slab)
h.pwrite(data, 0)
h.flush()
assert h.pread(4 * slab, 0) == data, "owner B's bytes differ"
PY
[[ $(ctl_get "$QP" slabs_free) == 0 ]] || fail "owner B did not get its 4 slabs"
kill -0 "$A_PID" || fail "owner A's nbdkit died"

# A third volume key from this address is fine (3 of --max-peer-owners 3), a fourth is refused.
# (The donor is full now: c starts all the same, and reads zeros.)
start_nbdkit c -- server="$Q" size=8M volume=host-c volume-key="$tmpdir/c.key"
nbdsh_run -u "$NBDKIT_URI" -c 'assert h.pread(65536, 0) == bytes(65536)'
nbdkit -f -U "$tmpdir/d.sock" "$PLUGIN" server="$Q" size=8M volume=host-d \
    volume-key="$tmpdir/d.key" auth-key="$AUTH_KEY" timeout=2 >"$tmpdir/nbdkit-d.log" 2>&1 &&
    fail "a 4th volume key from one address was bound (--max-peer-owners 3)"
grep -q "cannot bind volume host-d: .*--max-peer-owners" "$tmpdir/nbdkit-d.log" ||
    { cat "$tmpdir/nbdkit-d.log" >&2; fail "the 4th volume's error does not say why"; }
grep -E "BIND of volume host-d refused \(EUSERS\).*--max-peer-owners" "$QLOG" >&2 ||
    fail "no log line for the refused BIND"

# ---- 2. A full donor never stops a start.
start_memserver 8M 1M --max-owner-share 100
F=$MEMSERVER_ADDR FP=$MEMSERVER_PORT
start_nbdkit filler -- server="$F" size=8M volume=filler volume-key="$tmpdir/f.key"
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"f" * (8 << 20), 0); h.flush()'
[[ $(ctl_get "$FP" slabs_free) == 0 ]] || fail "the filler did not fill its donor"
start_memserver 8M 1M
E=$MEMSERVER_ADDR EP=$MEMSERVER_PORT

# Against the full donor alone: it starts; unwritten blocks read zeros, a write gets ENOSPC.
start_nbdkit alone -- server="$F" size=8M volume=host-e volume-key="$tmpdir/e.key"
nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import errno, sys
assert h.pread(65536, 0) == bytes(65536), "an unwritten block does not read zeros"
try:
    h.pwrite(b"z" * 4096, 0)
    sys.exit("a write succeeded on a full donor")
except nbd.Error as e:
    assert e.errnum == errno.ENOSPC, e.errnum
assert h.pread(4096, 0) == bytes(4096), "a refused write left bytes"
PY
stop_nbdkit_clean

# replicas=2 over the full donor and an empty one: it starts, its writes go to the empty one.
start_nbdkit both -- server="$F" server="$E" size=4M replicas=2 volume=host-e volume-key="$tmpdir/e.key"
nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import os
slab = int(os.environ["slab"])
assert h.pread(slab, 0) == bytes(slab), "an unwritten block does not read zeros"
data = os.urandom(3 * slab)
h.pwrite(data, 0)
h.flush()
assert h.pread(3 * slab, 0) == data, "the bytes written differ"
PY
[[ $(ctl_get "$EP" slabs_free) == 5 ]] || fail "the writes did not go to the empty donor"
[[ $(ctl_get "$FP" slabs_free) == 0 ]] || fail "the full donor changed"
echo "ok"
