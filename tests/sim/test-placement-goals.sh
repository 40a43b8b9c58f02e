#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 14's goal for donor sets: 1,000 hosts over 1,000 donors (256 slabs each, 2 replicas,
# the default spread), at the fill given (0.5 or 0.94): at most 32 sessions per donor and a
# fullest donor at most 1.1 times the mean fill, with every slab placed whole. The same check
# must reject today's unbounded placement (spread 0: every host on every donor), or it proves
# nothing. Usage: test-placement-goals.sh PLACEMENT_SIM FILL
set -euo pipefail
sim=$1 fill=$2

# check ARGS...: run the simulator, print its summary; true if the goals hold.
check() {
	local out last sessions ratio short unplaced
	out=$("$sim" --donors 1000 --hosts 1000 --replicas 2 --fill "$fill" --quiet "$@")
	echo "$out" | tail -n 4
	last=$(echo "$out" | tail -n 1)
	[[ $last =~ ^max_sessions_per_donor=([0-9]+)\ max_mean_fill=([0-9.]+)$ ]] ||
		{ echo "unexpected last line: $last"; exit 1; }
	sessions=${BASH_REMATCH[1]} ratio=${BASH_REMATCH[2]}
	short=$(echo "$out" | sed -n 's/.*short_slabs=\([0-9]*\).*/\1/p')
	unplaced=$(echo "$out" | sed -n 's/.*unplaced_slabs=\([0-9]*\).*/\1/p')
	[ "$short" = 0 ] && [ "$unplaced" = 0 ] || { echo "slabs not placed whole"; return 1; }
	[ "$sessions" -le 32 ] && awk -v r="$ratio" 'BEGIN { exit !(r <= 1.1) }'
}

echo "== spread 8 (the default), fill $fill"
check || { echo "FAIL: the goals do not hold"; exit 1; }
echo "== spread 0 (every host on every donor), fill $fill: must miss the goals"
if check --spread 0; then
	echo "FAIL: the check passed unbounded placement too"
	exit 1
fi
echo "PASS"
