#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Donor give-back: migration throughput and the time from `rdmaswapctl giveback` to the memory
# freed, on this machine over TCP loopback. Three memservers, replicas=2; fill the volume; then
# ask memserver 0 for all its capacity and time until it reports no pending moves; compare the
# data afterwards.
# Usage: bench/giveback.sh BUILD_DIR [SIZE_MIB] [SLAB]
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD_DIR [SIZE_MIB] [SLAB]}" && pwd)
mib=${2:-256} slab=${3:-16M}
export PATH=/usr/bin:/usr/sbin:$PATH
tmp=$(mktemp -d)
export STATE_DIRECTORY="$tmp/state" # the plugin's default volume key: here, not in /var/lib
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
ports=()
key=$tmp/auth.key admin=$tmp/admin.key
for k in "$key" "$admin"; do (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$k"); done
ctl() { "$build/tools/rdmaswapctl" "$@" admin-key="$admin"; }
for i in 0 1 2; do
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	"$build/memserver/rdmaswap-memserver" --listen 127.0.0.1 --port "$port" --capacity $((mib))M \
		--slab-size "$slab" --transport tcp --auth-key "$key" --admin-key "$admin" 2>"$tmp/ms$i.log" &
	pids+=($!) ports+=("$port")
done
for p in "${ports[@]}"; do
	for _ in $(seq 200); do ctl status server=127.0.0.1:$p >/dev/null 2>&1 && break; sleep 0.1; done
done
nbdkit -U "$tmp/sock" -P "$tmp/pid" "$build/nbdkit-plugin/nbdkit-rdmaswap-plugin.so" \
	server=127.0.0.1:${ports[0]} server=127.0.0.1:${ports[1]} server=127.0.0.1:${ports[2]} \
	size=${mib}M replicas=2 statusfile="$tmp/status" auth-key="$key"
pids+=($(cat "$tmp/pid"))
uri="nbd+unix:///?socket=$tmp/sock"
head -c ${mib}M /dev/urandom >"$tmp/data"
nbdcopy "$tmp/data" "$uri"
get() { sed -n "s/^$1=//p" "$tmp/status"; }
sget() { ctl status server=127.0.0.1:${ports[0]} | sed -n "s/^$1=//p"; }
rss() { awk '$1 == "VmRSS:" { print $2 }' "/proc/${pids[0]}/status"; }
sleep 1.5
echo "filled ${mib} MiB, slab=$slab replicas=2; memserver 0: $(sget slabs_used) slabs used, VmRSS $(rss) kB"
t0=$(date +%s.%N)
ctl giveback server=127.0.0.1:${ports[0]} size=${mib}M | tr '\n' ' '
echo
for _ in $(seq 1200); do
	[ "$(sget pending_moves)" = 0 ] && break
	sleep 0.05
done
t1=$(date +%s.%N)
echo "memserver 0: $(sget slabs_withdrawn) slabs withdrawn, $(sget pending_moves) pending, VmRSS $(rss) kB"
sleep 1.2 # the status file is written every second
bytes=$(get migrate_bytes) ms=$(get migrate_ms)
python3 -c "b=int('$bytes'); ms=max(int('$ms'),1); d=$t1-$t0; print('give-back: %d MiB moved; copying %.2f s = %.0f MiB/s; command to memory freed %.2f s' % (b>>20, ms/1000, b/1048576/(ms/1000), d))"
cmp <(nbdcopy "$uri" - | head -c ${mib}M) "$tmp/data" && echo "data after the give-back: identical (cmp)"
