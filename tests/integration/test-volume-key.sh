#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A volume belongs to its volume key (volume-key=, docs/security.md "Volume keys"). Real nbdkit
# processes with the same cluster key and the same volume=, different volume keys:
#   $1 = hijack   the owner (key A, lease 60) writes a pattern of numbered blocks and stops; an
#                 attacker (key B) reads the whole device: no block of the owner's comes back;
#                 it writes 0x41 everywhere and stops; the owner restarts: exactly its bytes
#        plant    the attacker (key B) writes 0x41 first and stops (detached, lease 60); the
#                 owner (key A) starts: never reads a planted byte; its writes read back, also
#                 after its own restart (it reattaches its volume, not the planted one)
#        wire     a python client binds the owner's detached volume with the owner's public key
#                 and wrong proofs: EPERM each time, the memserver logs it, and the owner's
#                 restart reads its bytes
#        default  no volume-key=: the key is created as $STATE_DIRECTORY/volume.key (0600, in a
#                 0700 directory), and a restart reattaches with it
#        refused  two memservers, one behind challenge-proxy.py (it changes HELLO's challenge, so
#                 the plugin's proof is refused with EPERM): with replicas=1 the plugin logs the
#                 refusal, serves from the other one only and puts no slab on the refusing
#                 one; with replicas=2 it does not start
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires "$PYTHON" -c 'import cryptography.hazmat.primitives.asymmetric.ed25519'
requires_build memserver plugin ctl
here=$(cd "$(dirname "$0")" && pwd)
mode=${1:-hijack}

KEY_A="$tmpdir/owner.vkey" KEY_B="$tmpdir/attacker.vkey"
make_key "$KEY_A"
make_key "$KEY_B"
start_memserver 64M 1M
args=(server="$MEMSERVER_ADDR" size=8M volume=v lease=60 timeout=3)
owner=(volume-key="$KEY_A") attacker=(volume-key="$KEY_B")

# The owner's pattern: 4 KiB block i holds "owner-block-<i>/" repeated. A block that reads back
# with this prefix is a block of the owner's.
write_owner() {
	nbdsh_run -u "$NBDKIT_URI" -c '
blocks = [(b"owner-block-%06d/" % i) * 220 for i in range(2048)]
data = b"".join(b[:4096] for b in blocks)
h.pwrite(data, 0)
' || fail "the owner's write failed"
}
read_is_owner() {
	nbdsh_run -u "$NBDKIT_URI" -c '
got = h.pread(8 << 20, 0)
want = b"".join(((b"owner-block-%06d/" % i) * 220)[:4096] for i in range(2048))
bad = [i for i in range(2048) if got[i * 4096:(i + 1) * 4096] != want[i * 4096:(i + 1) * 4096]]
assert not bad, "%d blocks are not the owner'"'"'s, e.g. block %d: %r" % (len(bad), bad[0], got[bad[0] * 4096:bad[0] * 4096 + 32])
'
}
# count_blocks: print how many 4 KiB blocks of the device are the owner's, 0x41s, zeros.
count_blocks() {
	nbdsh_run -u "$NBDKIT_URI" -c '
got = h.pread(8 << 20, 0)
blocks = [got[i:i + 4096] for i in range(0, len(got), 4096)]
print(sum(b.startswith(b"owner-block-") for b in blocks), sum(b == b"A" * 4096 for b in blocks),
      sum(b == bytes(4096) for b in blocks))
'
}
write_41() {
	nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(b"A" * (8 << 20), 0)' || fail "0x41 write failed"
}
# stop_nbdkit: SIGTERM, wait for the exit, then for its session to be detached on the memserver.
detached=0
stop_nbdkit() {
	kill -TERM "$NBDKIT_PID"
	wait "$NBDKIT_PID" 2>/dev/null || true
	detached=$((detached + 1))
	det() { ctl_status "$MEMSERVER_PORT" | grep -q "^sessions_detached=$detached$"; }
	wait_until 20 "$detached detached session(s) on the memserver" det
}
reattached() { sed -n 's/^reattached=//p' "$tmpdir/status"; }
start_with_status() { # NAME ARGS...: start nbdkit, wait for its status file
	local name=$1
	shift
	rm -f "$tmpdir/status"
	start_nbdkit "$name" -- "${args[@]}" statusfile="$tmpdir/status" "$@"
	wait_until 10 "the status file of $name" test -s "$tmpdir/status"
}

case $mode in
hijack)
	start_with_status owner "${owner[@]}"
	write_owner
	read_is_owner || fail "the owner does not read its own write"
	stop_nbdkit
	start_with_status attacker "${attacker[@]}"
	read -r own a zero <<<"$(count_blocks)"
	log "attacker read the device: $own blocks of the owner's, $a of 0x41, $zero of zeros"
	[ "$own" = 0 ] || fail "the attacker read $own blocks of the owner's data"
	[ "$(reattached)" = 0 ] || fail "the attacker's plugin reattached $(reattached) chunks"
	write_41
	stop_nbdkit
	start_with_status owner2 "${owner[@]}"
	[ "$(reattached)" = 8 ] || fail "the owner's restart reattached $(reattached) chunks, not 8"
	read_is_owner || fail "the owner's restart does not read exactly its own bytes"
	log "hijack: the attacker saw none of the owner's blocks; the owner got its bytes back"
	;;
