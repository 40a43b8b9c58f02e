#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Donor certificates (docs/security.md, "Roles"; finding S3 of issue 26): a compute host holds
# the cluster key, so it can run a memserver; with donor-ca= the plugin must not use it. Two
# certified donors, an uncertified memserver (the attack) and a memserver whose certificate is
# for another address: nbdkit with donor-ca= uses only the two, pages never reach the others
# (no session, no slab), each refusal is warned with its reason. Then one donor's certificate
# is revoked while nbdkit runs: once it restarts, the plugin's new connections to it are
# refused (the list is re-read, no nbdkit restart), and the data is still read back whole from
# the other donor.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl

make_donor_ca
start_certified_memserver a 16M 1M
A_PORT=$MEMSERVER_PORT A_PID=$MEMSERVER_PID A_SERIAL=$DONOR_SERIAL
start_certified_memserver b 16M 1M
B_PORT=$MEMSERVER_PORT
# The compute host's memserver: cluster key, no certificate (RDMASWAP_TEST_UNCERTIFIED=1:
# start_memserver would certify it).
RDMASWAP_TEST_UNCERTIFIED=1 start_memserver 16M 1M
U_PORT=$MEMSERVER_PORT
DONOR_CERT_ADDRESSES=127.0.0.2,127.0.0.1:1 start_certified_memserver w 16M 1M
W_PORT=$MEMSERVER_PORT

start_nbdkit cert -- server="127.0.0.1:$A_PORT" server="127.0.0.1:$B_PORT" \
    server="127.0.0.1:$U_PORT" server="127.0.0.1:$W_PORT" replicas=2 size=8M timeout=3 \
    donor-ca="$DONOR_CA" donor-crl="$DONOR_CRL"

# 8 MiB of a pattern, written and read back.
"$PYTHON" -c 'import sys; sys.stdout.buffer.write(bytes((i * 7 + i // 4096) & 0xff for i in range(8 << 20)))' >"$tmpdir/pattern"
nbdsh_run -u "$NBDKIT_URI" -c "
h.pwrite(open('$tmpdir/pattern', 'rb').read(), 0)
h.flush()
assert h.pread(8 << 20, 0) == open('$tmpdir/pattern', 'rb').read(), 'read back differs'
" || fail "write and read back through the certified donors"

# The certified donors hold the pages; the others have no session and every slab free.
for p in "$A_PORT" "$B_PORT"; do
    [[ $(ctl_get "$p" slabs_free) -lt 16 ]] || fail "certified donor on port $p holds nothing"
done
for p in "$U_PORT" "$W_PORT"; do
    [[ $(ctl_get "$p" sessions) -eq 0 ]] || fail "refused memserver on port $p has a session"
    [[ $(ctl_get "$p" slabs_free) -eq 16 ]] || fail "refused memserver on port $p holds slabs"
done
grep -q "donor 127.0.0.1:$U_PORT refused (donor-ca=): it has no donor certificate" "$NBDKIT_LOG" ||
    fail "no warning naming why the uncertified memserver was refused: $(cat "$NBDKIT_LOG")"
grep -q "donor 127.0.0.1:$W_PORT refused (donor-ca=): donor 'w' .*not for 127.0.0.1:$W_PORT" "$NBDKIT_LOG" ||
    fail "no warning naming why the memserver certified for another address was refused"
grep -q 'donors are not authenticated' "$NBDKIT_LOG" && fail "warned of no donor-ca= with donor-ca="

# Revoke a's certificate while nbdkit runs, then restart a (same key, same certificate, same
# port): the plugin's new connections to it must be refused as revoked.
"$RDMASWAPCTL" cert revoke ca-key="$DONOR_CA_KEY" serial="$A_SERIAL" crl="$DONOR_CRL" >/dev/null ||
    fail "cert revoke"
# The CA's list of what it issued shows a's certificate revoked and the others valid.
listed=$("$RDMASWAPCTL" cert list ca-key="$DONOR_CA_KEY" crl="$DONOR_CRL") || fail "cert list"
grep -q "^serial=$A_SERIAL name=a .* state=revoked$" <<<"$listed" ||
    fail "cert list does not show a's certificate revoked:"$'\n'"$listed"
grep -q " state=valid$" <<<"$listed" || fail "cert list shows no valid certificate:"$'\n'"$listed"
kill -KILL "$A_PID"
wait "$A_PID" 2>/dev/null || true
MEMSERVER_FIXED_PORT=$A_PORT start_memserver 16M 1M \
    --donor-key "$tmpdir/a.key" --donor-cert "$tmpdir/a.cert"
# Reads and writes make the plugin reconnect to a (its data and control connections died).
nbdsh_run -u "$NBDKIT_URI" -c "
data = open('$tmpdir/pattern', 'rb').read()
assert h.pread(8 << 20, 0) == data, 'read back differs'
h.pwrite(data, 0)
h.flush()
assert h.pread(8 << 20, 0) == data, 'read back differs after rewriting'
" || fail "read back from the remaining certified donor"
# Nothing asks a failed donor anything during its 10 s cooldown (the repair does not place
# copies there either): the give-back poll's reconnect after it meets the revocation.
wait_until 30 "the plugin refuses the revoked donor" \
    grep -q "donor 127.0.0.1:$A_PORT refused (donor-ca=): donor 'a' (serial $A_SERIAL): certificate revoked" "$NBDKIT_LOG"
[[ $(ctl_get "$A_PORT" sessions) -eq 0 ]] || fail "the revoked donor got a session"
[[ $(ctl_get "$A_PORT" slabs_free) -eq 16 ]] || fail "the revoked donor got slabs"
stop_nbdkit_clean

# Without donor-ca= the plugin warns that donors are not authenticated.
RDMASWAP_TEST_UNCERTIFIED=1 start_nbdkit open -- server="127.0.0.1:$U_PORT" size=4M
# (A request first: a SIGTERM while the start still runs would fail the start, exit 1.)
nbdsh_run -u "$NBDKIT_URI" -c 'assert h.pread(4096, 0) == bytes(4096)' ||
    fail "the plugin without donor-ca= does not serve"
grep -q 'donors are not authenticated: any cluster-key holder can be a donor' "$NBDKIT_LOG" ||
    fail "no warning without donor-ca="
stop_nbdkit_clean
log "PASS"
