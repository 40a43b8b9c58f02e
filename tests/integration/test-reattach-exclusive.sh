#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Never two owners of a volume, and no claim across cluster keys:
# - a second live plugin with the same volume id is refused (it fails to start with a clear
#   message) while the first runs, and the first's data is untouched;
# - on a memserver holding two keys (a rotation), a plugin with the other key and the same
#   volume id gets its own, empty volume: it never sees the first key's slabs, and the first
#   key's plugin, restarted, reattaches its own data intact.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

KEY_B="$tmpdir/b.key"
make_key "$KEY_B"
start_memserver 32M 1M --auth-key "$AUTH_KEY" --auth-key "$KEY_B"
args=(server="$MEMSERVER_ADDR" size=8M volume=shared-name lease=30 timeout=2)
pattern() { # pattern BYTE [KEYARG]: write BYTE over 2 MiB at offset 1 MiB
	nbdsh_run -u "$NBDKIT_URI" -c "h.pwrite(bytes([$1]) * (2 << 20), 1 << 20)"
}
read_is() {
	nbdsh_run -u "$NBDKIT_URI" -c "assert h.pread(2 << 20, 1 << 20) == bytes([$1]) * (2 << 20)"
}

start_nbdkit first -- "${args[@]}"
first_pid=$NBDKIT_PID first_uri=$NBDKIT_URI
pattern 0x11

# Same volume, same key, while the first runs: refused.
rc=0
timeout 30 nbdkit -f -U "$tmpdir/second.sock" "$PLUGIN" "${args[@]}" auth-key="$AUTH_KEY" \
	</dev/null >"$tmpdir/nbdkit-second.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "second plugin with the same volume was not refused (rc $rc)"
grep -q "held by another live client" "$tmpdir/nbdkit-second.log" ||
	{ cat "$tmpdir/nbdkit-second.log" >&2; fail "the refusal does not say why"; }
grep -q "refused: session of .* still has live connections" "$MEMSERVER_LOG" ||
	fail "the memserver did not log the refusal"
grep "held by another" "$tmpdir/nbdkit-second.log" >&2
grep "refused: session of" "$MEMSERVER_LOG" | head -1 >&2
NBDKIT_URI=$first_uri read_is 0x11 || fail "the first plugin's data changed"

# The other key, same volume id: a different volume, empty.
start_nbdkit other -- "${args[@]}" auth-key="$KEY_B"
read_is 0 || fail "a plugin with another key sees the first key's data"
pattern 0x22
kill -KILL "$NBDKIT_PID"

kill -KILL "$first_pid"
two_detached() { ctl_status "$MEMSERVER_PORT" | grep -q "^sessions_detached=2$"; }
wait_until 10 "both killed plugins' sessions detached" two_detached

start_nbdkit other2 -- "${args[@]}" auth-key="$KEY_B"
read_is 0x22 || fail "key B's plugin did not get its own data back"
start_nbdkit first2 -- "${args[@]}"
read_is 0x11 || fail "key A's plugin did not get its own data back"
exit 0
