#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Placement's free-slab hint follows what others do to a donor (issue 14): a volume learns a
# donor's free slabs at HELLO and from its own ALLOCs; when another client fills the donor, and
# then empties it again, the volume's hint (status volume=: donor.N ... free_on_donor=) follows
# within the refresh interval (a STATS on the poll connection every 5 s), without any I/O of its
# own. Before, the hint stayed at the HELLO's count forever, so a donor filled by others kept
# looking free (and one emptied by others kept looking full).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

start_memserver 16M 1M
a_addr=$MEMSERVER_ADDR a_port=$MEMSERVER_PORT
start_memserver 64M 1M
b_addr=$MEMSERVER_ADDR
start_nbdkit main -- server="$a_addr" server="$b_addr" size=32M replicas=1 volume=hints-main \
	statusfile="$tmpdir/status"
main_uri=$NBDKIT_URI
# hint ADDR: the free_on_donor= of that donor in the main volume's status.
hint() {
	"$RDMASWAPCTL" status volume="$tmpdir/status" |
		sed -n "s/^donor\.[0-9]*=$1 .*free_on_donor=\([0-9]*\).*/\1/p"
}
hint_is() { [ "$(hint "$1")" = "$2" ]; }
wait_until 10 "the main volume's status to show 16 free slabs on $a_addr" hint_is "$a_addr" 16

# Another volume fills the first donor.
start_nbdkit filler -- server="$a_addr" size=16M volume=hints-filler
nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"\x5a" * (16 << 20), 0); h.flush()'
[ "$(ctl_get "$a_port" slabs_free)" -eq 0 ] || fail "the filler did not fill $a_addr"
start=$SECONDS
wait_until 15 "the main volume's hint for $a_addr to drop to 0 (it did no I/O)" hint_is "$a_addr" 0
log "hint for the filled donor refreshed after $((SECONDS - start)) s"

# The filler gives it all back: the hint rises again.
nbdsh_run -u "$NBDKIT_URI" -c 'h.trim(16 << 20, 0); h.flush()'
[ "$(ctl_get "$a_port" slabs_free)" -eq 16 ] || fail "the filler's trim did not free $a_addr"
start=$SECONDS
wait_until 15 "the main volume's hint for $a_addr to rise to 16" hint_is "$a_addr" 16
log "hint for the emptied donor refreshed after $((SECONDS - start)) s"

# And placement uses it: the main volume's first writes go to both donors (by fraction of
# capacity: about 2 of 8 to the 16-slab donor).
nbdsh_run -u "$main_uri" -c 'h.pwrite(b"\xa5" * (8 << 20), 0); h.flush()'
a_used=$(ctl_get "$a_port" slabs_used)
[ "$a_used" -ge 1 ] || fail "the emptied donor got none of the 8 slabs"
exit 0
