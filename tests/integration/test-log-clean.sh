#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Logs an operator can alert on (issue 29): the happy path prints no line containing "error:"
# (nbdkit_error's prefix, which log watchers alert on): a first start (the volume starts empty:
# a warning, not an error), writes, a clean shutdown (SIGTERM; no "aborting sleep because of
# server shut down"), a restart that reattaches the volume, and its clean shutdown. Warnings
# say "warning" without "error".
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin

start_memserver 32M 1M
a_addr=$MEMSERVER_ADDR
start_memserver 32M 1M
b_addr=$MEMSERVER_ADDR
args=(server="$a_addr" server="$b_addr" size=8M lease=60 timeout=5)
errors() { grep 'error:' "$1" || true; }

start_nbdkit first -- "${args[@]}"
nbdsh_run -u "$NBDKIT_URI" -c '
h.pwrite(b"\x6b" * (3 << 20), 1 << 20)
assert h.pread(3 << 20, 1 << 20) == b"\x6b" * (3 << 20)
' || fail "first run: write and read back failed"
stop_nbdkit_clean
first=$NBDKIT_LOG
[[ -z $(errors "$first") ]] || fail "a first start and a clean shutdown logged: $(errors "$first")"
grep -q 'warning: volume: no memserver kept anything' "$first" ||
    fail "the first start's warning (the volume starts empty) is missing"

start_nbdkit second -- "${args[@]}"
nbdsh_run -u "$NBDKIT_URI" -c '
assert h.pread(3 << 20, 1 << 20) == b"\x6b" * (3 << 20), "not reattached"
' || fail "restart: the volume was not reattached"
stop_nbdkit_clean
[[ -z $(errors "$NBDKIT_LOG") ]] || fail "a restart and a clean shutdown logged: $(errors "$NBDKIT_LOG")"
log "first start, restart (reattached) and both shutdowns: no error line"
log "PASS"
