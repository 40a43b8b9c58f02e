#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Tenant isolation on the TCP path: client B, authenticated with the cluster key, can neither read,
# write nor free client A's slabs by guessing slab ids and offsets, and a slab A gave back (FREE,
# or the end of its session) reads as zeros to B. Meanwhile a well-behaved nbdkit client on the
# same memserver keeps its data (nbdsh writes before, reads after).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl
here=$(cd "$(dirname "$0")" && pwd)

start_memserver 16M 1M
start_nbdkit iso -- server="$MEMSERVER_ADDR" size=4M
nbdsh_run -u "$NBDKIT_URI" -c '
h.pwrite(b"\xab" * (4 << 20), 0)
' || fail "nbdsh write failed"

timeout 100 "$PYTHON" "$here/helpers/isolation-client.py" 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" ||
    fail "isolation-client found a breach (see above)"

nbdsh_run -u "$NBDKIT_URI" -c '
assert h.pread(4 << 20, 0) == b"\xab" * (4 << 20), "the nbdkit client lost data"
' || fail "the well-behaved client's data changed"
grep -q 'ERROR\|error' "$MEMSERVER_LOG" && fail "memserver logged errors: $(grep -i error "$MEMSERVER_LOG")"
log "isolation OK"
