#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# fio through its NBD engine: 4 jobs x iodepth 16, random 4K and 128K writes with crc32c verify
# headers, then fio reads everything back and verifies; a second fio, on new connections, verifies
# it all again without writing. Zero verify errors, fio exit 0.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl

start_memserver 64M 1M
start_nbdkit fio -- server="$MEMSERVER_ADDR" size=64M

# Each job owns 16M (offset_increment), so their writes never overlap and each can verify its own.
fio_args=(--ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite --bssplit=4k/50:128k/50
          --iodepth=16 --numjobs=4 --size=16M --offset_increment=16M
          --verify=crc32c --verify_fatal=1 --verify_state_save=0 --randseed=4242 --output-format=json)

timeout 50 fio --name=write-verify --do_verify=1 "${fio_args[@]}" >"$tmpdir/fio1.json" ||
    { cat "$tmpdir/fio1.json" >&2; fail "fio write+verify failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio1.json" $((64 * 1024 * 1024 * 9 / 10)) $((64 * 1024 * 1024 * 9 / 10)) ||
    fail "fio write+verify: see above"

timeout 50 fio --name=verify-only --verify_only "${fio_args[@]}" >"$tmpdir/fio2.json" ||
    { cat "$tmpdir/fio2.json" >&2; fail "fio verify-only pass failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio2.json" $((64 * 1024 * 1024 * 9 / 10)) ||
    fail "fio verify-only: see above"
