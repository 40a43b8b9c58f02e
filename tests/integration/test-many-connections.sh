#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Many connections cost the memserver no threads, and one peer cannot slow the others: 300
# idle connections (100 sessions of 3, authenticated, HELLO said) stay open for the whole test
# while 16 clients (16 nbdkit instances, channels=2, one fio job each) write and verify
# (crc32c) a fixed amount of I/O, once alone and once beside a client that sends 1 MiB READs
# until its buffers are full and never reads a reply. Every fio job must pass; the memserver's
# thread count (sampled every 0.1 s) must stay <= 32; its STATS must count the idle
# connections while fio runs, and none of them may be dropped; the run beside the non-reader
# may take at most twice as long as the run without it (+5 s: 2 noisy cores), and the
# memserver may not grow by more than 64 MiB beside it (back-pressure, not a queue); a fresh
# client must get in and verify its I/O afterwards. Issue 13: the memserver of one thread per
# connection ran 383 threads here.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires fio --enghelp=nbd
requires_build memserver plugin ctl
here=$(cd "$(dirname "$0")" && pwd)

clients=16 size_mib=8 loops=16 idle_sessions=100 per_session=3 max_threads=32
idle=$((idle_sessions * per_session))
# Everything comes from 127.0.0.1: the per-address limits must let it all in. The non-reader
# must stay stuck for the whole run, not be dropped after the default 10 s. An event-driven
# memserver runs 8 loops by default: 2 here, so that the thread bound measures what does
# not grow with the connections.
threads_arg=()
"$MEMSERVER" --help 2>/dev/null | grep -q -- '--threads' && threads_arg=(--threads 2)
start_memserver $(((clients + 4) * size_mib))M 1M --max-connections 1024 \
    --max-peer-connections 1024 --max-peer-sessions 1024 --connect-rate 0 --message-timeout 120 \
    "${threads_arg[@]}"

# The thread count, every 0.1 s until $tmpdir/stop-sampler exists (at most 5 minutes).
(
    for ((i = 0; i < 3000; i++)); do
        [[ -e $tmpdir/stop-sampler ]] && break
        awk '$1 == "Threads:" { print $2 }' "/proc/$MEMSERVER_PID/status" 2>/dev/null || break
        sleep 0.1
    done
) >"$tmpdir/threads" &
sampler=$!
cleanup_pid $sampler

helper() { # helper MODE ARGS...: many-conn-client.py in the background, sets HELPER_PID
    "$PYTHON" "$here/helpers/many-conn-client.py" "$1" 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" \
        "$tmpdir/stop-helpers" 280 "${@:2}" >"$tmpdir/$1.out" 2>&1 &
    HELPER_PID=$!
    cleanup_pid $HELPER_PID
}
helper_ready() { # helper_ready MODE PID: wait for its "ready:" line; fail if it exited first
    local i
    for ((i = 0; i < 600; i++)); do
        grep -q '^ready:' "$tmpdir/$1.out" && { cat "$tmpdir/$1.out" >&2; return 0; }
        kill -0 "$2" 2>/dev/null || { cat "$tmpdir/$1.out" >&2; fail "the $1 client exited"; }
        sleep 0.1
    done
    fail "the $1 client was not ready within 60 s"
}

helper idle $idle_sessions $per_session
idler=$HELPER_PID
helper_ready idle $idler

uris=()
for ((i = 0; i < clients; i++)); do
    start_nbdkit "c$i" -t 4 -- server="$MEMSERVER_ADDR" size=${size_mib}M channels=2 \
        volume="many-c$i"
    uris+=("$NBDKIT_URI")
done

# job_file FILE ARGS...: one fio job per nbdkit, with the [global] options ARGS.
job_file() {
    local f=$1 a
    shift
    {
        echo "[global]"
        for a in "$@"; do echo "$a"; done
        for ((i = 0; i < clients; i++)); do
            printf '[c%d]\nuri=%s\n' "$i" "${uris[i]}"
        done
    } >"$f"
}
# Slabs are granted on first write: fill every device once, so that both timed runs find them.
job_file "$tmpdir/fill.fio" ioengine=nbd rw=write bs=1M iodepth=2 size=${size_mib}M
timeout 60 fio --output-format=json "$tmpdir/fill.fio" >"$tmpdir/fill.json" ||
    { cat "$tmpdir/fill.json" >&2; fail "fio could not fill the devices"; }
job_file "$tmpdir/verify.fio" ioengine=nbd rw=randwrite bssplit=4k/50:128k/50 iodepth=4 \
    size=${size_mib}M loops=$loops do_verify=1 verify=crc32c verify_fatal=1 verify_state_save=0

