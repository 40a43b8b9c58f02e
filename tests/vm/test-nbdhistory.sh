#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The VM's history checker (tests/vm/nbdhistory, issue 25) checked on the host in a few seconds,
# so that CI tests the checker itself: its --self-test (made-up histories: the legal ones pass,
# each kind of wrong bytes is caught); a clean run against nbdkit's memory plugin behind the
# error filter (EIO on 10 % of the requests: failed writes, retries, trims and zeroes, and 0
# violations); and three runs with --inject, which writes bytes the history does not allow
# into a block behind the checker's back (an older write's bytes, zeros, half of each), each of
# which must fail with the violation named.
# Needs nbdkit (its memory plugin and error filter); exits 77 without it.
set -euo pipefail
build=${RDMASWAP_BUILD:?RDMASWAP_BUILD (the meson build directory) is not set}
checker=$build/tests/vm/nbdhistory
[[ -x $checker ]] || { echo "FAIL: $checker is not built"; exit 1; }
nbdkit=$(PATH=/usr/sbin:/usr/bin:$PATH command -v nbdkit || true)
[[ -n $nbdkit ]] || { echo "SKIP: nbdkit not installed"; exit 77; }

tmp=$(mktemp -d)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# start_nbdkit SOCKET ARGS...: nbdkit in the foreground as a background job, until its socket is up
start_nbdkit() {
    local sock=$1 i
    shift
    "$nbdkit" -f -U "$sock" "$@" >"$sock.log" 2>&1 &
    pids+=($!)
    for ((i = 0; i < 100; i++)); do
        [[ -S $sock ]] && return 0
        kill -0 "${pids[-1]}" 2>/dev/null || break
        sleep 0.1
    done
    cat "$sock.log"
    fail "nbdkit $* made no socket $sock"
}

"$checker" --self-test >"$tmp/self.out" 2>&1 || { cat "$tmp/self.out"; fail "nbdhistory --self-test"; }
cat "$tmp/self.out"
grep -q ' 0 failed$' "$tmp/self.out" || fail "the self-test's summary"

start_nbdkit "$tmp/err.sock" --filter=error memory 8M error=EIO error-rate=10%

# The injected runs, side by side (each about 2 s, each with an export of its own), while the
# clean one runs.
for kind in stale zeros torn; do
    start_nbdkit "$tmp/$kind.sock" memory 8M
    "$checker" --socket "$tmp/$kind.sock" --seconds 1.5 --settle 0 --threads 2 \
        --slab-size 1048576 --inject "$kind" >"$tmp/inject-$kind.out" 2>&1 &
    pids+=($!)
    eval "inject_pid_$kind=$!"
done
rc=0
"$checker" --socket "$tmp/err.sock" --seconds 2 --settle 0 --threads 4 --slab-size 1048576 \
    --bound 1 >"$tmp/clean.out" 2>&1 || rc=$?
cat "$tmp/clean.out"
[[ $rc = 0 ]] || fail "nbdhistory against a correct server (with EIOs) exited $rc"
summary=$(grep '^nbdhistory: seed=' "$tmp/clean.out") || fail "no summary line"
[[ $summary == *" violations=0 "* ]] || fail "violations on a correct server: $summary"
eio=$(sed -n 's/.* eio=\([0-9]*\) .*/\1/p' <<<"$summary")
data=$(sed -n 's/.* data=\([0-9]*\) .*/\1/p' <<<"$summary")
trims=$(sed -n 's/.* trims=\([0-9]*\) .*/\1/p' <<<"$summary")
zeros=$(sed -n 's/.* zeros=\([0-9]*\) .*/\1/p' <<<"$summary")
((eio > 0)) || fail "the error filter's EIOs were not counted: $summary"
((data > 100)) || fail "too few data reads checked: $summary"
((trims > 0 && zeros > 0)) || fail "no trim or no zero was sent: $summary"

declare -A want=(
    [stale]="after a newer successful write had ended"
    [zeros]="zeros after a successful write"
    [torn]="torn or mixed contents"
)
for kind in stale zeros torn; do
    pid_var=inject_pid_$kind
    rc=0
    wait "${!pid_var}" || rc=$?
    out=$tmp/inject-$kind.out
    if [[ $rc != 1 ]] || ! grep -q "^VIOLATION: block 2047: .*${want[$kind]}" "$out" \
        || ! grep -q '^  history of block 2047' "$out"; then
        cat "$out"
        fail "--inject $kind: exit $rc, expected 1 with a violation of block 2047 (${want[$kind]})"
    fi
    echo "--inject $kind: $(grep -m1 '^VIOLATION' "$out")"
    grep '^nbdhistory: seed=' "$out"
done
echo "PASS"
