#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# nbdcopy a random file whose length is not slab-aligned into the device and back out; the bytes
# match and the rest of the device reads as zeros. nbdcopy uses several connections and large
# parallel requests, so this also covers concurrent clients of one nbdkit.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires nbdcopy --version
requires_build memserver plugin ctl

size=$((64 * 1024 * 1024))
len=$((48 * 1024 * 1024 + 12345))
start_memserver 64M 1M
start_nbdkit copy -- server="$MEMSERVER_ADDR" size=$size

head -c "$len" /dev/urandom >"$tmpdir/in"
timeout 50 nbdcopy --flush -- "$tmpdir/in" "$NBDKIT_URI" || fail "nbdcopy into the device failed"
timeout 50 nbdcopy -- "$NBDKIT_URI" "$tmpdir/out" || fail "nbdcopy out of the device failed"

[[ $(stat -c %s "$tmpdir/out") -eq $size ]] || fail "copied-out size is not $size"
cmp -n "$len" "$tmpdir/in" "$tmpdir/out" || fail "data copied out differs from data copied in"
cmp -n $((size - len)) -i "$len:0" "$tmpdir/out" /dev/zero || fail "the never-written tail is not zeros"

# Memserver accounting: the data went through it (48 MiB at least, both ways).
written=$(ctl_get "$MEMSERVER_PORT" tcp_write_bytes)
read=$(ctl_get "$MEMSERVER_PORT" tcp_read_bytes)
log "memserver tcp_write_bytes=$written tcp_read_bytes=$read"
((written >= len)) || fail "memserver counted $written bytes written, less than $len"
((read >= len)) || fail "memserver counted $read bytes read, less than $len"

# Again with one connection and small requests: same bytes.
rm -f "$tmpdir/out"
timeout 50 nbdcopy --connections=1 --request-size=65536 -- "$NBDKIT_URI" "$tmpdir/out" ||
    fail "nbdcopy (1 connection, 64K requests) failed"
cmp -n "$len" "$tmpdir/in" "$tmpdir/out" || fail "data differs on the single-connection copy"
