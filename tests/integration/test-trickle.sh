#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A donor that answers, but 1 byte per second (or not at all), behind trickle-proxy.py: every
# client wait is bounded per operation by timeout=, not per recv(), and SIGTERM ends nbdkit.
#   failover  replicas=2, one donor trickles: reads and writes go on; the requests caught on it
#             finish within the bound (< 3 x timeout), and nbdkit logs that the donor failed
#   eio       replicas=1, the donor trickles: a read fails with EIO (never zeros) within the bound
#   auth      the AUTH reply trickles: nbdkit fails to start, with a message, within the bound
#   ctl       rdmaswapctl status timeout=2 through the trickling proxy fails within the bound
#   sigterm   timeout=30, a read stuck on a trickling (then on a silent) donor: SIGTERM ends
#             nbdkit within 5 s
# On the code before per-operation deadlines, each of them waited minutes (a 4 KiB read reply
# trickled byte by byte never trips a 2 s per-recv timeout).
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl
here=$(cd "$(dirname "$0")" && pwd)
case=${1:?usage: test-trickle.sh failover|eio|auth|ctl|sigterm}
timeout_s=2
bound=$((3 * timeout_s)) # seconds a request caught on the slow donor may take

# start_proxy TARGET_PORT [ARGS...]: sets PROXY_PID, PROXY_PORT, PROXY_STATE.
start_proxy() {
	PROXY_STATE="$tmpdir/proxy.state"
	rm -f "$PROXY_STATE"
	"$PYTHON" "$here/helpers/trickle-proxy.py" "$@" "$PROXY_STATE" 2>>"$tmpdir/proxy.log" &
	PROXY_PID=$!
	cleanup_pid $PROXY_PID
	wait_until 10 "trickle proxy listening" test -s "$PROXY_STATE"
	PROXY_PORT=$(sed -n 's/^port=\([0-9]*\).*/\1/p' "$PROXY_STATE")
	log "proxy pid $PROXY_PID on 127.0.0.1:$PROXY_PORT -> $1"
}
# start_proxied_memserver [PROXY_ARGS...]: a memserver and start_proxy in front of it. The
# proxy starts first: the memserver's donor certificate must also name the proxy's address,
# which the plugin dials (functions.sh, start_memserver).
start_proxied_memserver() {
	local port
	port=$(free_port)
	start_proxy "$port" "$@"
	DONOR_CERT_EXTRA=127.0.0.1:$PROXY_PORT MEMSERVER_FIXED_PORT=$port start_memserver 32M 1M
}
# proxy_mode MODE: switch the proxy (trickle, stall, normal) and wait until it says so.
proxy_mode() {
	local sig
	case $1 in trickle) sig=USR1 ;; stall) sig=USR2 ;; normal) sig=HUP ;; esac
	kill -"$sig" "$PROXY_PID"
	wait_until 5 "proxy in mode $1" grep -q "mode=$1" "$PROXY_STATE"
}
now_ms() { date +%s%3N; }

case $case in
failover)
	start_memserver 32M 1M
	healthy=$MEMSERVER_ADDR
	start_proxied_memserver
	start_nbdkit fo -- server="$healthy" server="127.0.0.1:$PROXY_PORT" size=8M replicas=2 \
		timeout=$timeout_s channels=4
	# Every slab written (on both donors) before the donor slows down: the test is about
	# reads and writes, not allocation.
	nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(bytes([0x5a]) * (8 << 20), 0)' ||
		fail "initial write failed"
	proxy_mode trickle
	NBDSH_TIMEOUT=120 nbdsh_run -u "$NBDKIT_URI" -c "
