#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install everything rdmaswap needs to build, run and test on Debian 12 (run as root).
# --runtime: only what a donor or compute host needs to run it (no compilers, no test tools).
set -euo pipefail
runtime=(nbdkit nbd-client rdma-core ibverbs-providers librdmacm1 libibverbs1 libspdlog1.10
	 iproute2 kmod libssl3 libmicrohttpd12)
build=(gcc g++ meson ninja-build pkg-config nbdkit-plugin-dev libibverbs-dev librdmacm-dev
       libspdlog-dev libcli11-dev catch2 libssl-dev clang libclang-rt-14-dev libmicrohttpd-dev)
tests=(libnbd-bin python3-libnbd fio qemu-system-x86 linux-image-amd64 busybox-static cpio
       ibverbs-utils rdmacm-utils perftest procps psmisc util-linux python3
       systemd man-db groff-base cryptsetup-bin nftables python3-cryptography
       prometheus) # promtool: tests/integration/test-metrics.sh
want=("${runtime[@]}")
[ "${1:-}" = "--runtime" ] || want+=("${build[@]}" "${tests[@]}")
missing=()
for p in "${want[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "install-deps: all ${#want[@]} packages present"
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "install-deps: need root to install: ${missing[*]}" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
