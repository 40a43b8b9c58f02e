#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The installed systemd units pass `systemd-analyze verify` (no warning at all), with their
# Exec paths pointed into the DESTDIR install (verify wants the programs to exist) and the
# installed man pages on MANPATH (verify runs man for each Documentation=man: entry). Also
# checks the settings the deployment relies on.
set -euo pipefail
source "$(dirname "$0")/install-functions.sh"
requires systemd-analyze --version
requires_build memserver plugin ctl
install_destdir

units=$tmpdir/units
mkdir "$units"
for u in rdmaswap-memserver.service rdmaswap-nbdkit.service rdmaswap-swap.service; do
    sed -E -e "/^Exec/s#=([-+!@:]*)($SBINDIR|$LIBEXECDIR)/#=\1$DEST\2/#" "$DEST$UNITDIR/$u" >"$units/$u"
done
grep -h '^Exec' "$units"/*.service >&2

# verify looks up every Documentation=man: page; the system's own pages (nbdkit, nbd-client,
# swapon) are absent on hosts installed without documentation, and then that check is skipped.
man_check=yes
for page in nbdkit.1 nbd-client.8 swapon.8; do
    if ! man -w "${page##*.}" "${page%.*}" >/dev/null 2>&1; then
        log "no man page $page on this host: verifying without --man"
        man_check=no
        break
    fi
done
out=$(cd "$units" && MANPATH="$DEST$MANDIR:" SYSTEMD_LOG_COLOR=0 \
    timeout 60 systemd-analyze verify --man="$man_check" "$units"/*.service 2>&1) ||
    fail "systemd-analyze verify failed:"$'\n'"$out"
[[ -z $out ]] || fail "systemd-analyze verify warned:"$'\n'"$out"
log "systemd-analyze verify: no warnings (man check: $man_check)"

# has UNIT LINE: the unit has exactly this line.
has() { grep -qxF "$2" "$units/$1" || fail "$1 lacks the line: $2"; }
has rdmaswap-memserver.service "Type=notify"
has rdmaswap-memserver.service "LimitMEMLOCK=infinity"
has rdmaswap-memserver.service "OOMScoreAdjust=-1000"
has rdmaswap-memserver.service "Restart=on-failure"
has rdmaswap-memserver.service "After=network-online.target rdma-hw.target"
# Least privilege (issue 26): its own user, one capability (test-unit-security.sh scores the rest).
has rdmaswap-memserver.service "User=rdmaswap"
has rdmaswap-memserver.service "CapabilityBoundingSet=CAP_IPC_LOCK"
has rdmaswap-memserver.service "AmbientCapabilities=CAP_IPC_LOCK"
has rdmaswap-nbdkit.service "LimitMEMLOCK=infinity"
has rdmaswap-nbdkit.service "OOMScoreAdjust=-1000"
has rdmaswap-nbdkit.service "RuntimeDirectory=rdmaswap"
# nbdkit is restarted when it fails, and reconnects the swap device once ready.
has rdmaswap-nbdkit.service "Restart=on-failure"
has rdmaswap-nbdkit.service "ExecStartPost=$DEST$LIBEXECDIR/rdmaswap-compute wait-ready"
# (reconnect outside the sandbox: it needs CAP_SYS_ADMIN and /dev/nbdN, which nbdkit is denied)
has rdmaswap-nbdkit.service "ExecStartPost=+$DEST$LIBEXECDIR/rdmaswap-compute reconnect"
[[ $(grep '^ExecStartPost=' "$units/rdmaswap-nbdkit.service" | tail -n 1) == *" reconnect" ]] ||
    fail "rdmaswap-nbdkit.service: reconnect is not the last ExecStartPost (after wait-ready)"
# swapoff before nbdkit stops: the swap unit is ordered after nbdkit (so it stops first when
# both stop). It only wants nbdkit: bound to it (BindsTo=) or requiring it (Requires=), it would
# be stopped or restarted with nbdkit's automatic restart, swapoff against a dead nbdkit.
has rdmaswap-swap.service "Wants=rdmaswap-nbdkit.service"
has rdmaswap-swap.service "After=rdmaswap-nbdkit.service"
has rdmaswap-swap.service "ExecStop=$DEST$LIBEXECDIR/rdmaswap-compute detach"
! grep -Eq '^(BindsTo|Requires|PartOf|Requisite|PropagatesStopTo|StopPropagatedFrom)=' "$units/rdmaswap-swap.service" ||
    fail "rdmaswap-swap.service has a dependency that nbdkit's restart would propagate to it"
