#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# What a give-back move costs reads of the slab being moved, and how long moving one slab
# takes, over TCP loopback on this machine: two memservers, one slab of SLAB bytes, 4 KiB
# random reads at QD1 with no move and during the move (bench/move_latency.cpp).
# Usage: bench/move-latency.sh BUILD_DIR [SLAB (default 256M)] [SECONDS (default 3)]
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD_DIR [SLAB] [SECONDS]}" && pwd)
slab=${2:-256M} secs=${3:-3}
bytes=$(numfmt --from=iec "$slab")
export PATH=/usr/bin:/usr/sbin:$PATH
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
key=$tmp/auth.key
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$key")
servers=()
for i in 0 1; do
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	"$build/memserver/rdmaswap-memserver" --listen 127.0.0.1 --port "$port" \
		--capacity $((bytes * 2)) --slab-size "$bytes" --transport tcp --auth-key "$key" \
		2>"$tmp/ms$i.log" &
	pids+=($!) servers+=("127.0.0.1:$port")
	for _ in $(seq 200); do
		"$build/tools/rdmaswapctl" status server=127.0.0.1:$port auth-key="$key" >/dev/null 2>&1 && break
		sleep 0.1
	done
done
"$build/bench/rdmaswap-bench-move" "${servers[0]}" "${servers[1]}" "$key" "$bytes" "$secs"
