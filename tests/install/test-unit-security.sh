#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The systemd units' sandboxing holds (issue 26, S14): `systemd-analyze security --offline=yes`
# scores each built unit file, and none may be above its bound (the scale runs from 0, fully
# confined, to 10). Before issue 26: memserver 7.4, nbdkit 7.4, swap 9.6. The bounds: the
# memserver at most 2.5 (it needs only CAP_IPC_LOCK, the network and the RDMA devices), nbdkit
# 2.5 (root's keys, mlockall, SCHED_RR and PR_SET_IO_FLUSHER, the RDMA devices) and the swap unit
# 2.8 (swapon, the nbd netlink family, modprobe nbd, /dev/nbdN). Also: the analysis reports no
# error about the files. Needs only systemd-analyze (offline mode: systemd 250 or later); under
# a second.
set -euo pipefail
source "$(dirname "$0")/../integration/functions.sh"
command -v systemd-analyze >/dev/null || skip "no systemd-analyze"
systemd-analyze security --help 2>/dev/null | grep -q -- '--offline' ||
    skip "systemd-analyze has no --offline (systemd older than 250)"

declare -A bound=(
    [rdmaswap-memserver.service]=2.5
    [rdmaswap-nbdkit.service]=2.5
    [rdmaswap-swap.service]=2.8
)
summary=()
for u in rdmaswap-memserver.service rdmaswap-nbdkit.service rdmaswap-swap.service; do
    f=$RDMASWAP_BUILD/systemd/$u
    [[ -f $f ]] || fail "no built unit $f"
    # (--offline reads only the file; a copy in $tmpdir keeps the build directory's other files
    # out of its search path.)
    cp "$f" "$tmpdir/$u"
    out=$(cd "$tmpdir" && SYSTEMD_LOG_COLOR=0 SYSTEMD_COLORS=0 \
        timeout 60 systemd-analyze security --offline=yes --no-pager "$u" 2>&1) ||
        fail "systemd-analyze security $u failed:"$'\n'"$out"
    score=$(sed -n "s/.*Overall exposure level for $u: \([0-9.]*\).*/\1/p" <<<"$out")
    [[ $score =~ ^[0-9]+\.[0-9]$ ]] || fail "no exposure level for $u in:"$'\n'"$out"
    ! grep -qiE '^(Failed|.*: (error|warning))' <<<"$out" ||
        fail "systemd-analyze security $u complained:"$'\n'"$out"
    awk -v s="$score" -v b="${bound[$u]}" 'BEGIN { exit !(s <= b) }' || {
        grep '✗' <<<"$out" >&2 || true
        fail "$u: exposure $score, above its bound ${bound[$u]}"
    }
    summary+=("$u $score (bound ${bound[$u]})")
done
log "exposure: ${summary[*]}"