import time
bound = $bound
worst = 0.0
for i in range(40):
    off = i * 200 * 1024
    t = time.monotonic()
    if i % 2:
        h.pwrite(bytes([i]) * 4096, off)
        assert h.pread(4096, off) == bytes([i]) * 4096, 'read back after write %d differs' % i
    else:
        got = h.pread(4096, off)
        assert got in (bytes([0x5a]) * 4096, ), 'read %d returned wrong bytes' % i
        h.pwrite(bytes([0x5a]) * 4096, off)
    took = time.monotonic() - t
    worst = max(worst, took)
    if took > 0.3: print('request %d (%s) took %.2f s' % (i, 'write' if i % 2 else 'read', took))
    assert took < bound, 'request %d took %.1f s (bound %d s)' % (i, took, bound)
print('worst request: %.2f s' % worst)
" >"$tmpdir/fo.out" || { cat "$tmpdir/fo.out" >&2; fail "I/O with a trickling donor failed or was too slow"; }
	log "replicas=2, one donor trickling: 40 requests ok; $(tr "\n" " " <"$tmpdir/fo.out")"
	grep -q "worst request" "$tmpdir/fo.out" || fail "no timing reported"
	# The slow donor was given up on, and said so.
	grep -Eq "127.0.0.1:$PROXY_PORT failed|data connection to 127.0.0.1:$PROXY_PORT failed" \
		"$NBDKIT_LOG" || fail "nbdkit did not log that the trickling donor failed"
	# And some request really met the trickle (else the test proved nothing).
	worst=$(sed -n 's/worst request: \([0-9]*\)\..*/\1/p' "$tmpdir/fo.out")
	((worst >= timeout_s - 1)) || fail "no request waited on the trickling donor (worst ${worst} s)"
	;;
eio)
	start_proxied_memserver
	start_nbdkit eio -- server="127.0.0.1:$PROXY_PORT" size=8M timeout=$timeout_s channels=2
	nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(bytes([0x5a]) * (1 << 20), 0)' ||
		fail "initial write failed"
	for how in trickle stall; do
		proxy_mode "$how"
		NBDSH_TIMEOUT=60 nbdsh_run -u "$NBDKIT_URI" -c "
import errno, time
for i in range(3):
    t = time.monotonic()
    try:
        got = h.pread(4096, 8192 * i)
    except nbd.Error as e:
        took = time.monotonic() - t
        assert e.errnum == errno.EIO, 'read failed with %s, not EIO' % e
        assert took < $bound, 'read took %.1f s to fail (bound $bound s)' % took
        print('EIO after %.2f s' % took)
        continue
    raise SystemExit('read from a $how donor succeeded: %r...' % got[:8])
" >"$tmpdir/eio.out" || { cat "$tmpdir/eio.out" >&2; fail "$how: read did not fail with EIO within ${bound} s"; }
		log "$how donor: $(tr '\n' ' ' <"$tmpdir/eio.out")"
		kill -0 "$NBDKIT_PID" 2>/dev/null || fail "nbdkit died"
	done
	;;
auth)
	start_proxied_memserver --mode trickle
	start=$(now_ms)
	rc=0
	timeout 60 nbdkit -f -U "$tmpdir/auth.sock" "$PLUGIN" server="127.0.0.1:$PROXY_PORT" \
		size=8M timeout=$timeout_s auth-key="$AUTH_KEY" </dev/null >/dev/null \
		2>"$tmpdir/auth.err" || rc=$?
	took=$(($(now_ms) - start))
	log "AUTH reply trickled: nbdkit exit $rc after $took ms: $(tr '\n' ' ' <"$tmpdir/auth.err")"
	[[ $rc -ne 124 ]] || fail "nbdkit still starting after 60 s"
	[[ $rc -ne 0 ]] || fail "nbdkit started against a donor whose AUTH reply trickles"
	((took < bound * 1000)) || fail "nbdkit took $took ms to give up (bound ${bound} s)"
	grep -q "no answer within the timeout" "$tmpdir/auth.err" || fail "no clear error message"
	;;
