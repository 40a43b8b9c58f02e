#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# statusfile= and metrics-file= are written through a temporary file that is created new and
# never through a symbolic link (issue 26, S10): links planted where the old code put its
# temporary file (PATH.tmp) must not make nbdkit overwrite their targets.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_build memserver plugin

start_memserver 8M 1M
dir="$tmpdir/state"
mkdir -p "$dir"
victim="$tmpdir/victim"
echo "precious" >"$victim"
ln -s "$victim" "$dir/status.tmp"
ln -s "$victim" "$dir/metrics.prom.tmp"
start_nbdkit status -- server="$MEMSERVER_ADDR" size=4M statusfile="$dir/status" \
    metrics-file="$dir/metrics.prom"
wait_until 20 "the status file" test -s "$dir/status"
wait_until 20 "the metrics file" test -s "$dir/metrics.prom"
sleep 2.5 # a few more rewrites
[[ $(cat "$victim") == precious ]] || fail "a planted link's target was overwritten: $(head -c 80 "$victim")"
[[ -L $dir/status.tmp && -L $dir/metrics.prom.tmp ]] || fail "the planted links were replaced"
grep -q '^size=' "$dir/status" || fail "no size= in the status file"
grep -q '^rdmaswap_volume' "$dir/metrics.prom" || fail "no metrics in the metrics file"
[[ $(stat -c %a "$dir/metrics.prom") == 644 ]] || fail "metrics file mode $(stat -c %a "$dir/metrics.prom")"
# No temporary files left behind but the planted ones.
left=$(find "$dir" -name '*.tmp-*' | wc -l)
[[ $left == 0 ]] || fail "$left temporary files left behind"
log "status and metrics files written, planted links untouched"