plant)
	start_with_status attacker "${attacker[@]}"
	write_41
	stop_nbdkit
	start_with_status owner "${owner[@]}"
	read -r own a zero <<<"$(count_blocks)"
	log "owner's first start read: $a blocks of 0x41, $zero of zeros"
	[ "$a" = 0 ] || fail "the owner was served $a blocks that the attacker planted"
	[ "$zero" = 2048 ] || fail "the owner's new device is not all zeros"
	[ "$(reattached)" = 0 ] || fail "the owner's first start reattached $(reattached) chunks"
	write_owner
	read_is_owner || fail "the owner does not read its own write"
	stop_nbdkit
	start_with_status owner2 "${owner[@]}"
	[ "$(reattached)" = 8 ] || fail "the owner's restart reattached $(reattached) chunks, not 8"
	read_is_owner || fail "the owner's restart does not read exactly its own bytes"
	log "plant: the owner never saw the planted bytes"
	;;
wire)
	start_with_status owner "${owner[@]}"
	write_owner
	stop_nbdkit
	timeout 60 "$PYTHON" "$here/helpers/volume-key-client.py" 127.0.0.1 "$MEMSERVER_PORT" "$AUTH_KEY" \
		"$KEY_A" v || fail "volume-key-client: see above"
	n=$(grep -c "BIND of volume v refused: wrong proof of its volume key" "$MEMSERVER_LOG" || true)
	[ "$n" = 4 ] || fail "the memserver logged $n refused proofs, not 4"
	grep "BIND of volume v refused" "$MEMSERVER_LOG" | head -1 >&2
	start_with_status owner2 "${owner[@]}"
	[ "$(reattached)" = 8 ] || fail "the owner's restart reattached $(reattached) chunks, not 8"
	read_is_owner || fail "the owner's restart does not read exactly its own bytes"
	;;
default)
	[ ! -e "$STATE_DIRECTORY" ] || fail "$STATE_DIRECTORY exists before the first start"
	rm -f "$tmpdir/status"
	start_nbdkit first -v -- "${args[@]}" statusfile="$tmpdir/status"
	key="$STATE_DIRECTORY/volume.key"
	[ -f "$key" ] || fail "no default volume key $key"
	[ "$(stat -c %a "$key")" = 600 ] || fail "$key has mode $(stat -c %a "$key"), not 600"
	[ "$(stat -c %a "$STATE_DIRECTORY")" = 700 ] || fail "$STATE_DIRECTORY is not mode 700"
	grep -Eq '^[0-9a-f]{64}$' "$key" || fail "$key does not hold 64 hex digits"
	[ "$(stat -c %s "$key")" = 65 ] || fail "$key is not 65 bytes"
	grep -q "volume key $key created" "$NBDKIT_LOG" || fail "nbdkit did not log the new key"
	sum=$(sha256sum <"$key")
	wait_until 10 "the status file" test -s "$tmpdir/status"
	write_owner
	stop_nbdkit
	start_with_status second
	[ "$(sha256sum <"$key")" = "$sum" ] || fail "the restart changed the key file"
	grep -q "volume key .* created" "$NBDKIT_LOG" && fail "the restart created a key again"
	[ "$(reattached)" = 8 ] || fail "the restart reattached $(reattached) chunks, not 8"
	read_is_owner || fail "the restart does not read the first start's bytes"
	log "default: $key made with mode 600, the restart reattached with it"
	;;
refused)
	m1_port=$MEMSERVER_PORT
	# The proxy first: m2's donor certificate must also name the proxy's address, which the
	# plugin dials (functions.sh, start_memserver).
	m2_port=$(free_port)
	"$PYTHON" "$here/helpers/challenge-proxy.py" "$m2_port" "$tmpdir/proxy.state" &
	cleanup_pid $!
	wait_until 10 "challenge-proxy" test -s "$tmpdir/proxy.state"
	proxy=$(sed -n 's/^port=\([0-9]*\).*/\1/p' "$tmpdir/proxy.state")
	DONOR_CERT_EXTRA=127.0.0.1:$proxy MEMSERVER_FIXED_PORT=$m2_port start_memserver 64M 1M
	m2_log=$MEMSERVER_LOG
	args=(server=127.0.0.1:$m1_port server=127.0.0.1:$proxy size=8M volume=v lease=60 timeout=3
	      replicas=1)
	start_with_status owner "${owner[@]}"
	grep -q "memserver 127.0.0.1:$proxy refused the proof of volume v's key (EPERM)" "$NBDKIT_LOG" ||
		{ cat "$NBDKIT_LOG" >&2; fail "nbdkit did not log the refused proof"; }
	grep "refused the proof" "$NBDKIT_LOG" >&2
	grep -q "BIND of volume v refused: wrong proof" "$m2_log" || fail "the memserver did not log it"
	write_owner
	read_is_owner || fail "the owner does not read its own write"
	[ "$(ctl_get "$m2_port" slabs_used)" = 0 ] || fail "slabs on the memserver that refused the proof"
	[ "$(ctl_get "$m1_port" slabs_used)" = 8 ] || fail "the 8 slabs are not on the other memserver"
	kill -TERM "$NBDKIT_PID"
	wait "$NBDKIT_PID" 2>/dev/null || true
	args=("${args[@]/replicas=1/replicas=2}")
	rc=0
	timeout 30 nbdkit -f -U "$tmpdir/two.sock" "$PLUGIN" "${args[@]}" "${owner[@]}" \
		auth-key="$AUTH_KEY" </dev/null >"$tmpdir/nbdkit-two.log" 2>&1 || rc=$?
	[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "replicas=2 with one refusing memserver started (rc $rc)"
	grep -q "1 of 2 memservers usable for volume v, replicas=2 needs 2" "$tmpdir/nbdkit-two.log" ||
		{ cat "$tmpdir/nbdkit-two.log" >&2; fail "the failed start does not say why"; }
	log "refused: the memserver that refused the proof got no slab; replicas=2 did not start"
	;;
*) fail "unknown mode $mode" ;;
esac
exit 0
