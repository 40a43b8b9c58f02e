#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The plugin under nbdkit's stats filter: a known sequence of requests of the kernel's swap sizes
# (128 KiB writes, 32 KiB reads) goes through, reads back byte for byte, and the statistics file
# nbdkit writes on exit counts exactly those operations and bytes.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires nbdkit --filter=stats null --dump-plugin
requires_nbdsh
requires_build memserver plugin ctl

start_memserver 32M 1M
stats="$tmpdir/stats.txt"
start_nbdkit stats --filter=stats -- server="$MEMSERVER_ADDR" size=32M statsfile="$stats"

NBDSH_TIMEOUT=50 nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import os, sys
wsize, rsize = 128 * 1024, 32 * 1024
data = os.urandom(24 * wsize)                 # 3 MiB
for i in range(24):                           # 24 writes of 128 KiB
    h.pwrite(data[i * wsize:(i + 1) * wsize], 5 * 1024 * 1024 + i * wsize)
for i in range(96):                           # 96 reads of 32 KiB
    got = h.pread(rsize, 5 * 1024 * 1024 + i * rsize)
    if got != data[i * rsize:(i + 1) * rsize]:
        sys.exit("read %d differs from what was written" % i)
h.flush()
PY
# 3 MiB from offset 5 MiB: slabs 5, 6 and 7 of 1 MiB, and nothing else.
[[ $(ctl_get "$MEMSERVER_PORT" slabs_used) -eq 3 ]] || fail "expected the 3 MiB to occupy 3 slabs"

kill -TERM "$NBDKIT_PID"
wait_until 20 "nbdkit to exit and write $stats" test -s "$stats"
for ((i = 0; i < 100; i++)); do kill -0 "$NBDKIT_PID" 2>/dev/null || break; sleep 0.1; done
cat "$stats" >&2
# "write: 24 ops, 0.012345 s, 3.00 MiB, ..."
grep -Eq '^write: 24 ops, [0-9.]+ s, 3\.00 MiB' "$stats" || fail "stats: expected 24 writes of 3.00 MiB in all"
grep -Eq '^read: 96 ops, [0-9.]+ s, 3\.00 MiB' "$stats" || fail "stats: expected 96 reads of 3.00 MiB in all"
grep -Eq '^ +17 bits: 100\.0% \(24 reqs' "$stats" || fail "stats: the writes were not all 128 KiB"
