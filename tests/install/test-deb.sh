#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Debian packages: `dpkg-buildpackage -us -uc -b` builds rdmaswap-memserver,
# nbdkit-plugin-rdmaswap and rdmaswap-tools (lintian: no error); they install on this host with
# every unit disabled and none started, the installed units pass `systemd-analyze verify` and
# the installed programs run; an upgrade keeps an edited conffile, replaces an unedited one, keeps
# the memserver enabled and stops or restarts no unit; removal stops the units, and purge leaves
# no file, conffile, enable link or state behind.
#
# It installs for real (dpkg -i on this host), so it runs only as root and only in CI ($CI set)
# or when asked (RDMASWAP_TEST_DEB_INSTALL=1), and skips when any of the packages is installed
# or any of their files exists (e.g. from `meson install --prefix=/usr`): it never touches what
# it did not make, and purges what it installed even when it fails. dpkg runs in a private mount
# namespace in which /run/systemd/system exists and `systemctl` on PATH is a stub that logs
# each start/stop/restart the maintainer scripts ask for (and forwards the offline --root
# operations: enable links, is-enabled), so no service really starts, even on a host that runs
# systemd. RDMASWAP_DEB_DIR=DIR takes the three .debs from DIR instead of building them.
set -euo pipefail
source "$(dirname "$0")/install-functions.sh"

pkgs=(rdmaswap-memserver nbdkit-plugin-rdmaswap rdmaswap-tools)
units=(rdmaswap-memserver.service rdmaswap-nbdkit.service rdmaswap-swap.service)
v2=+debtest # the upgrade: the same packages, version VERSION$v2

[[ $(id -u) == 0 ]] || skip "installs packages: needs root"
[[ -n ${CI:-} || -n ${RDMASWAP_TEST_DEB_INSTALL:-} ]] ||
    skip "installs packages on this host: runs in CI (CI set) or with RDMASWAP_TEST_DEB_INSTALL=1"
requires dpkg-deb --version
requires unshare --mount true
systemctl=$(command -v systemctl) || skip "no systemctl"
for p in "${pkgs[@]}"; do
    if dpkg-query -W -f '${db:Status-Status}' "$p" 2>/dev/null | grep -qv '^not-installed$'; then
        skip "$p is already known to dpkg (installed or not purged): not touching it"
    fi
done
# (Every file of the packages is checked once they are built; these first, to skip early.)
for f in /usr/sbin/rdmaswap-memserver /usr/bin/rdmaswapctl /lib/systemd/system/rdmaswap-memserver.service; do
    [[ ! -e $f ]] || skip "$f exists (a meson install?): not overwriting it"
done

# Cleanup, before functions.sh's own (which removes $tmpdir): purge what this test installed.
installed_by_us=0
deb_cleanup() {
    [[ $installed_by_us == 1 ]] || return 0
    local p
    for p in "${pkgs[@]}"; do
        if dpkg-query -W -f '${db:Status-Status}' "$p" 2>/dev/null | grep -qv '^not-installed$'; then
            log "cleanup: purging $p"
            in_ns dpkg --purge --force-all "$p" >>"$tmpdir/cleanup.log" 2>&1 ||
                { log "cleanup: dpkg --purge $p failed"; cat "$tmpdir/cleanup.log" >&2; }
        fi
    done
    # What the test made as an administrator would (dpkg does not own these).
    rm -f /etc/systemd/system/multi-user.target.wants/rdmaswap-memserver.service
    rm -rf /var/lib/rdmaswap
}
trap 'rc_=$?; set +e; deb_cleanup; (exit $rc_); cleanup' EXIT

# ---- The stubbed environment for dpkg ----
stub=$tmpdir/stub
mkdir "$stub"
actions=$tmpdir/systemctl.log # one line per systemctl call of a maintainer script
active=$tmpdir/active         # units the stub reports as running
: >"$actions"
: >"$active"
cat >"$stub/systemctl" <<EOF
#!/bin/bash
# Test stub: log the call without its options ("offline: ..." for --root calls, which go to
# the real systemctl, as does is-enabled); is-active answers from $active; the rest (start,
# stop, daemon-reload, ...) does nothing.
words=()
for a; do [[ \$a == -* ]] || words+=("\$a"); done
for a; do
    if [[ \$a == --root=* ]]; then
        echo "offline: \${words[*]}" >>'$actions'
        exec '$systemctl' "\$@"
    fi
