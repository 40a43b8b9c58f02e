#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One-machine demo: install dependencies, build, start a memserver and nbdkit with the rdmaswap
# plugin on this host, then
#  - as root with the kernel's nbd driver available: attach /dev/nbd0 with nbd-client -swap,
#    mkswap + swapon, show it in use, and take it down again (--keep: stay up until Ctrl-C);
#  - elsewhere: exercise the device with libnbd tools (nbdinfo, nbdcopy in/out + cmp, trim)
#    and show what the memserver holds.
# Usage: tools/demo.sh [--keep] [--size SIZE] [--transport tcp|rdma|auto]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$src/build
keep=0
size=1G
transport=auto
while [ $# -gt 0 ]; do
	case "$1" in
	--keep) keep=1 ;;
	--size) size=$2; shift ;;
	--transport) transport=$2; shift ;;
	*) echo "usage: $0 [--keep] [--size SIZE] [--transport tcp|rdma|auto]" >&2; exit 2 ;;
	esac
	shift
done
say() { printf '\n== %s\n' "$*"; }

"$src/tools/install-deps.sh"
say "building into $build"
[ -f "$build/build.ninja" ] || meson setup "$build" "$src" >/dev/null
ninja -C "$build" >/dev/null

tmp=$(mktemp -d)
ms_pid=""
swapdev=""
cleanup() {
	set +e
	if [ -n "$swapdev" ]; then
		swapoff "$swapdev" 2>/dev/null
		nbd-client -d "$swapdev" >/dev/null 2>&1
	fi
	[ -f "$tmp/nbdkit.pid" ] && kill "$(cat "$tmp/nbdkit.pid")" 2>/dev/null
	[ -n "$ms_pid" ] && kill "$ms_pid" 2>/dev/null && wait "$ms_pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# The cluster key every memserver and client shares (mode 0600: the programs refuse others).
key=$tmp/auth.key
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$key")
ctl() { "$build/tools/rdmaswapctl" status server=127.0.0.1:$port auth-key="$key"; }
# The operators' CA certifies the donor for the address the plugin dials; the plugin uses only
# certified donors (donor-ca=; docs/deployment.md, "Donor certificates").
say "making a CA and a certificate for the donor at 127.0.0.1:$port"
"$build/tools/rdmaswapctl" ca create "$tmp/ca.key" >/dev/null
"$build/tools/rdmaswapctl" donor-key create "$tmp/donor.key" >/dev/null
"$build/tools/rdmaswapctl" cert issue ca-key="$tmp/ca.key" donor-key="$tmp/donor.key.pub" \
	name=demo-donor addresses=127.0.0.1:$port days=1 out="$tmp/donor.cert"
say "starting rdmaswap-memserver on 127.0.0.1:$port (capacity 2G, slabs 64M, transport $transport)"
"$build/memserver/rdmaswap-memserver" --listen 127.0.0.1 --port "$port" --capacity 2G \
	--slab-size 64M --transport "$transport" --auth-key "$key" \
	--donor-key "$tmp/donor.key" --donor-cert "$tmp/donor.cert" 2>"$tmp/memserver.log" &
ms_pid=$!
for _ in $(seq 100); do ctl >/dev/null 2>&1 && break; sleep 0.2; done
ctl >/dev/null || { cat "$tmp/memserver.log"; exit 1; }
cat "$tmp/memserver.log"

sock=$tmp/nbd.sock
say "starting nbdkit --swap with the rdmaswap plugin on $sock (size $size)"
nbdkit --swap -U "$sock" -P "$tmp/nbdkit.pid" "$build/nbdkit-plugin/nbdkit-rdmaswap-plugin.so" \
	server=127.0.0.1:$port size="$size" transport="$transport" auth-key="$key" \
	donor-ca="$tmp/ca.key.pub"
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done

if [ "$(id -u)" = 0 ] && { [ -b /dev/nbd0 ] || modprobe nbd 2>/dev/null; } && [ -b /dev/nbd0 ]; then
	swapdev=/dev/nbd0
	say "attaching $swapdev as swap"
	nbd-client -unix "$sock" "$swapdev" -swap -b 4096 -C 2
	mkswap "$swapdev" >/dev/null
	swapon --priority 10 "$swapdev"
	swapon --show
	say "memserver state"
	ctl
	if [ $keep = 1 ]; then
		say "swap is attached; press Ctrl-C to take it down (swapoff first, then nbdkit)"
		while sleep 3600; do :; done
	fi
	say "taking it down: swapoff, nbd-client -d, stop nbdkit, stop memserver"
else
	say "no /dev/nbd0 here (not root, or a kernel without the nbd module): using libnbd tools"
	uri="nbd+unix:///?socket=$sock"
	nbdinfo "$uri" | grep -E "export-size|block_size|can_(trim|zero|multi_conn)" || true
	head -c 96M /dev/urandom >"$tmp/in"
	say "nbdcopy 96 MiB of random data in, and back out"
	nbdcopy "$tmp/in" "$uri"
	nbdcopy "$uri" "$tmp/out"
	head -c 96M "$tmp/out" | cmp - "$tmp/in" && echo "bytes read back match (cmp)"
	say "memserver state after the copy"
	ctl | grep -E "slabs_used|tcp_write_bytes|rdma_qps"
	say "trimming the device gives the slabs back"
	PATH=/usr/bin:$PATH nbdsh -u "$uri" -c 'h.trim(h.get_size(), 0)'
	ctl | grep -E "slabs_used"
fi
say "demo done"
