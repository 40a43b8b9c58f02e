#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Never wrong bytes, proven (issue 25): history-check.py drives the plugin with concurrent
# writes, reads, trims and zeroes of 4 KiB blocks while fault-proxy.py, in front of each
# memserver, holds one of the plugin's connections past timeout= and delivers its bytes late,
# delays, cuts and resets connections; every read is checked against the history (the rule is
# in history-check.py). Cases, with a fresh seed: replicas=1; replicas=2 (two memservers, each
# behind its own proxy) with faults on one donor, where every block must be readable and
# writable again once the faults stop; replicas=2 with faults on both, where slabs that lost
# both replicas may fail with EIO for good (allowed: never wrong bytes). Then every seed in
# history-seeds.txt (seeds that once found a bug) briefly. Fails on any violation.
#
# RDMASWAP_HISTORY_SECONDS (default 60; 30 in a sanitizer build): the fresh seed's faulty
# phase, half with replicas=1, a quarter for each replicas=2 case.
# RDMASWAP_HISTORY_SEED_SECONDS (default 8; 5 in a sanitizer build): each listed seed's.
# RDMASWAP_HISTORY_SEED: this seed instead of a fresh one (the proxies' and the checker's
# choices; the timing still varies). RDMASWAP_HISTORY_CASES: which cases (default "fresh
# seeds"). RDMASWAP_PROXY_ARGS, RDMASWAP_HISTORY_ARGS: more options for every proxy, checker
# (e.g. RDMASWAP_PROXY_ARGS="--rate 0": no faults). bench/history-long.sh runs the same for
# 30 minutes or more.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin

here=$(cd "$(dirname "$0")" && pwd)
# A sanitizer build's nbdkit starts and stops slower: half the faulty time, within meson's 180 s.
if [[ -n ${RDMASWAP_NBDKIT_PRELOAD:-} ]]; then
    total=${RDMASWAP_HISTORY_SECONDS:-30} seed_seconds=${RDMASWAP_HISTORY_SEED_SECONDS:-5}
else
    total=${RDMASWAP_HISTORY_SECONDS:-60} seed_seconds=${RDMASWAP_HISTORY_SEED_SECONDS:-8}
fi
cases=${RDMASWAP_HISTORY_CASES:-fresh seeds}
fresh_seed=${RDMASWAP_HISTORY_SEED:-$(od -An -tu4 -N4 /dev/urandom | tr -d ' ')}
case_no=0
failed=()

# start_proxy NAME TARGET SEED MAX_SECONDS [ARGS...]: fault-proxy.py in front of TARGET (faults
# off until the checker turns them on). Sets PROXY_PID, PROXY_ADDR, PROXY_LOG.
start_proxy() {
    local name=$1 target=$2 seed=$3 max=$4
    shift 4
    PROXY_LOG="$tmpdir/$name.faults"
    # shellcheck disable=SC2086 # RDMASWAP_PROXY_ARGS: words
    "$PYTHON" "$here/helpers/fault-proxy.py" --target "$target" --port-file "$tmpdir/$name.port" \
        --seed "$seed" --log "$PROXY_LOG" --quiet-start --max-seconds "$max" \
        ${RDMASWAP_PROXY_ARGS:-} "$@" >"$tmpdir/$name.log" 2>&1 &
    PROXY_PID=$!
    cleanup_pid "$PROXY_PID"
    wait_until 10 "fault proxy $name listening" test -s "$tmpdir/$name.port"
    PROXY_ADDR=127.0.0.1:$(cat "$tmpdir/$name.port")
}

# stop_pids PID...: SIGTERM, then wait (SIGKILL after 5 s).
stop_pids() {
    local pid i
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "$@"; do
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}

# run_case REPLICAS FAULTY SEED SECONDS: fresh memservers, proxies and nbdkit, faults on the
# first FAULTY proxies; the checker for SECONDS of faults, then its quiescent rewrite and
# read-back (which must succeed unless every donor had faults). Records a failure in `failed`.
run_case() {
    local replicas=$1 faulty=$2 seed=$3 secs=$4 i port servers=() pids=() proxy_args=() rc=0
    local check_args=(--seed "$seed" --seconds "$secs" --slab-size $((1 << 20)))
    if ((faulty < replicas)); then check_args+=(--require-recovery); fi
    case_no=$((case_no + 1))
    local max=$((secs + 120))
    for ((i = 0; i < replicas; i++)); do
        # The proxy first: the memserver's donor certificate must also name the proxy's
        # address, which the plugin dials (functions.sh, start_memserver).
        port=$(free_port)
        if ((i < faulty)); then
            start_proxy "proxy-$case_no-$i" "127.0.0.1:$port" $((seed + i)) "$max"
        else
            start_proxy "proxy-$case_no-$i" "127.0.0.1:$port" $((seed + i)) "$max" --rate 0
        fi
        DONOR_CERT_EXTRA=$PROXY_ADDR MEMSERVER_FIXED_PORT=$port start_memserver 40M 1M
        pids+=("$MEMSERVER_PID" "$PROXY_PID")
        servers+=("server=$PROXY_ADDR")
        proxy_args+=(--proxy-pid "$PROXY_PID" --proxy-log "$PROXY_LOG")
    done
    start_nbdkit "history-$case_no" -- "${servers[@]}" replicas="$replicas" size=16M timeout=1
    pids+=("$NBDKIT_PID")
    log "case $case_no: replicas=$replicas, faults on $faulty donor(s), seed=$seed for ${secs}s"
    # shellcheck disable=SC2086 # RDMASWAP_HISTORY_ARGS: words
    timeout $((secs + 150)) "$PYTHON" "$here/helpers/history-check.py" --uri "$NBDKIT_URI" \
        "${check_args[@]}" "${proxy_args[@]}" ${RDMASWAP_HISTORY_ARGS:-} \
        >"$tmpdir/check-$case_no.out" 2>&1 || rc=$?
    cat "$tmpdir/check-$case_no.out" >&2
    stop_pids "${pids[@]}"
    if ((rc != 0)); then
        failed+=("replicas=$replicas faulty=$faulty seed=$seed (exit $rc)")
        log "case $case_no FAILED: replicas=$replicas faulty=$faulty seed=$seed; to rerun" \
            "it, add \"$seed $replicas $faulty\" to history-seeds.txt or set" \
            "RDMASWAP_HISTORY_SEED=$seed"
    fi
}

"$PYTHON" "$here/helpers/history-check.py" --self-test >&2 || fail "history-check.py --self-test"
if [[ $cases == *fresh* ]]; then
    log "fresh seed $fresh_seed (RDMASWAP_HISTORY_SEED=$fresh_seed reproduces this run's choices)"
    run_case 1 1 "$fresh_seed" $((total / 2))
    run_case 2 1 "$fresh_seed" $((total / 4))
    run_case 2 2 "$fresh_seed" $((total - total / 2 - total / 4))
fi
if [[ $cases == *seeds* ]]; then
    # history-seeds.txt: "SEED REPLICAS FAULTY_DONORS # what it found", one a line.
    while read -r seed replicas faulty _; do
        [[ $seed =~ ^[0-9]+$ ]] || continue
        run_case "${replicas:-1}" "${faulty:-1}" "$seed" "$seed_seconds"
    done <"$here/helpers/history-seeds.txt"
fi
if ((${#failed[@]})); then
    fail "history violations (see above): ${failed[*]}"
fi
log "no violation in $case_no runs"
