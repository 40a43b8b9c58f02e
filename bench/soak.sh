#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The fault soak of the VM tests (issue 11), for longer than CI's 2 minutes: a qemu VM with
# Debian's kernel, 3 memservers each on its own veth link over Soft-RoCE, nbdkit with the
# rdmaswap plugin (replicas=2) as swap through the kernel's nbd driver, a workload that checks
# every page, a 4 KiB O_DIRECT probe of /dev/nbd0 every 100 ms, and faults on one donor at a
# time (netem delay and loss, an nftables partition, SIGSTOP/SIGCONT, kill -9 and restart).
# What it runs and checks: tests/vm/README.md, "Fault soak"; figures: docs/performance.md.
#
# Usage: bench/soak.sh BUILD_DIR
# Environment (all optional):
#   DURATION=600        how long the workload, probe and faults last: seconds, or with s, m, h
#   SEED=               seed of the fault schedule (default: random; printed, to replay a run)
#   TRANSPORT=rdma      rdma or tcp
#   PLUGIN_TIMEOUT=3    the plugin's timeout= (seconds)
#   MIB=64              the workload's working set (MiB; its cgroup has memory.max=32M)
#   LOG=                serial console log (default BUILD_DIR/vm-test-logs/soak-<duration>.log)
# Prints the soak's report (the "soak:" lines) at the end; exit status as run-vm-test.sh: 0 pass,
# 1 fail (content error, I/O error or hung task, or a hang), 77 skip (no qemu or Debian kernel).
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

secs() {   # secs 600|600s|10m|2h: seconds
    case "$1" in
        *[!0-9smh]* | "" | [smh]*) echo "$0: DURATION must be like 600, 600s, 10m or 2h" >&2; exit 2 ;;
        *h) echo $((${1%h} * 3600)) ;;
        *m) echo $((${1%m} * 60)) ;;
        *s) echo "${1%s}" ;;
        *) echo "$1" ;;
    esac
}
duration=$(secs "${DURATION:-600}")
transport=${TRANSPORT:-rdma}
case "$transport" in rdma|tcp) ;; *) echo "$0: TRANSPORT must be rdma or tcp" >&2; exit 2 ;; esac
args=(--runs "soak-$transport" --soak-seconds "$duration"
      --soak-timeout "${PLUGIN_TIMEOUT:-3}" --soak-mib "${MIB:-64}"
      --log "${LOG:-$build/vm-test-logs/soak-${duration}s.log}" --verbose)
[ -z "${SEED:-}" ] || args+=(--soak-seed "$SEED")

# ninja first: the VM copies in the memserver, the plugin, swapload and nbdprobe from BUILD_DIR
ninja -C "$build" > /dev/null
out=$(mktemp -t rdmaswap-soak.XXXXXX)
trap 'rm -f "$out"' EXIT
start=$SECONDS
# the console streams (--verbose); show the soak's own progress lines as they come
set +e
RDMASWAP_BUILD=$build RDMASWAP_SOURCE=$src "$src/tests/vm/run-vm-test.sh" "${args[@]}" 2>&1 \
    | tee "$out" | grep --line-buffered -aE '^(run-vm-test: |vm: (\[soak|=====|FAIL))'
rc=${PIPESTATUS[0]}
set -e
echo
grep -a '^RDMASWAP-VM-SOAK: ' "$out" | sed 's/^RDMASWAP-VM-SOAK: /soak: /' || true
echo "bench/soak.sh: ${duration} s soak, exit $rc, $((SECONDS - start)) s wall"
exit "$rc"
