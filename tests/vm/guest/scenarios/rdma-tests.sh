# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# rdma-tests (MODE=rdma, before its runs): rdmaswap-rdma-tests, the transport's tests against
# the VM's Soft-RoCE device (RDMASWAP_TEST_RDMA_ADDR=ADDR), must pass within
# RDMA_TESTS_TIMEOUT s (exit 77, skipped, and a missing binary are reported, not failed).
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

run_rdma_tests() {
    _t=/usr/local/bin/rdmaswap-rdma-tests
    if [ ! -x "$_t" ]; then
        say "rdmaswap-rdma-tests not built; skipping them"
        return 0
    fi
    say "running rdmaswap-rdma-tests (RDMASWAP_TEST_RDMA_ADDR=$ADDR)"
    _t0=$(uptime_s)
    RDMASWAP_TEST_RDMA_ADDR=$ADDR run_bounded "$RDMA_TESTS_TIMEOUT" /run/rdma-tests.log "$_t"
    _rc=$?
    sed 's/^/rdma-tests: /' /run/rdma-tests.log | tail -n 40
    say "rdmaswap-rdma-tests exit $_rc after $(elapsed "$_t0" "$(uptime_s)") s"
    case $_rc in
        0) ;;
        77) say "rdmaswap-rdma-tests skipped themselves (77)" ;;
        124) fail "rdmaswap-rdma-tests did not finish within $RDMA_TESTS_TIMEOUT s" ;;
        *) fail "rdmaswap-rdma-tests failed (exit $_rc)" ;;
    esac
}
