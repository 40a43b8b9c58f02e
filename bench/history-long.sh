#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The history check of tests/integration/test-history.sh (fault proxies in front of the
# memservers, every read checked against the history of its block), for a long time: MINUTES
# (default 30) of faults in rounds of ROUND_SECONDS (default 300; the checker keeps a round's
# whole history in memory), each round with a fresh seed, two thirds of it with replicas=1 and
# a third with replicas=2; then every seed of history-seeds.txt for 30 s. Prints every run's
# summary line (ops checked by kind, EIOs, faults by kind, violations, the longest request) for
# docs/performance.md; exits non-zero on any violation.
# Usage: bench/history-long.sh BUILD_DIR [MINUTES] [ROUND_SECONDS]
# RDMASWAP_KEEP=DIR keeps each round's logs (in DIR/round-N).
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD_DIR [MINUTES] [ROUND_SECONDS]}" && pwd)
minutes=${2:-30} round=${3:-300}
src=$(cd "$(dirname "$0")/.." && pwd)
export RDMASWAP_BUILD=$build RDMASWAP_SOURCE=$src
keep=${RDMASWAP_KEEP:-}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0 n=0 start=$SECONDS
while ((SECONDS - start < minutes * 60)); do
    n=$((n + 1))
    left=$((minutes * 60 - (SECONDS - start)))
    secs=$((left < round ? left : round))
    ((secs >= 15)) || secs=15
    [[ -n $keep ]] && export RDMASWAP_KEEP="$keep/round-$n"
    echo "== round $n: ${secs} s of faults =="
    RDMASWAP_HISTORY_SECONDS=$secs RDMASWAP_HISTORY_CASES=fresh \
        "$src/tests/integration/test-history.sh" 2>&1 | tee -a "$out" || rc=1
done
echo "== the recorded seeds, 30 s each =="
[[ -n $keep ]] && export RDMASWAP_KEEP="$keep/seeds"
RDMASWAP_HISTORY_SEED_SECONDS=30 RDMASWAP_HISTORY_CASES=seeds \
    "$src/tests/integration/test-history.sh" 2>&1 | tee -a "$out" || rc=1
echo "== summary: $minutes min in $n rounds, $(nproc) CPUs, $(date -u +%F) =="
grep -E '^history-check: seed=[0-9]+ ops=|^VIOLATION|^FAIL' "$out" || true
exit "$rc"
