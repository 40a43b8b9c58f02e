#!/bin/sh
# SPDX-License-Identifier: MIT
# /init of the rdmaswap test VM (PID 1; busybox ash, POSIX sh).  run-vm-test.sh copies this file into
# the initramfs as /init, the folder guest/ next to it as /guest, and writes its settings to
# /etc/rdmaswap-vm.conf.  This file only dispatches: the harness (settings, logging, bounded
# waits, servers, swap, peer messages) is guest/lib.sh, the boot guest/boot.sh, and each
# scenario or run kind guest/scenarios/NAME.sh, which starts with the behaviour it proves.
#
# Every wait is bounded.  The script ends with exactly one line
#   RDMASWAP-VM-RESULT: PASS
#   RDMASWAP-VM-RESULT: FAIL <reason of the first failed check>
# and powers the VM off (the host script reads that line from the serial console).

PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
umask 022

GUEST=/guest
if [ ! -r "$GUEST/lib.sh" ] || [ ! -r "$GUEST/boot.sh" ]; then
    echo "RDMASWAP-VM-RESULT: FAIL no $GUEST/lib.sh or $GUEST/boot.sh in the initramfs"
    poweroff -n -f 2>/dev/null
    echo o > /proc/sysrq-trigger 2>/dev/null
    exit 1
fi
. "$GUEST/lib.sh"       # the settings' defaults and the harness (defines only)
read_config             # /etc/rdmaswap-vm.conf
. "$GUEST/boot.sh"      # file systems, console, modules, network, Soft-RoCE
for _scenario in "$GUEST"/scenarios/*.sh; do
    . "$_scenario"          # each defines its run (and its own fixed settings)
done

# one_swap_run RUN: one run of RUNS (or --extra-runs), by its kind: KIND-T runs the scenario
# KIND over T; anything else is a swap run [pressure-][crypt-]memory|tcp|rdma (scenarios/swap.sh).
one_swap_run() {
    case "$1" in
        repkill-*) repkill_run "${1#repkill-}"; return ;;
        backupkill-*) backupkill_run "${1#backupkill-}"; return ;;
        alloc-*) alloc_run "${1#alloc-}"; return ;;
        acct-*) acct_run "${1#acct-}"; return ;;
        reattach-*) reattach_run block "${1#reattach-}"; return ;;
        persist-*) reattach_run swap "${1#persist-}"; return ;;
        reconnect-*) reconnect_run "${1#reconnect-}"; return ;;
        soak-*) soak_run "${1#soak-}"; return ;;
        app-*) app_run "${1#app-}"; return ;;
        fence-*) fence_run "${1#fence-}"; return ;;
    esac
    swap_run "$1"
}

# ---------------------------------------------------------------------------------------------
# Scenario

: > /run/bench.txt
case "$MODE" in
    rdma)
        rdma_sanity
        run_rdma_tests
        check_dmesg
        for _m in $RUNS; do
            one_swap_run "$_m"
        done
        ;;
    memory|tcp|pressure|runs|bench)
        [ "$needs_rdma" = 1 ] && rdma_sanity
        for _m in $RUNS; do
            one_swap_run "$_m"
        done
        case "$MODE" in memory|tcp) ;; *) print_bench ;; esac
        ;;
    kill)
        [ "$KILL_TRANSPORT" = rdma ] && rdma_sanity
        # --extra-runs first: kill_test leaves I/O errors in the kernel log on purpose
        for _m in $RUNS; do
            [ "$_m" = kill ] || one_swap_run "$_m"
        done
        kill_test
        ;;
    twohost)
        if [ "$ROLE" = server ]; then twohost_server; else twohost_client; fi
        ;;
    *)
        fail "unknown mode '$MODE'"
        ;;
esac
say "all checks passed at $(uptime_s) s"
finish PASS
