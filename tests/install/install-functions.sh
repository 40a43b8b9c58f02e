# SPDX-License-Identifier: MIT
# Shared by the install tests: the integration helpers plus a `meson install` into a DESTDIR.
#
# Source it from a test script that runs with `set -euo pipefail`:
#   source "$(dirname "$0")/install-functions.sh"
# install_destdir installs the build (as built: --no-rebuild) under $tmpdir/dest and sets
# DEST and the installed directories (as the running system would see them, without $DEST):
# PREFIX BINDIR SBINDIR LIBEXECDIR MANDIR DATADIR SYSCONFDIR UNITDIR SYSUSERSDIR PLUGINDIR
# EXAMPLEDIR.
source "$(dirname "${BASH_SOURCE[0]}")/../integration/functions.sh"

install_destdir() {
    requires meson --version
    requires pkg-config --version
    DEST=$tmpdir/dest
    timeout 120 meson install -C "$RDMASWAP_BUILD" --no-rebuild --quiet --destdir "$DEST" \
        >"$tmpdir/install.log" 2>&1 || { cat "$tmpdir/install.log" >&2; fail "meson install failed"; }
    local opts
    opts=$(meson introspect --buildoptions "$RDMASWAP_BUILD" | "$PYTHON" -c '
import json, os, sys
d = {o["name"]: o["value"] for o in json.load(sys.stdin)}
p = d["prefix"]
for k in ("bindir", "sbindir", "libexecdir", "mandir", "datadir", "sysconfdir"):
    print("%s=%s" % (k.upper(), os.path.join(p, d[k])))
print("PREFIX=%s" % p)') || fail "meson introspect --buildoptions failed"
    eval "$opts"
    UNITDIR=$(pkg-config --variable=systemdsystemunitdir systemd 2>/dev/null || true)
    [[ -n $UNITDIR ]] || UNITDIR=$PREFIX/lib/systemd/system
    SYSUSERSDIR=$(pkg-config --variable=sysusersdir systemd 2>/dev/null || true)
    [[ -n $SYSUSERSDIR ]] || SYSUSERSDIR=$PREFIX/lib/sysusers.d
    PLUGINDIR=$(pkg-config --variable=plugindir nbdkit) || fail "pkg-config nbdkit failed"
    EXAMPLEDIR=$DATADIR/doc/rdmaswap/examples
    log "installed under $DEST (prefix $PREFIX, units in $UNITDIR, plugin in $PLUGINDIR)"
}
