#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Run one libFuzzer target for a bounded time, as a meson test (suite 'fuzz'):
#   run-fuzzer.sh FUZZER CORPUS_DIR [PERCENT]
# The committed corpus CORPUS_DIR is copied to a scratch corpus next to FUZZER
# (<fuzzer>-corpus/, recreated every run) that the fuzzer grows; CORPUS_DIR itself is never
# written. A crash, a leak, a UBSan finding, an input that runs longer than
# RDMASWAP_FUZZ_INPUT_TIMEOUT seconds (default 10) or an RSS over 2 GiB fails the test; the
# offending input is saved as <fuzzer>-artifacts/crash-*, leak-*, timeout-*, oom-*.
# The run lasts PERCENT (default 100) percent of RDMASWAP_FUZZ_SECONDS (default 30), at least
# 1 s (meson.build says why a target gets less). The last lines say how many inputs ran and
# the coverage reached (libFuzzer's cov:, edges covered, and ft:, features).
set -euo pipefail
fuzzer=$1
corpus=$2
secs=$(( ${RDMASWAP_FUZZ_SECONDS:-30} * ${3:-100} / 100 ))
((secs >= 1)) || secs=1
[[ -x $fuzzer ]] || { echo "FAIL: not built: $fuzzer" >&2; exit 1; }
[[ -d $corpus ]] || { echo "FAIL: no corpus directory $corpus" >&2; exit 1; }
scratch="$fuzzer-corpus"
artifacts="$fuzzer-artifacts"
rm -rf "$scratch"
mkdir -p "$scratch" "$artifacts"
cp "$corpus"/* "$scratch"/
log="$fuzzer.log"
rc=0
# The outer timeout only guards against a hung fuzzer: libFuzzer stops itself at -max_total_time.
timeout --kill-after=10 $((secs + 120)) "$fuzzer" \
    -max_total_time="$secs" -timeout="${RDMASWAP_FUZZ_INPUT_TIMEOUT:-10}" -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$scratch" >"$log" 2>&1 || rc=$?
if [[ $rc -ne 0 ]]; then
    tail -n 60 "$log" >&2
    echo "FAIL: $(basename "$fuzzer") exited with $rc; inputs in $artifacts:" >&2
    ls -l "$artifacts" >&2
    exit 1
fi
# libFuzzer's last status line ("#N DONE cov: C ft: F corp: ...") and its final stats.
grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || { tail -n 20 "$log"; echo "FAIL: no DONE line" >&2; exit 1; }
grep -E '^stat::(number_of_executed_units|peak_rss_mb|new_units_added)' "$log"
echo "$(basename "$fuzzer"): $(ls "$scratch" | wc -l) inputs in the scratch corpus after ${secs}s"
