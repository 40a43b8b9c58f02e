#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Re-replication throughput and failure detection time, on this machine over TCP loopback.
# Three memservers, replicas=2; fill the volume; then kill -9 (or SIGSTOP) one memserver and
# time (a) the first read that has to fail over (detection) and (b) until the plugin's status
# shows no degraded slab (re-replication), which gives MiB/s copied.
# Usage: bench/rereplication.sh BUILD_DIR [kill|stop] [SIZE_MIB] [SLAB] [TIMEOUT_S]
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD_DIR [kill|stop] [SIZE_MIB] [SLAB] [TIMEOUT_S]}" && pwd)
how=${2:-kill} mib=${3:-512} slab=${4:-64M} tmo=${5:-3}
export PATH=/usr/bin:/usr/sbin:$PATH
tmp=$(mktemp -d)
export STATE_DIRECTORY="$tmp/state" # the plugin's default volume key: here, not in /var/lib
pids=()
trap 'for p in "${pids[@]}"; do kill -CONT $p 2>/dev/null || true; kill $p 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
ports=()
key=$tmp/auth.key
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$key")
for i in 0 1 2; do
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	"$build/memserver/rdmaswap-memserver" --listen 127.0.0.1 --port "$port" --capacity $((mib * 2))M \
		--slab-size "$slab" --transport tcp --auth-key "$key" 2>"$tmp/ms$i.log" &
	pids+=($!) ports+=("$port")
done
for p in "${ports[@]}"; do
	for _ in $(seq 200); do "$build/tools/rdmaswapctl" status server=127.0.0.1:$p auth-key="$key" >/dev/null 2>&1 && break; sleep 0.1; done
done
nbdkit -U "$tmp/sock" -P "$tmp/pid" "$build/nbdkit-plugin/nbdkit-rdmaswap-plugin.so" \
	server=127.0.0.1:${ports[0]} server=127.0.0.1:${ports[1]} server=127.0.0.1:${ports[2]} \
	size=${mib}M replicas=2 timeout=$tmo statusfile="$tmp/status" auth-key="$key"
pids+=($(cat "$tmp/pid"))
uri="nbd+unix:///?socket=$tmp/sock"
head -c ${mib}M /dev/urandom >"$tmp/data"
nbdcopy "$tmp/data" "$uri"
get() { sed -n "s/^$1=//p" "$tmp/status"; }
sleep 1.5
echo "filled ${mib} MiB, slabs_live=$(get slabs_live) slab=$slab replicas=2 timeout=${tmo}s"
if [ "$how" = stop ]; then kill -STOP "${pids[1]}"; else kill -KILL "${pids[1]}"; fi
t0=$(date +%s.%N)
# Detection: a read of every slab (one 4 KiB read each) has to fail over from the victim.
python3 - "$uri" "$mib" <<'PY'
import nbd, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1])
t = time.monotonic(); worst = 0
for off in range(0, int(sys.argv[2]) << 20, 1 << 20):
    s = time.monotonic(); h.pread(4096, off); worst = max(worst, time.monotonic() - s)
print("reads after the failure: slowest %.2f s (failure detection), all %.2f s" % (worst, time.monotonic() - t))
PY
for _ in $(seq 1200); do
	sleep 0.1
	[ "$(get degraded)" = 0 ] && [ "$(get repaired)" != 0 ] && break
done
t1=$(date +%s.%N)
bytes=$(get repair_bytes)
python3 -c "import sys; b=int('$bytes'); d=$t1-$t0; print('re-replication (%s): %d MiB in %.2f s = %.0f MiB/s; degraded=%s lost=%s' % ('$how', b>>20, d, b/d/1048576, '$(get degraded)', '$(get lost)'))"
cmp <(nbdcopy "$uri" - | head -c ${mib}M) "$tmp/data" && echo "data after re-replication: identical (cmp)"
