#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# paths= (issue 14): the channels share `paths` data connections per donor, so what a donor
# carries grows with paths=, not with channels=. Over TCP on loopback:
# - 16 channels over 2 paths: fio with 4 jobs x iodepth 16 writes and verifies (the channels
#   take turns on the shared connections), then a verify-only pass;
# - the memserver's open connections (its /metrics) are the same with channels=16 and
#   channels=4 at paths=2, and 4 more with paths=6 (channels=16).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl

start_memserver 64M 1M --metrics-listen 127.0.0.1:0
wait_until 10 "the memserver's metrics line" grep -q 'serving metrics on http://' "$MEMSERVER_LOG"
mport=$(sed -n 's|.*serving metrics on http://127\.0\.0\.1:\([0-9]*\)/metrics.*|\1|p' "$MEMSERVER_LOG")
[[ -n $mport ]] || fail "no metrics port in the memserver's log"

# open_connections: the memserver's rdmaswap_memserver_connections gauge.
open_connections() {
    "$PYTHON" - "http://127.0.0.1:$mport/metrics" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
for line in text.splitlines():
    if line.startswith("rdmaswap_memserver_connections "):
        print(int(float(line.split()[1])))
        sys.exit(0)
sys.exit("no rdmaswap_memserver_connections in /metrics")
EOF
}
# settled_connections: the count once it has held still for 1 s (connections made at start,
# and the start's probe closed), within 15 s.
settled_connections() {
    local prev=-1 now deadline=$((SECONDS + 15))
    while ((SECONDS < deadline)); do
        now=$(open_connections)
        [[ $now == "$prev" ]] && { echo "$now"; return 0; }
        prev=$now
        sleep 1
    done
    fail "the memserver's connection count did not settle within 15 s (last $prev)"
}

run_plugin() { # NAME CHANNELS PATHS
    start_nbdkit "$1" -- server="$MEMSERVER_ADDR" size=64M transport=tcp replicas=1 timeout=5 \
        channels="$2" paths="$3" statusfile="$tmpdir/$1.status"
    wait_until 10 "the status file" test -s "$tmpdir/$1.status"
}
stop_plugin() {
    kill "$NBDKIT_PID"
    wait "$NBDKIT_PID" 2>/dev/null || true
    wait_until 15 "the plugin's session to end" test "$(open_connections)" -eq "$base"
}

base=$(settled_connections)

# --- 16 channels over 2 paths: verified I/O.
run_plugin p2c16 16 2
fio_args=(--ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite --bssplit=4k/50:128k/50
          --iodepth=16 --numjobs=4 --size=16M --offset_increment=16M
          --verify=crc32c --verify_fatal=1 --verify_state_save=0 --randseed=77 --output-format=json)
timeout 60 fio --name=write-verify --do_verify=1 "${fio_args[@]}" >"$tmpdir/fio1.json" ||
    { cat "$tmpdir/fio1.json" >&2; fail "fio write+verify over paths=2 failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio1.json" $((64 * 1024 * 1024 * 9 / 10)) $((64 * 1024 * 1024 * 9 / 10)) ||
    fail "fio write+verify over paths=2: see above"
timeout 60 fio --name=verify-only --verify_only "${fio_args[@]}" >"$tmpdir/fio2.json" ||
    { cat "$tmpdir/fio2.json" >&2; fail "fio verify-only over paths=2 failed"; }
"$PYTHON" "$(dirname "$0")/helpers/fio-check.py" "$tmpdir/fio2.json" $((64 * 1024 * 1024 * 9 / 10)) ||
    fail "fio verify-only over paths=2: see above"
c16p2=$(( $(settled_connections) - base ))
stop_plugin

# --- what the donor carries: paths=, not channels=.
run_plugin p2c4 4 2
c4p2=$(( $(settled_connections) - base ))
stop_plugin
run_plugin p6c16 16 6
c16p6=$(( $(settled_connections) - base ))
stop_plugin
log "memserver connections from one plugin: channels=16 paths=2: $c16p2, channels=4 paths=2: $c4p2, channels=16 paths=6: $c16p6"
[[ $c16p2 -eq $c4p2 ]] || fail "channels=16 and channels=4 (paths=2) cost the donor $c16p2 and $c4p2 connections: should be the same"
[[ $c16p6 -eq $((c16p2 + 4)) ]] || fail "paths=6 costs the donor $c16p6 connections, paths=2 $c16p2: expected 4 more"
# Control, give-back poll, 2 data paths and the repair thread's: 5.
[[ $c16p2 -eq 5 ]] || fail "paths=2: the donor carries $c16p2 connections, expected 5 (control, poll, 2 + 1 data)"