done
echo "\${words[*]}" >>'$actions'
case \${words[0]:-} in
is-enabled) exec '$systemctl' --root=/ is-enabled "\${words[@]:1}" ;;
is-active) grep -qxF "\${words[1]:-}" '$active' ;;
*) exit 0 ;;
esac
EOF
printf '#!/bin/sh\nexit 0\n' >"$stub/policy-rc.d" # let deb-systemd-invoke act (on the stub)
chmod 755 "$stub/systemctl" "$stub/policy-rc.d"

# in_ns CMD...: run CMD in a private mount namespace where systemd seems to run
# (/run/systemd/system exists), the stub systemctl is first on PATH and policy-rc.d allows
# every action (the host's may forbid all, as Docker images do).
in_ns() {
    local run=/run/systemd
    [[ -d $run ]] || run=/run
    unshare --mount --propagation private bash -c '
        mount -t tmpfs rdmaswap-test "$1" && mkdir -p /run/systemd/system || exit 1
        [[ ! -e /usr/sbin/policy-rc.d ]] || mount --bind "$2/policy-rc.d" /usr/sbin/policy-rc.d || exit 1
        shift 2
        PATH=$0:$PATH DEBIAN_FRONTEND=noninteractive exec "$@"' "$stub" "$run" "$stub" "$@"
}

# actions_of NAME: the start/stop/restart requests logged since the last call, without the
# offline and query calls; saved as $tmpdir/actions.NAME.
actions_of() {
    grep -vE '^(offline:|is-enabled|is-active|daemon-reload)' "$actions" |
        grep -E 'rdmaswap' >"$tmpdir/actions.$1" || true
    : >"$actions"
    if [[ -s $tmpdir/actions.$1 ]]; then
        log "$1: the maintainer scripts asked systemctl:"
        sed 's/^/    /' "$tmpdir/actions.$1" >&2
    fi
}

