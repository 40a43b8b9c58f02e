#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build the Debian packages (rdmaswap-memserver, nbdkit-plugin-rdmaswap, rdmaswap-tools) of this
# source tree with `dpkg-buildpackage -us -uc -b` and put the three .debs in OUTDIR.
# dpkg-buildpackage builds in the tree and writes next to it: so it runs in a scratch copy of the
# source without .git, .cache, build dirs (build*, obj-*, any with meson-private) or tests/
# (not read with -Dtests=disabled). Used by tests/install/test-deb.sh and, in CI, by
# tools/run-tests.sh (in the background, beside the sanitizer builds).
# Usage: tools/build-debs.sh OUTDIR     Exit status 0 when all three were built.
set -euo pipefail
src_root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: build-debs.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
pkgs=(rdmaswap-memserver nbdkit-plugin-rdmaswap rdmaswap-tools)
command -v dh >/dev/null || { echo "build-debs: debhelper is not installed" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/rdmaswap-debs.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/rdmaswap
mkdir -p "$src"
for f in "$src_root"/* "$src_root"/.[!.]*; do
    [[ -e $f ]] || continue
    case $(basename "$f") in .git | .cache | tests | build* | obj-*) continue ;; esac
    [[ -d $f/meson-private ]] && continue
    cp -a "$f" "$src/"
done
log=$out/build.log
(cd "$src" && dpkg-checkbuilddeps -Pnocheck) >"$log" 2>&1 ||
    { cat "$log" >&2; echo "build-debs: build dependencies missing (tools/install-deps.sh)" >&2; exit 1; }
(cd "$src" && DEB_BUILD_OPTIONS="nocheck noautodbgsym parallel=$(nproc)" \
    timeout 1200 dpkg-buildpackage -us -uc -b -Pnocheck) >>"$log" 2>&1 ||
    { tail -n 60 "$log" >&2; echo "build-debs: dpkg-buildpackage failed" >&2; exit 1; }
version=$(cd "$src_root" && dpkg-parsechangelog -S Version)
arch=$(dpkg --print-architecture)
for p in "${pkgs[@]}"; do
    mv "$work/${p}_${version}_$arch.deb" "$out/" || { echo "build-debs: not built: $p" >&2; exit 1; }
done
