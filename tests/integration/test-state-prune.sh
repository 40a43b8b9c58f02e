#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 29: the state directory stays bounded. `rdmaswapctl state list` and `state prune`
# (docs/operations.md, "The state directory") over files made by real nbdkit runs:
# - a running volume's files are never removed (its run file is locked);
# - a volume stopped cleanly keeps them for its lease, then prune removes them (the volume key
#   stays), and the volume starts again as usual;
# - a volume killed (no clean stop) keeps them until older-than= says they are old enough;
# - without dir=, the state directory is the plugin's ($STATE_DIRECTORY here).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

state() { timeout 10 "$RDMASWAPCTL" state "$@"; }
dir=$STATE_DIRECTORY
# block OUT VOLUME: the lines of VOLUME's block in OUT (rdmaswapctl state's output).
block() { awk -v v="volume=$2" '$0 == v { on = 1 } on && $0 == "" { exit } on' <<<"$1"; }
files_of() { ls "$dir" | grep -F ".$1." || true; }
# The hash naming a volume's files (state::volume_hash: FNV-1a 64 with the plugin's offset basis).
hash_of() {
    "$PYTHON" -c '
import sys
h = 1469598103934665603
for c in sys.argv[1].encode():
    h = ((h ^ c) * 0x100000001b3) & 0xffffffffffffffff
print("%016x" % h)' "$1"
}

start_memserver 32M 1M
args=(server="$MEMSERVER_ADDR" size=8M)

# ---- A running volume: listed as running, never pruned ----
start_nbdkit a -- "${args[@]}" volume=vol-a lease=2
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"\x11" * 65536, 0)' || fail "write to vol-a failed"
ha=$(hash_of vol-a)
[[ -f $dir/volume.key.$ha.run && -f $dir/volume.key.$ha.holders ]] ||
    fail "vol-a's run file and holders record are not in $dir: $(ls "$dir")"
out=$(state list dir="$dir") || fail "state list failed: $out"
b=$(block "$out" vol-a)
grep -qx 'state=running' <<<"$b" || fail "vol-a is not listed as running:"$'\n'"$out"
grep -qx 'lease=2' <<<"$b" || fail "vol-a's lease is not listed:"$'\n'"$b"
grep -qx "file=$dir/volume.key.$ha.run" <<<"$b" || fail "vol-a's run file not listed:"$'\n'"$b"
grep -qx 'prunable=no' <<<"$b" || fail "a running volume is prunable:"$'\n'"$b"
out=$(state prune dir="$dir" older-than=0) || fail "state prune failed: $out"
grep -q '^removed=' <<<"$out" && fail "prune removed files of a running volume:"$'\n'"$out"
grep -qx 'kept=its nbdkit runs (the run file is locked)' <<<"$(block "$out" vol-a)" ||
    fail "prune did not say why vol-a stays:"$'\n'"$out"
[[ -f $dir/volume.key.$ha.run && -f $dir/volume.key.$ha.holders ]] || fail "vol-a's files went"

# ---- Stopped cleanly: kept for its lease, then pruned ----
stop_nbdkit_clean
t_stop=$(date +%s)
out=$(state list dir="$dir")
b=$(block "$out" vol-a)
grep -qx 'state=stopped' <<<"$b" || fail "vol-a is not listed as stopped:"$'\n'"$out"
out=$(state prune dir="$dir")
if (($(date +%s) - t_stop < 2)); then
    grep -q "^kept=stopped .* ago, within its lease of 2 s" <<<"$(block "$out" vol-a)" ||
        fail "vol-a was not kept within its lease:"$'\n'"$out"
    [[ -n $(files_of "$ha") ]] || fail "vol-a's files went within its lease"
fi
while (($(date +%s) - t_stop <= 3)); do sleep 0.2; done
out=$(state prune) || fail "state prune (default dir) failed: $out" # ($STATE_DIRECTORY)
b=$(block "$out" vol-a)
grep -qx "removed=$dir/volume.key.$ha.run" <<<"$b" || fail "vol-a's run file not pruned:"$'\n'"$out"
grep -qx "removed=$dir/volume.key.$ha.holders" <<<"$b" || fail "vol-a's holders not pruned:"$'\n'"$out"
[[ -z $(files_of "$ha") ]] || fail "vol-a's files are left: $(files_of "$ha")"
[[ -f $dir/volume.key ]] || fail "prune removed the volume key"
log "vol-a: kept while running and within its lease, pruned $(($(date +%s) - t_stop)) s after its stop"
# It starts again as usual (its run file made anew).
start_nbdkit a2 -- "${args[@]}" volume=vol-a lease=2
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"\x22" * 65536, 0); assert h.pread(65536, 0) == b"\x22" * 65536' ||
    fail "vol-a does not serve after its files were pruned"
stop_nbdkit_clean

# ---- Killed: kept until older-than= ----
start_nbdkit b -- "${args[@]}" volume=vol-b lease=1
hb=$(hash_of vol-b)
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"\x33" * 65536, 0)' || fail "write to vol-b failed"
kill -KILL "$NBDKIT_PID"
wait "$NBDKIT_PID" 2>/dev/null || true
t_kill=$(date +%s)
out=$(state list dir="$dir")
grep -qx 'state=not-stopped-cleanly' <<<"$(block "$out" vol-b)" ||
    fail "the killed vol-b is not listed as not stopped cleanly:"$'\n'"$out"
while (($(date +%s) - t_kill <= 2)); do sleep 0.2; done
out=$(state prune dir="$dir")
grep -q '^kept=it did not stop cleanly' <<<"$(block "$out" vol-b)" ||
    fail "vol-b was not kept without older-than=:"$'\n'"$out"
[[ -n $(files_of "$hb") ]] || fail "vol-b's files went without older-than="
out=$(state prune dir="$dir" older-than=1s)
grep -qx "removed=$dir/volume.key.$hb.run" <<<"$(block "$out" vol-b)" ||
    fail "older-than=1s did not prune the killed vol-b:"$'\n'"$out"
[[ -z $(files_of "$hb") ]] || fail "vol-b's files are left: $(files_of "$hb")"
log "vol-b (killed): kept without older-than=, pruned with older-than=1s"

# ---- Bad usage ----
rc=0
state prune dir="$dir" older-than=soon >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "a bad older-than= exited $rc, expected 2"
rc=0
state list dir="$tmpdir/nowhere" >/dev/null 2>&1 || rc=$?
[[ $rc == 1 ]] || fail "a missing dir= exited $rc, expected 1"
log "PASS"