# ---- Build (or take) the packages ----
version=$(meson introspect --projectinfo "$RDMASWAP_BUILD" |
    "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["version"])')
changelog_version=$(cd "$RDMASWAP_SOURCE" && dpkg-parsechangelog -S Version)
[[ $changelog_version == "$version" ]] ||
    fail "debian/changelog is at $changelog_version, meson.build at $version"
arch=$(dpkg --print-architecture)
debs=$tmpdir/v1
mkdir "$debs"
start=$SECONDS
if [[ -n ${RDMASWAP_DEB_DIR:-} ]]; then
    for p in "${pkgs[@]}"; do
        cp "$RDMASWAP_DEB_DIR/${p}_${version}_$arch.deb" "$debs/" ||
            fail "RDMASWAP_DEB_DIR: no ${p}_${version}_$arch.deb"
    done
else
    requires command -v dh
    "$RDMASWAP_SOURCE/tools/build-debs.sh" "$debs" || fail "the packages could not be built"
    log "dpkg-buildpackage -b: $((SECONDS - start)) s"
fi

if command -v lintian >/dev/null; then
    lintian --fail-on error --no-tag-display-limit "$debs"/*.deb >"$tmpdir/lintian.log" 2>&1 ||
        { cat "$tmpdir/lintian.log" >&2; fail "lintian found errors"; }
    grep -E '^[EW]:' "$tmpdir/lintian.log" >&2 || log "lintian: no error, no warning"
else
    log "no lintian here: packages not checked"
fi

# Every regular file (and symlink) of the packages: none may exist before the install.
files=$tmpdir/files
for d in "$debs"/*.deb; do
    dpkg-deb --fsys-tarfile "$d" | tar -t | sed -n 's|^\./|/|; /[^/]$/p'
done | sort -u >"$files"
grep -qx /usr/sbin/rdmaswap-memserver "$files" || fail "no /usr/sbin/rdmaswap-memserver in the packages"
while read -r f; do
    [[ ! -e $f && ! -L $f ]] || skip "$f exists (a meson install?): not overwriting it"
done <"$files"
for f in /etc/systemd/system/rdmaswap-* /etc/systemd/system/*/rdmaswap-* /var/lib/rdmaswap; do
    [[ ! -e $f && ! -L $f ]] || skip "$f exists: not touching an installation this test did not make"
done

# ---- Install ----
installed_by_us=1
in_ns dpkg -i "$debs"/*.deb >"$tmpdir/install.log" 2>&1 ||
    { cat "$tmpdir/install.log" >&2; fail "dpkg -i failed"; }
actions_of install
for p in "${pkgs[@]}"; do
    [[ $(dpkg-query -W -f '${db:Status-Status} ${Version}' "$p") == "installed $version" ]] ||
        fail "$p is not installed at $version"
done
while read -r f; do
    [[ -e $f ]] || fail "installed, but missing: $f"
done <"$files"
# The memserver's system user (its unit's User=rdmaswap), made by the postinst; kept on purge.
getent passwd rdmaswap >/dev/null || fail "the installation made no user rdmaswap"
conffiles=$(dpkg-query -W -f '${Conffiles}\n' "${pkgs[@]}" | awk 'NF {print $1}' | sort)
[[ $conffiles == $'/etc/default/rdmaswap-memserver\n/etc/rdmaswap/compute.conf' ]] ||
    fail "conffiles are not the two config files:"$'\n'"$conffiles"

# Nothing enabled, nothing started: the memserver needs a key and a capacity, the compute units
# the memservers.
for u in rdmaswap-memserver.service rdmaswap-swap.service; do
    state=$("$systemctl" --root=/ is-enabled "$u" 2>&1 || true)
    [[ $state == disabled ]] || fail "$u is '$state' after the install, not disabled"
done
state=$("$systemctl" --root=/ is-enabled rdmaswap-nbdkit.service 2>&1 || true)
[[ $state == static ]] || fail "rdmaswap-nbdkit.service is '$state', not static"
! grep -qE '^(start|restart|try-restart|reload-or-restart|enable)' "$tmpdir/actions.install" ||
    fail "the install started or enabled a unit (above)"

# The installed units pass systemd-analyze verify (as test-systemd-verify, here in place).
requires systemd-analyze --version
man_check=yes
for page in nbdkit.1 nbd-client.8 swapon.8 rdmaswap-memserver.8 nbdkit-rdmaswap-plugin.1; do
    man -w "${page##*.}" "${page%.*}" >/dev/null 2>&1 || man_check=no
done
unitdir=$(pkg-config --variable=systemdsystemunitdir systemd)
out=$(SYSTEMD_LOG_COLOR=0 timeout 60 systemd-analyze verify --man="$man_check" \
    "${units[@]/#/$unitdir/}" 2>&1) || fail "systemd-analyze verify failed:"$'\n'"$out"
[[ -z $out ]] || fail "systemd-analyze verify warned:"$'\n'"$out"
log "installed units: systemd-analyze verify clean (man check: $man_check)"

# The installed programs run where the units and nbdkit look for them.
out=$(timeout 20 nbdkit rdmaswap --dump-plugin) || fail "nbdkit rdmaswap --dump-plugin failed"
grep -qx "rdmaswap_version=$version" <<<"$out" || fail "nbdkit finds no plugin at $version:"$'\n'"$out"
check=$(/usr/libexec/rdmaswap-compute check) || fail "rdmaswap-compute check with the shipped compute.conf failed"
grep -q "^nbdkit --swap .* $(pkg-config --variable=plugindir nbdkit)/nbdkit-rdmaswap-plugin.so " \
    <<<"$check" || fail "rdmaswap-compute runs no installed plugin:"$'\n'"$check"
timeout 10 rdmaswap-nbd --help >/dev/null 2>&1 || fail "rdmaswap-nbd --help failed"
MEMSERVER=/usr/sbin/rdmaswap-memserver
RDMASWAPCTL=/usr/bin/rdmaswapctl
start_memserver 4M 1M
[[ $(ctl_get "$MEMSERVER_PORT" slabs_total) == 4 ]] || fail "installed memserver/rdmaswapctl: wrong slabs_total"
kill "$MEMSERVER_PID"
wait "$MEMSERVER_PID" 2>/dev/null || true

# ---- Upgrade ----
# What an administrator does meanwhile: edit the memserver's options, enable it (it is then
# running), and the plugin makes its volume key.
echo '# edited by test-deb' >>/etc/default/rdmaswap-memserver
edited=$(cat /etc/default/rdmaswap-memserver)
"$systemctl" --root=/ enable rdmaswap-memserver.service >/dev/null 2>&1 ||
    fail "systemctl --root=/ enable rdmaswap-memserver.service failed"
echo rdmaswap-memserver.service >"$active"
(umask 077 && mkdir -p /var/lib/rdmaswap && head -c 32 /dev/urandom >/var/lib/rdmaswap/volume.key)
# Version 2: the same packages with a higher version, and both conffiles changed.
new=$tmpdir/v2
mkdir "$new"
for d in "$debs"/*.deb; do
    x=$tmpdir/x
    dpkg-deb -R "$d" "$x"
    sed -i "s/^Version: .*/Version: $version$v2/" "$x/DEBIAN/control"
    for c in etc/default/rdmaswap-memserver etc/rdmaswap/compute.conf; do
        [[ ! -f $x/$c ]] || echo "# changed in $version$v2" >>"$x/$c"
    done
    dpkg-deb --root-owner-group -Zgzip -b "$x" "$new/" >/dev/null
    rm -rf "$x"
done
in_ns dpkg -i --force-confold "$new"/*.deb >"$tmpdir/upgrade.log" 2>&1 ||
    { cat "$tmpdir/upgrade.log" >&2; fail "the upgrade (dpkg -i) failed"; }
actions_of upgrade
for p in "${pkgs[@]}"; do
    [[ $(dpkg-query -W -f '${db:Status-Status} ${Version}' "$p") == "installed $version$v2" ]] ||
        fail "$p was not upgraded to $version$v2"
done
[[ $(cat /etc/default/rdmaswap-memserver) == "$edited" ]] ||
    fail "the upgrade did not keep the edited /etc/default/rdmaswap-memserver"
grep -qx "# changed in $version$v2" /etc/default/rdmaswap-memserver.dpkg-dist ||
    fail "no new /etc/default/rdmaswap-memserver.dpkg-dist beside the edited file"
grep -qx "# changed in $version$v2" /etc/rdmaswap/compute.conf ||
    fail "the upgrade did not replace the unedited /etc/rdmaswap/compute.conf"
[[ $("$systemctl" --root=/ is-enabled rdmaswap-memserver.service 2>&1) == enabled ]] ||
    fail "the upgrade disabled rdmaswap-memserver.service"
# A running memserver holds other hosts' pages: no stop, no restart. (The postinst's start of
# the enabled unit is a no-op for a running one.)
! grep -qE '^(stop|restart|try-restart|reload-or-restart|kill)' "$tmpdir/actions.upgrade" ||
    fail "the upgrade stopped or restarted a unit (above)"
! grep -qE '^start .*rdmaswap-(swap|nbdkit)' "$tmpdir/actions.upgrade" ||
    fail "the upgrade started a disabled compute unit (above)"

# ---- Remove and purge ----
in_ns dpkg --purge "${pkgs[@]}" >"$tmpdir/purge.log" 2>&1 ||
    { cat "$tmpdir/purge.log" >&2; fail "dpkg --purge failed"; }
actions_of purge
: >"$active"
installed_by_us=0 # purged: the cleanup has nothing left to do
for u in "${units[@]}"; do
    grep -qE "^stop( .*)? $u( |\$)" "$tmpdir/actions.purge" || fail "the removal did not stop $u"
done
for p in "${pkgs[@]}"; do
    if dpkg-query -W -f '${db:Status-Status}' "$p" 2>/dev/null | grep -qv '^not-installed$'; then
        fail "$p is still known to dpkg after the purge"
    fi
done
left=()
while read -r f; do
    [[ ! -e $f && ! -L $f ]] || left+=("$f")
done <"$files"
for f in /etc/default/rdmaswap-memserver* /etc/rdmaswap /usr/share/doc/rdmaswap \
    /etc/systemd/system/rdmaswap-* /etc/systemd/system/*/rdmaswap-* \
    /var/lib/systemd/deb-systemd-helper-enabled/rdmaswap-* \
    /var/lib/systemd/deb-systemd-helper-enabled/*/rdmaswap-* \
    /var/lib/systemd/deb-systemd-helper-masked/rdmaswap-* /var/lib/rdmaswap; do
    [[ ! -e $f && ! -L $f ]] || left+=("$f")
done
if ((${#left[@]})); then
    installed_by_us=1 # let the cleanup try again
    rm -f /etc/systemd/system/multi-user.target.wants/rdmaswap-memserver.service
    fail "left behind after the purge: ${left[*]}"
fi
log "install $version, upgrade to $version$v2, purge: OK ($((SECONDS - start)) s)"
