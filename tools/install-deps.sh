#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install everything rdmaswap needs to build, run and test on Debian 12 (run as root).
# --runtime: only what a donor or compute host needs to run it (no compilers, no test tools).
set -euo pipefail
runtime=(nbdkit nbd-client rdma-core ibverbs-providers librdmacm1 libibverbs1 libspdlog1.10
	 iproute2 kmod libssl3 libmicrohttpd12 libcurl4)
build=(gcc g++ meson ninja-build pkg-config nbdkit-plugin-dev libibverbs-dev librdmacm-dev
       libspdlog-dev libcli11-dev catch2 libssl-dev clang libclang-rt-14-dev libmicrohttpd-dev
       libcurl4-openssl-dev nlohmann-json3-dev clang-tidy)
tests=(libnbd-bin python3-libnbd fio qemu-system-x86 linux-image-amd64 busybox-static cpio
       ibverbs-utils rdmacm-utils perftest procps psmisc util-linux python3
       systemd man-db groff-base cryptsetup-bin nftables python3-cryptography
       prometheus # promtool: tests/integration/test-metrics.sh
       etcd-server etcd-client
       debhelper lintian) # dpkg-buildpackage and lintian: tests/install/test-deb.sh
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
# Debian's etcd-server starts a single-member etcd on 127.0.0.1:2379 when it is installed. The
# tests never use it (they start their own members on free loopback ports and name their
# endpoints), and a build host should not run an etcd it did not ask for: unless the host has a
# policy of its own, invoke-rc.d is told not to start etcd during the install (exit 101: action
# forbidden), and the unit is disabled afterwards.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
	# shellcheck disable=SC2016 # $a is the policy script's own
	printf '#!/bin/sh\nfor a; do [ "$a" = etcd ] && exit 101; done\nexit 0\n' >"$policy"
	chmod 755 "$policy"
	trap 'rm -f "$policy"' EXIT
fi
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
if [[ " ${missing[*]} " == *" etcd-server "* ]] && command -v systemctl >/dev/null; then
	systemctl disable --now etcd.service >/dev/null 2>&1 || true
fi