ctl)
	start_proxied_memserver
	timeout 10 "$RDMASWAPCTL" status server="127.0.0.1:$PROXY_PORT" timeout=$timeout_s \
		auth-key="$AUTH_KEY" >"$tmpdir/ctl0.out" || fail "rdmaswapctl status through the proxy failed"
	for how in trickle stall; do
		proxy_mode "$how"
		start=$(now_ms)
		rc=0
		timeout 60 "$RDMASWAPCTL" status server="127.0.0.1:$PROXY_PORT" timeout=$timeout_s \
			auth-key="$AUTH_KEY" >"$tmpdir/ctl.out" 2>&1 || rc=$?
		took=$(($(now_ms) - start))
		log "$how: rdmaswapctl exit $rc after $took ms: $(grep error= "$tmpdir/ctl.out" || true)"
		[[ $rc -ne 124 ]] || fail "$how: rdmaswapctl status still waiting after 60 s"
		[[ $rc -eq 1 ]] || fail "$how: rdmaswapctl status exit $rc, expected 1"
		((took < bound * 1000)) || fail "$how: rdmaswapctl took $took ms (bound ${bound} s)"
		grep -q "^error=no answer within the timeout" "$tmpdir/ctl.out" ||
			fail "$how: no error= line saying why"
	done
	# giveback too (a call that changes state: it must not hang either).
	start=$(now_ms)
	rc=0
	timeout 60 "$RDMASWAPCTL" giveback server="127.0.0.1:$PROXY_PORT" size=1M timeout=$timeout_s \
		admin-key="$ADMIN_KEY" >"$tmpdir/ctl.out" 2>&1 || rc=$?
	took=$(($(now_ms) - start))
	log "stall: rdmaswapctl giveback exit $rc after $took ms"
	if [[ $rc -ne 1 ]] || ((took >= bound * 1000)); then
		fail "giveback through a stalled proxy: exit $rc after $took ms (bound ${bound} s)"
	fi
	;;
sigterm)
	start_proxied_memserver
	for how in trickle stall; do
		proxy_mode normal
		# timeout=30: only the stop, not the deadline, can end the wait within 5 s.
		start_nbdkit "term-$how" -- server="127.0.0.1:$PROXY_PORT" size=8M timeout=30 \
			channels=2 lease=0
		nbdsh_run -u "$NBDKIT_URI" -c 'h.pwrite(bytes([0x5a]) * (1 << 20), 0)' ||
			fail "initial write failed"
		proxy_mode "$how"
		NBDSH_TIMEOUT=60 nbdsh -u "$NBDKIT_URI" -c 'h.pread(65536, 0)' \
			>"$tmpdir/stuck.out" 2>&1 &
		reader=$!
		cleanup_pid $reader
		sleep 2
		kill -0 $reader 2>/dev/null || { cat "$tmpdir/stuck.out" >&2; fail "$how: the read was not stuck"; }
		start=$(now_ms)
		kill -TERM "$NBDKIT_PID"
		while kill -0 "$NBDKIT_PID" 2>/dev/null && (($(now_ms) - start < 30000)); do
			sleep 0.1
		done
		took=$(($(now_ms) - start))
		kill -0 "$NBDKIT_PID" 2>/dev/null && fail "$how: nbdkit still running $took ms after SIGTERM"
		rc=0
		wait "$NBDKIT_PID" || rc=$?
		log "$how: nbdkit exited (status $rc) $took ms after SIGTERM"
		((took <= 5000)) || fail "$how: nbdkit took $took ms to exit after SIGTERM (bound 5 s)"
		rc=0
		wait $reader || rc=$?
		[[ $rc -ne 0 ]] || fail "$how: the stuck read succeeded"
		grep -q "ESHUTDOWN\|EIO\|Input/output\|shut\|disconnect\|closed" "$tmpdir/stuck.out" ||
			log "$how: reader said: $(cat "$tmpdir/stuck.out")"
	done
	;;
*)
	fail "unknown case $case"
	;;
esac
exit 0
