#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Per-message deadlines on the memserver (--message-timeout 2): a key holder that starts a
# WRITE and trickles its payload, or that does not read its READ replies, loses its connection
# within the timeout; the release of the slab it held waits asleep (the memserver's CPU stays
# low) and then succeeds; and a client doing verified I/O meanwhile (a wire-level verifier,
# then fio write+verify through nbdkit) sees no error. slow-peer-client.py says what each
# mode checks.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl
here=$(cd "$(dirname "$0")" && pwd)

timeout_s=2
start_memserver 64M 1M --message-timeout $timeout_s
client() {
    "$PYTHON" "$here/slow-peer-client.py" 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" \
        "$MEMSERVER_PID" $timeout_s "$@"
}

# 1. A trickling WRITE while another connection frees its slab, with a verifier beside.
client free >"$tmpdir/free.out" 2>&1 || { cat "$tmpdir/free.out" >&2; fail "mode free (see above)"; }
cat "$tmpdir/free.out" >&2

# 2. Tricklers and a slow reader while fio writes and verifies through nbdkit.
start_nbdkit fio -- server="$MEMSERVER_ADDR" size=24M channels=4
client attack >"$tmpdir/attack.out" 2>&1 &
attacker=$!
cleanup_pid $attacker
fio_args=(--ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite --bssplit=4k/50:128k/50
          --iodepth=8 --numjobs=3 --size=8M --offset_increment=8M --do_verify=1
          --verify=crc32c --verify_fatal=1 --verify_state_save=0 --output-format=json)
runs=0
while kill -0 $attacker 2>/dev/null; do
    ((runs < 60)) || fail "the attacker did not finish within 60 fio runs"
    timeout 50 fio --name=run$runs --randseed=$runs "${fio_args[@]}" >"$tmpdir/fio.json" ||
        { cat "$tmpdir/fio.json" >&2; cat "$tmpdir/attack.out" >&2; fail "fio run $runs failed beside slow peers"; }
    "$PYTHON" "$here/fio-check.py" "$tmpdir/fio.json" $((24 * 1024 * 1024 * 9 / 10)) || fail "fio: see above"
    runs=$((runs + 1))
done
rc=0
wait $attacker || rc=$?
cat "$tmpdir/attack.out" >&2
[[ $rc -eq 0 ]] || fail "slow peers were not dropped in time (see above)"
((runs >= 1)) || fail "no fio run overlapped the slow peers"
log "fio write+verify passed $runs times beside the slow peers"

kill -0 "$MEMSERVER_PID" 2>/dev/null || fail "memserver died"
grep -q 'WRITE not received whole within 2000 ms' "$MEMSERVER_LOG" || fail "no log line for a trickling WRITE"
grep -q 'READ reply not taken within 2000 ms' "$MEMSERVER_LOG" || fail "no log line for a slow reader"
