#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `meson install --destdir` lays everything out where it belongs: the plugin in nbdkit's
# plugindir, the memserver and rdmaswap-nbd in sbin, rdmaswapctl in bin, the helper in libexec, the systemd
# units, the example configs and the man pages; no test program is installed. The installed
# programs run from there (no build-tree rpath needed): nbdkit --dump-plugin with the installed
# plugin, rdmaswap-memserver --help, rdmaswapctl against a live memserver.
set -euo pipefail
source "$(dirname "$0")/install-functions.sh"
requires nbdkit --version
requires_build memserver plugin ctl
install_destdir

expect=(
    "$PLUGINDIR/nbdkit-rdmaswap-plugin.so"
    "$SBINDIR/rdmaswap-memserver"
    "$BINDIR/rdmaswapctl"
    "$SBINDIR/rdmaswap-nbd"
    "$LIBEXECDIR/rdmaswap-compute"
    "$UNITDIR/rdmaswap-memserver.service"
    "$UNITDIR/rdmaswap-nbdkit.service"
    "$UNITDIR/rdmaswap-swap.service"
    "$SYSUSERSDIR/rdmaswap-memserver.conf"
    "$EXAMPLEDIR/compute.conf"
    "$EXAMPLEDIR/rdmaswap-memserver.default"
    "$MANDIR/man1/nbdkit-rdmaswap-plugin.1"
    "$MANDIR/man8/rdmaswap-memserver.8"
    "$MANDIR/man8/rdmaswapctl.8"
    "$MANDIR/man8/rdmaswap-nbd.8"
)
for f in "${expect[@]}"; do
    [[ -f $DEST$f ]] || fail "not installed: $f"
done
for f in "$SBINDIR/rdmaswap-memserver" "$BINDIR/rdmaswapctl" "$SBINDIR/rdmaswap-nbd" \
    "$LIBEXECDIR/rdmaswap-compute"; do
    [[ -x $DEST$f ]] || fail "not executable: $f"
done
# Nothing else: in particular no test binary or test shim.
installed=$(cd "$DEST" && find . -type f | sed 's|^\.||' | sort)
unexpected=$(grep -vxF -f <(printf '%s\n' "${expect[@]}") <<<"$installed" || true)
[[ -z $unexpected ]] || fail "installed but not expected:"$'\n'"$unexpected"

# The units and the helper point at the installed paths.
grep -qx "ExecStart=$SBINDIR/rdmaswap-memserver \$RDMASWAP_MEMSERVER_ARGS" \
    "$DEST$UNITDIR/rdmaswap-memserver.service" || fail "memserver unit: wrong ExecStart"
grep -qx "EnvironmentFile=-$SYSCONFDIR/default/rdmaswap-memserver" \
    "$DEST$UNITDIR/rdmaswap-memserver.service" || fail "memserver unit: wrong EnvironmentFile"
grep -qx "ExecStart=$LIBEXECDIR/rdmaswap-compute nbdkit" \
    "$DEST$UNITDIR/rdmaswap-nbdkit.service" || fail "nbdkit unit: wrong ExecStart"
grep -qx "conf=$SYSCONFDIR/rdmaswap/compute.conf" "$DEST$LIBEXECDIR/rdmaswap-compute" ||
    fail "rdmaswap-compute: wrong config path"
grep -qx "plugin_default=$PLUGINDIR/nbdkit-rdmaswap-plugin.so" "$DEST$LIBEXECDIR/rdmaswap-compute" ||
    fail "rdmaswap-compute: wrong plugin path"
if grep -rlI '@[a-z_]*@' "$DEST"; then
    fail "unsubstituted @placeholders@ in the files above"
fi

# nbdkit loads the installed plugin (after a real install, `nbdkit rdmaswap --dump-plugin`).
out=$(timeout 20 nbdkit "$DEST$PLUGINDIR/nbdkit-rdmaswap-plugin.so" --dump-plugin) ||
    fail "nbdkit --dump-plugin with the installed plugin failed"
version=$(meson introspect --projectinfo "$RDMASWAP_BUILD" |
    "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["version"])')
for want in name=rdmaswap "rdmaswap_version=$version" rdmaswap_tcp=yes rdmaswap_rdma=yes \
    thread_model=parallel; do
    grep -qx "$want" <<<"$out" || fail "--dump-plugin has no line $want:"$'\n'"$out"
done
grep -qx 'rdmaswap_rdma_devices=[0-9]*' <<<"$out" || fail "--dump-plugin: no rdmaswap_rdma_devices="

# The installed programs run from the DESTDIR: no dependence on the build tree.
timeout 10 "$DEST$SBINDIR/rdmaswap-memserver" --help >/dev/null ||
    fail "installed rdmaswap-memserver --help failed"
MEMSERVER=$DEST$SBINDIR/rdmaswap-memserver
RDMASWAPCTL=$DEST$BINDIR/rdmaswapctl
start_memserver 4M 1M
[[ $(ctl_get "$MEMSERVER_PORT" slabs_total) == 4 ]] || fail "installed rdmaswapctl: wrong slabs_total"
log "installed layout OK"