# timed_run NAME SEED: the 16 verified clients at once, each writing and verifying its whole device
# $loops times over; fails on any error. Sets RUN_MS, and CONNECTIONS to STATS' count 1 s into the run.
timed_run() {
    local name=$1 seed=$2 t0 t1 pid rc=0
    t0=$EPOCHREALTIME
    timeout 120 fio --output-format=json --randseed="$seed" "$tmpdir/verify.fio" \
        >"$tmpdir/$name.json" &
    pid=$!
    cleanup_pid $pid
    sleep 1
    CONNECTIONS=$(ctl_get "$MEMSERVER_PORT" connections)
    wait $pid || rc=$?
    t1=$EPOCHREALTIME
    [[ $rc -eq 0 ]] || { cat "$tmpdir/$name.json" >&2; fail "fio $name failed (exit $rc)"; }
    "$PYTHON" "$here/helpers/fio-check.py" "$tmpdir/$name.json" \
        $((loops * clients * size_mib * 1024 * 1024 * 9 / 10)) || fail "fio $name: see above"
    RUN_MS=$(((${t1/./} - ${t0/./}) / 1000))
    log "$name: $clients verified clients in $RUN_MS ms; the memserver counted $CONNECTIONS connections"
}

timed_run alone 1
alone_ms=$RUN_MS alone_conns=$CONNECTIONS

rss0=$(proc_kb "$MEMSERVER_PID" VmRSS)
helper nonreader
nonreader=$HELPER_PID
helper_ready nonreader $nonreader
timed_run beside-nonreader 2
beside_ms=$RUN_MS beside_conns=$CONNECTIONS
rss1=$(proc_kb "$MEMSERVER_PID" VmRSS)

touch "$tmpdir/stop-helpers"
rc=0
wait $idler || rc=$?
cat "$tmpdir/idle.out" >&2
[[ $rc -eq 0 ]] || fail "idle connections were dropped, or the idle client failed (see above)"
rc=0
wait $nonreader || rc=$?
cat "$tmpdir/nonreader.out" >&2
[[ $rc -eq 0 ]] || fail "the non-reading client failed (see above)"
grep -q 'connection still open' "$tmpdir/nonreader.out" ||
    fail "the non-reader was dropped before --message-timeout 120: the run beside it proves nothing"

# The memserver still serves: a fresh client writes and verifies.
kill -0 "$MEMSERVER_PID" 2>/dev/null || fail "memserver died"
start_nbdkit fresh -- server="$MEMSERVER_ADDR" size=${size_mib}M channels=2 \
    volume=many-fresh
timeout 60 fio --name=fresh --ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite \
    --bssplit=4k/50:128k/50 --iodepth=4 --size=${size_mib}M --do_verify=1 --verify=crc32c \
    --verify_fatal=1 --verify_state_save=0 --output-format=json >"$tmpdir/fresh.json" ||
    { cat "$tmpdir/fresh.json" >&2; fail "a fresh client's fio failed"; }
"$PYTHON" "$here/helpers/fio-check.py" "$tmpdir/fresh.json" $((size_mib * 1024 * 1024 * 9 / 10)) ||
    fail "fresh client: see above"

touch "$tmpdir/stop-sampler"
wait $sampler || true
samples=$(wc -l <"$tmpdir/threads")
threads=$(sort -n "$tmpdir/threads" | tail -n 1)
((samples >= 10)) || fail "only $samples samples of the memserver's thread count"
log "memserver threads: at most $threads in $samples samples (bound $max_threads);" \
    "connections counted: $alone_conns alone, $beside_conns beside the non-reader;" \
    "$clients verified clients: $alone_ms ms alone, $beside_ms ms beside the non-reader;" \
    "memserver VmRSS $rss0 kB before the non-reader, $rss1 kB after the run beside it"

# Each nbdkit holds at least one connection (5 today: control, 2 channels, ...), rdmaswapctl's
# STATS counts its own, and the non-reader one more.
((alone_conns >= idle + clients + 1)) ||
    fail "STATS counted $alone_conns connections during the run alone, want >= $idle idle + $clients clients + 1"
((beside_conns >= idle + clients + 2)) ||
    fail "STATS counted $beside_conns connections beside the non-reader, want >= $idle idle + $clients clients + 2"
((threads <= max_threads)) ||
    fail "the memserver ran $threads threads with $beside_conns connections (bound $max_threads)"
((beside_ms <= 2 * alone_ms + 5000)) ||
    fail "the non-reading client slowed the others: $beside_ms ms beside it, $alone_ms ms alone"
# Back-pressure, not a queue: the non-reader's unsent replies must not pile up in the memserver
# (its 60 000 or so READs of 1 MiB would be 60 GB). Not in a sanitizer build, whose allocator
# keeps freed memory in quarantine.
if [[ -z ${RDMASWAP_NBDKIT_PRELOAD:-} ]]; then
    ((rss1 - rss0 <= 64 * 1024)) ||
        fail "the memserver grew by $((rss1 - rss0)) kB beside a client that reads no reply"
fi
