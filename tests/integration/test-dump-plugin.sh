#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `nbdkit rdmaswap --dump-plugin` states the plugin's version and which transports it was built with.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_build plugin

out=$(timeout 20 nbdkit "$PLUGIN" --dump-plugin) || fail "nbdkit --dump-plugin failed"
echo "$out"

# nbdkit's own facts come first: the plugin really loaded as rdmaswap.
grep -qx 'name=rdmaswap' <<<"$out" || fail "no name=rdmaswap"
grep -Eqx 'rdmaswap_version=[0-9]+\.[0-9]+\.[0-9]+.*' <<<"$out" || fail "no rdmaswap_version=X.Y.Z"
grep -qx 'rdmaswap_tcp=yes' <<<"$out" || fail "no rdmaswap_tcp=yes"
grep -Eqx 'rdmaswap_rdma=(yes|no)' <<<"$out" || fail "no rdmaswap_rdma=yes|no"
# Each fact exactly once.
for key in rdmaswap_version rdmaswap_tcp rdmaswap_rdma; do
    n=$(grep -c "^$key=" <<<"$out")
    [[ $n -eq 1 ]] || fail "$key= appears $n times"
done
# The version matches the project's (meson.build).
if [[ -n ${RDMASWAP_SOURCE:-} && -f $RDMASWAP_SOURCE/meson.build ]]; then
    want=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$RDMASWAP_SOURCE/meson.build" | head -n1)
    if [[ -n $want ]]; then
        grep -qx "rdmaswap_version=$want" <<<"$out" || fail "rdmaswap_version is not $want"
    fi
fi
