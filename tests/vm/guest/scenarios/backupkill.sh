# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# backupkill-T (issue 15): repkill-T with one memserver, replicas=1 and the plugin's disk backup
# tier (backup= a file in the VM's /run): the only donor is killed mid-run, every page must still
# verify (swapped-out pages are read from the file, new ones written there alone), no I/O error,
# and the status must show them served by the file (backup_only > 0, lost=0).
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

backupkill_run() {   # backupkill_run tcp|rdma
    _saved_servers=$REP_SERVERS _saved_replicas=$REP_REPLICAS
    REP_SERVERS=1 REP_REPLICAS=1 REP_BACKUP=/run/rdmaswap-backup.img
    rm -f "$REP_BACKUP"
    repkill_run "$1"
    rm -f "$REP_BACKUP"
    REP_BACKUP="" REP_SERVERS=$_saved_servers REP_REPLICAS=$_saved_replicas
}
