#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# RDMA path accounting (issue 13): what the RDMA data path does per request. Boots the VM of the
# VM tests (tests/vm: Debian's kernel under qemu TCG, Soft-RoCE on rxe0) with an acct run: a
# memserver and nbdkit with the rdmaswap plugin over rxe, the device filled, then fio's nbd
# engine (one connection) for ROW_SECONDS per row; the plugin's status file is read before and
# after each row. Prints per request: work requests posted, doorbells (ibv_post_send), CQ polls
# and the empty ones, completions, arms and sleeps on the completion channel, batches, and
# nbdkit's and the memserver's CPU microseconds. What it runs: tests/vm/README.md, "Data path accounting"; the
# figures: docs/performance.md, "RDMA path accounting".
#
# Usage: bench/rdma-accounting.sh BUILD_DIR
# Environment (all optional):
#   ROW_SECONDS=5       seconds of fio per row
#   ROWS="..."          rows RW:BS:QD (default: 4k randread and randwrite at QD1 and QD32,
#                       32k randread at QD8)
#   TRANSPORTS=rdma     acct runs in this order in one boot: rdma, tcp, proxy (tcp: requests
#                       and CPU only, for comparison; proxy: the peer, nbdkit's nbd plugin to
#                       an nbdkit memory plugin over TCP; its donor_us is the back nbdkit's CPU)
#   LOG=                serial console log (default BUILD_DIR/vm-test-logs/rdma-accounting.log)
# Exit status as run-vm-test.sh: 0 pass, 1 fail (a fio error, or counters that break the
# accounting's invariants), 77 skip (no qemu or Debian kernel).
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=""
for t in ${TRANSPORTS:-rdma}; do
    case "$t" in rdma|tcp|proxy) runs+="${runs:+,}acct-$t" ;; *) echo "$0: TRANSPORTS: rdma, tcp or proxy" >&2; exit 2 ;; esac
done
args=(--runs "$runs" --acct-seconds "${ROW_SECONDS:-5}"
      --log "${LOG:-$build/vm-test-logs/rdma-accounting.log}" --quiet)
[ -z "${ROWS:-}" ] || args+=(--acct-rows "$ROWS")

# ninja first: the VM copies in the memserver and the plugin from BUILD_DIR
ninja -C "$build" > /dev/null
out=$(mktemp -t rdmaswap-acct.XXXXXX)
trap 'rm -f "$out"' EXIT
start=$SECONDS
set +e
RDMASWAP_BUILD=$build RDMASWAP_SOURCE=$src "$src/tests/vm/run-vm-test.sh" "${args[@]}" > "$out" 2>&1
rc=$?
set -e
grep -a -E '^vm: \[acct-|^run-vm-test: ' "$out" || true
echo
grep -a '^acct: ' "$out" | sed 's/^acct: //' || true
[ "$rc" = 0 ] || tail -n 60 "$out"
echo "bench/rdma-accounting.sh: exit $rc, $((SECONDS - start)) s wall"
exit "$rc"
