#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The disk backup tier (backup=FILE), with a single donor holding every slab (replicas=1):
# 1. kill -9 of the memserver: every byte written reads back right (from the file); new writes
#    (no donor left to allocate on) go to the file alone and read back right too.
# 2. a new memserver comes up: every slab is copied onto it from the file (status: nothing is
#    served by the file alone any more, the memserver holds every slab).
# 3. nbdkit stops cleanly (the file is marked clean) and starts again: no memserver kept
#    anything (lease=0), so the file brings every slab back, and they are copied onto the
#    memserver again. Then the file's data is overwritten with garbage, and every byte still
#    reads back right: it comes from the memserver, not from the file.
# 4. a start without backup= in between: the file is no longer trusted for slabs no donor kept.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl

stat_get() { sed -n "s/^$1=//p" "$tmpdir/status"; }
stat_is() { [[ $(stat_get "$1") == "$2" ]]; }
# fio_region NAME OFFSET_MIB SIZE_MIB write|verify (crc32c, seeded by the offset).
fio_region() {
    local name=$1 off=$2 size=$3 mode=$4 extra=(--do_verify=1)
    [[ $mode == verify ]] && extra=(--verify_only)
    timeout 90 fio --name="$name" --ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite \
        --bssplit=4k/50:128k/50 --iodepth=8 --offset="${off}M" --size="${size}M" --verify=crc32c \
        --verify_fatal=1 --verify_state_save=0 --randseed=$((off + 1)) "${extra[@]}" \
        --output-format=json >"$tmpdir/fio-$name.json" ||
        { cat "$tmpdir/fio-$name.json" >&2; tail -n 30 "$NBDKIT_LOG" >&2; fail "fio $name ($mode of $size MiB at $off MiB) failed"; }
}
backup=$tmpdir/backup
a_port=$(free_port) b_port=$(free_port)
args=(server="127.0.0.1:$a_port" server="127.0.0.1:$b_port" size=32M replicas=1 lease=0 timeout=5
      statusfile="$tmpdir/status" volume=backup-test volume-key="$tmpdir/volume.key")

# ---- 1. the only memserver is killed ----
MEMSERVER_FIXED_PORT=$a_port start_memserver 64M 1M
a_pid=$MEMSERVER_PID
start_nbdkit b1 -- "${args[@]}" backup="$backup"
fio_region r1 0 16 write
wait_until 10 "the status file" test -s "$tmpdir/status"
[[ $(ctl_get "$a_port" slabs_used) == 16 ]] || fail "expected 16 slabs on the memserver"
kill -KILL "$a_pid"
wait "$a_pid" 2>/dev/null || true
fio_region r1v 0 16 verify
wait_until 5 "status: 16 slabs served by the backup alone" stat_is backup_only 16
stat_is lost 0 || fail "status says $(stat_get lost) slabs lost"
fio_region r2 16 8 write # no memserver at all: allocated in the file alone
fio_region r2v 16 8 verify
wait_until 5 "status: 24 slabs served by the backup alone" stat_is backup_only 24
log "part 1 passed: with its only memserver dead, 24 MiB read back right from the file"

# ---- 2. a new memserver: the slabs are copied onto it from the file ----
MEMSERVER_FIXED_PORT=$b_port start_memserver 64M 1M
wait_until 60 "every slab copied onto the new memserver" stat_is backup_only 0
[[ $(ctl_get "$b_port" slabs_used) == 24 ]] ||
    fail "the new memserver holds $(ctl_get "$b_port" slabs_used) slabs, expected 24"
(($(stat_get repaired) >= 24)) || fail "status says repaired=$(stat_get repaired), expected >= 24"
fio_region r1v2 0 16 verify
fio_region r2v2 16 8 verify
log "part 2 passed: the 24 slabs were copied from the file onto the new memserver"

# ---- 3. a clean restart: the file brings the slabs back ----
kill -TERM "$NBDKIT_PID"
wait "$NBDKIT_PID" 2>/dev/null || true
# The header's clean flag (a 32-bit word after the 16-byte magic and the version).
[[ $(od -An -tu4 -j20 -N4 "$backup" | tr -d ' ') == 1 ]] ||
    { cat "$NBDKIT_LOG" >&2; fail "nbdkit did not mark the backup file clean at its exit"; }
b_empty() { [[ $(ctl_get "$b_port" slabs_used) == 0 ]]; }
wait_until 30 "the memserver freed the slabs (lease=0)" b_empty
rm -f "$tmpdir/status"
start_nbdkit b2 -- "${args[@]}" backup="$backup"
wait_until 20 "the restarted nbdkit restored 24 slabs from the file" \
    grep -q "24 slabs no memserver kept are served from it" "$NBDKIT_LOG"
fio_region r1v3 0 16 verify
fio_region r2v3 16 8 verify
wait_until 60 "every slab copied onto the memserver again" stat_is backup_only 0
[[ $(ctl_get "$b_port" slabs_used) == 24 ]] || fail "the memserver holds $(ctl_get "$b_port" slabs_used) slabs, expected 24"
# Garbage over the file's data (after its 4 KiB header): reads come from the memserver now.
dd if=/dev/urandom of="$backup" bs=1M seek=4096 oflag=seek_bytes count=24 conv=notrunc status=none
fio_region r1v4 0 16 verify
fio_region r2v4 16 8 verify
log "part 3 passed: after a clean restart the file restored every slab onto the memserver"

# ---- 4. a run without backup= makes the file stale ----
kill -TERM "$NBDKIT_PID"
wait "$NBDKIT_PID" 2>/dev/null || true
start_nbdkit b3 -- "${args[@]}"
wait_until 20 "nbdkit b3 made its volume" grep -q "starts EMPTY" "$NBDKIT_LOG"
kill -TERM "$NBDKIT_PID"
wait "$NBDKIT_PID" 2>/dev/null || true
start_nbdkit b4 -- "${args[@]}" backup="$backup"
wait_until 20 "a backup file older than the last run is not trusted" \
    grep -q "closed cleanly, but by an earlier run" "$NBDKIT_LOG"
kill -TERM "$NBDKIT_PID"
wait "$NBDKIT_PID" 2>/dev/null || true
# Another volume's file is refused, naming why.
out=$(timeout 30 nbdkit -f -U "$tmpdir/x.sock" "$PLUGIN" auth-key="$AUTH_KEY" server="127.0.0.1:$b_port" \
      size=16M lease=0 volume=other volume-key="$tmpdir/volume.key" backup="$backup" 2>&1) && fail "nbdkit started with another volume's backup file"
[[ $out == *"made for volume 'backup-test'"* ]] || fail "no clear error for another volume's backup file: $out"
log "part 4 passed"
