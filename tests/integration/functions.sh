# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Shared helpers for the integration tests: find the build, start/stop memserver and nbdkit, clean up.
#
# Source it from a test script that runs with `set -euo pipefail`:
#   source "$(dirname "$0")/functions.sh"
# It creates $tmpdir (removed on exit; copied to $RDMASWAP_KEEP first when that is set, to read
# the logs of a run) and kills every process started through it on exit.
# Exit codes follow nbdkit's test convention: 0 pass, 77 skip, anything else fail.

# nbdsh and nbdcopy's Python bindings live in Debian's python3; a pyenv python may be first on PATH.
export PATH="/usr/bin:/usr/sbin:$PATH"

: "${RDMASWAP_BUILD:?set RDMASWAP_BUILD to the meson build directory}"
RDMASWAP_BUILD=$(cd "$RDMASWAP_BUILD" && pwd)
MEMSERVER="$RDMASWAP_BUILD/memserver/rdmaswap-memserver"
PLUGIN="$RDMASWAP_BUILD/nbdkit-plugin/nbdkit-rdmaswap-plugin.so"
RDMASWAPCTL="$RDMASWAP_BUILD/tools/rdmaswapctl"
PYTHON=/usr/bin/python3

# Every pid in this list is sent SIGKILL on exit (SIGTERM first, briefly).
_cleanup_pids=()
tmpdir=$(mktemp -d -t rdmaswap-it.XXXXXX)

cleanup() {
    local rc=$? pid i
    set +e
    for pid in "${_cleanup_pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${_cleanup_pids[@]}"; do
        for ((i = 0; i < 50; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    # A sanitizer build (RDMASWAP_NBDKIT_PRELOAD, below): an ASan/LSan/UBSan report of a
    # process the test ran fails the test (sanitizer-reports.py says which count), also one
    # from a process that exited when it was killed above (LeakSanitizer reports at exit) or
    # whose exit status the test ignores.
    if compgen -G "$tmpdir/sanitizer.*" >/dev/null; then
        if ! "$PYTHON" "${RDMASWAP_SOURCE:?}/tests/integration/helpers/sanitizer-reports.py" \
            "$tmpdir"/sanitizer.* >&2; then
            echo "FAIL: $0: sanitizer reports (above)" >&2
            rc=1
        fi
    fi
    if [[ $rc -ne 0 && $rc -ne 77 ]]; then
        # Show the server logs of a failed test: they usually say why.
        for f in "$tmpdir"/*.log; do
            [[ -f $f ]] || continue
            echo "---- $(basename "$f") (last 40 lines) ----" >&2
            tail -n 40 "$f" >&2
        done
    fi
    [[ -n ${RDMASWAP_KEEP:-} ]] && cp -r "$tmpdir" "$RDMASWAP_KEEP"
    rm -rf "$tmpdir"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The test cluster's key (mode 0600, as the programs demand). start_memserver, start_nbdkit and
# ctl_status pass it unless the test gives --insecure / insecure=true / its own key.
# make_key FILE: a fresh random key, mode 0600.
make_key() { (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"); }
export AUTH_KEY="$tmpdir/auth.key"
make_key "$AUTH_KEY"
# The memservers' admin key (--admin-key; start_memserver passes it with the cluster key):
# ctl_giveback and ctl_lend use it.
export ADMIN_KEY="$tmpdir/admin.key"
make_key "$ADMIN_KEY"
# The plugin's default volume key (no volume-key=) is $STATE_DIRECTORY/volume.key, created on
# first use: here in the test's directory, never in /var/lib or the user's home. Every nbdkit of
# a test shares it (one host), so a restarted nbdkit reattaches its volume.
export STATE_DIRECTORY="$tmpdir/state"

# A sanitizer build of the plugin cannot be loaded into Debian's (uninstrumented) nbdkit unless
# the sanitizer's runtime is loaded first: meson sets RDMASWAP_NBDKIT_PRELOAD to
# libasan.so:shim:libstdc++.so for a -Db_sanitize=address build, to libtsan.so:shim:libstdc++.so for
# -Db_sanitize=thread (with RDMASWAP_SANITIZER=thread); tests/integration/meson.build says why.
# So `nbdkit` on this script's PATH becomes a wrapper that preloads it into nbdkit alone (python,
# nbdsh, nbdcopy and fio must not get it), whoever starts nbdkit (start_nbdkit, or a test running
# `timeout 20 nbdkit ...`). Sanitizer reports of every process go to $tmpdir/sanitizer.PID,
# which cleanup turns into a failure; leaks that nbdkit's own code allocated are not counted
# (sanitizer-reports.py), leaks in ours are (in the memserver and tools: nbdkit itself runs
# without leak checking for now, see the wrapper below).
# Under ThreadSanitizer the wrapper also drops nbdkit's --swap (a test-only opt-out, see
# docs/security.md "Fuzzing and sanitizers"): mlockall(MCL_FUTURE) in a process whose TSan
# runtime is not yet loaded makes TSan's shadow mappings (terabytes of address space) locked,
# and TSan fails. Once the runtime is loaded (preloaded here; linked into the memserver and
# rdmaswapctl) it intercepts mlock and mlockall and makes them no-ops, so the plugin's and the
# memserver's own calls need no opt-out, and memory is not locked in a TSan run.
if [[ -n ${RDMASWAP_NBDKIT_PRELOAD:-} ]]; then
    for _lib in ${RDMASWAP_NBDKIT_PRELOAD//:/ }; do
        [[ -f $_lib ]] || { echo "FAIL: $0: no $_lib (RDMASWAP_NBDKIT_PRELOAD)" >&2; exit 1; }
    done
    _real_nbdkit=$(command -v nbdkit) || { echo "SKIP: $0: no nbdkit" >&2; exit 77; }
    mkdir "$tmpdir/sanitizer-bin"
    {
        echo '#!/bin/sh'
        # shellcheck disable=SC2016 # for the wrapper to expand
        [[ ${RDMASWAP_SANITIZER:-} == thread ]] &&
            echo 'for a do shift; [ "$a" = --swap ] || set -- "$@" "$a"; done'
        # Under ASan, LeakSanitizer's own tracer crashes at nbdkit's exit in a few tests
        # (signal 11 in the tracer, "LeakSanitizer has encountered a fatal error", exit 1; no
        # leak or memory error report; test-etcd-restarts, test-etcd-holders-dead, test-auth),
        # more often since get_ready probes donors on threads of its own; the cause is not
        # understood yet. So nbdkit runs without leak checking; ASan's memory checks stay on
        # in it, and the memserver, the tools and the unit tests are leak-checked.
        [[ ${RDMASWAP_SANITIZER:-} == thread ]] ||
            echo 'ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"; export ASAN_OPTIONS'
        printf 'LD_PRELOAD="%s${LD_PRELOAD:+:$LD_PRELOAD}" exec "%s" "$@"\n' \
            "$RDMASWAP_NBDKIT_PRELOAD" "$_real_nbdkit"
    } >"$tmpdir/sanitizer-bin/nbdkit"
    chmod +x "$tmpdir/sanitizer-bin/nbdkit"
    export PATH="$tmpdir/sanitizer-bin:$PATH"
    export ASAN_OPTIONS="log_path=$tmpdir/sanitizer:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export UBSAN_OPTIONS="log_path=$tmpdir/sanitizer:print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    # Every report is written (halt_on_error=0: the test goes on, and cleanup fails it), also
    # by the memserver and rdmaswapctl (built with TSan, so they need no preload).
    export TSAN_OPTIONS="log_path=$tmpdir/sanitizer:halt_on_error=0:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
fi

fail() { echo "FAIL: $0: $*" >&2; exit 1; }
skip() { echo "SKIP: $0: $*" >&2; exit 77; }
log()  { echo "$(basename "$0"): $*" >&2; }

# Register a pid to be killed on exit.
cleanup_pid() { _cleanup_pids+=("$1"); }

# sigstop PID: SIGSTOP, and wait until all of PID's threads have stopped (kill returns before
# they have; see sigstop.py). Fails the test if they have not within 5 s.
sigstop() { "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/helpers/sigstop.py" "$1" || fail "SIGSTOP of pid $1"; }

# requires CMD [ARGS...]: skip the test unless CMD runs successfully.
requires() {
    "$@" >/dev/null 2>&1 || skip "prerequisite failed: $*"
}

# requires_build [memserver] [plugin] [ctl]: the build products the test uses must exist.
# A missing product is a failure, not a skip: meson builds them before running the tests.
requires_build() {
    local what
    for what in "$@"; do
        case $what in
            memserver) [[ -x $MEMSERVER ]] || fail "not built: $MEMSERVER" ;;
            plugin)    [[ -f $PLUGIN ]] || fail "not built: $PLUGIN" ;;
            ctl)       [[ -x $RDMASWAPCTL ]] || fail "not built: $RDMASWAPCTL" ;;
            *) fail "requires_build: unknown product $what" ;;
        esac
    done
}

requires_nbdsh() {
    requires nbdsh --version
    requires "$PYTHON" -c 'import nbd'
}

# Ports. meson runs these tests two at a time (and the ASan and TSan runs side by side), so a
# port that was free a moment ago (bound to port 0, then closed) may be another test's, or a
# client's source port, by the time a server binds it. Each test claims a block of
# _port_block_size ports of its own, at start, below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default): no source port and no
# server bound to port 0 ever lands there. A block is claimed by an exclusive flock on its lock
# file in $_port_lock_dir, on a descriptor that this shell and every process it starts keep
# open: the claim ends with the last of them, also after kill -9, and never before a server the
# test started has let go of its port. free_port hands out the block's ports in order.
_port_lock_dir=/tmp/rdmaswap-test-ports
_port_first=20000
_port_block_size=64

# claim_port_block: claim a free block (from a random one on, so that a test rarely gets the
# ports the last one just closed) and set _port_base; fail if every block is taken.
claim_port_block() {
    local low end blocks first i b lock
    read -r low _ </proc/sys/net/ipv4/ip_local_port_range
    end=$((low < 32768 ? low : 32768))
    blocks=$(((end - _port_first) / _port_block_size))
    ((blocks > 0)) || fail "no room for test ports from $_port_first up to the ephemeral range ($low)"
    # (Mode 1777 and lock files mode 0666: a run as another user can claim blocks too; a lock
    # file it cannot read counts as a taken block.)
    [[ -d $_port_lock_dir ]] || mkdir -m 1777 "$_port_lock_dir" 2>/dev/null || true
    first=$((RANDOM % blocks))
    for ((i = 0; i < blocks; i++)); do
        b=$(((first + i) % blocks))
        lock="$_port_lock_dir/$b.lock"
        [[ -e $lock ]] || (umask 000 && : >>"$lock") 2>/dev/null || true
        [[ -r $lock ]] || continue
        exec {_port_fd}<"$lock"
        if flock -n "$_port_fd"; then
            _port_base=$((_port_first + b * _port_block_size))
            echo 0 >"$tmpdir/ports.next"
            return 0
        fi
        exec {_port_fd}<&-
    done
    fail "all $blocks blocks of test ports ($_port_first-$((end - 1))) are taken ($_port_lock_dir)"
}
claim_port_block

# free_port: print the next port of this test's block that can be bound on 127.0.0.1 now
# (one that something outside the tests holds is skipped); never the same port twice in a
# test. The count lives in a file: free_port runs in a subshell, $(free_port).
free_port() {
    local next port
    next=$(<"$tmpdir/ports.next")
    while ((next < _port_block_size)); do
        port=$((_port_base + next))
        next=$((next + 1))
        if "$PYTHON" -c '
import socket, sys
socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; then
            echo "$next" >"$tmpdir/ports.next"
            echo "$port"
            return 0
        fi
    done
    echo "$next" >"$tmpdir/ports.next"
    fail "no port left in this test's block $_port_base-$((_port_base + _port_block_size - 1))"
}

# wait_until SECONDS DESCRIPTION CMD [ARGS...]: run CMD every 0.1 s until it succeeds; fail after SECONDS.
wait_until() {
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out after ${secs}s waiting for: $what"
        sleep 0.1
    done
}

# ctl_status PORT: print `rdmaswapctl status` of the memserver on 127.0.0.1:PORT (bounded by timeout).
# CTL_AUTH (default auth-key=$AUTH_KEY) is how it authenticates (insecure=true for --insecure).
ctl_status() {
    timeout 10 "$RDMASWAPCTL" status "server=127.0.0.1:$1" "${CTL_AUTH:-auth-key=$AUTH_KEY}"
}

# has_auth_arg ARGS...: true if the arguments already choose how to authenticate.
has_auth_arg() {
    local a
    for a in "$@"; do
        case $a in
        --insecure | --auth-key | --auth-key=* | insecure=* | auth-key=* | admin-key=*) return 0 ;;
        esac
    done
    return 1
}

# ctl_get PORT KEY: print the value of KEY in `rdmaswapctl status`; fail if it is missing.
ctl_get() {
    local out val
    out=$(ctl_status "$1" 2>&1) || fail "rdmaswapctl status server=127.0.0.1:$1 failed:"$'\n'"$out"
    val=$(sed -n "s/^$2=//p" <<<"$out")
    [[ -n $val ]] || fail "rdmaswapctl status has no $2= line:"$'\n'"$out"
    echo "$val"
}

# start_memserver CAPACITY SLAB_SIZE [EXTRA_ARGS...]
# Starts a memserver on 127.0.0.1 on the next port of the test's block (free_port), TCP
# transport, with --auth-key $AUTH_KEY and --admin-key $ADMIN_KEY unless EXTRA_ARGS say
# --insecure or --auth-key, and waits until rdmaswapctl status answers. Sets MEMSERVER_PID,
# MEMSERVER_PORT, MEMSERVER_ADDR (HOST:PORT), MEMSERVER_LOG.
# Every memserver is a certified donor (docs/security.md, "Roles"): --donor-key and --donor-cert
# from donor_cert_for (the test's CA, for 127.0.0.1:PORT and $DONOR_CERT_EXTRA), unless it is
# uncertified_memserver (--insecure, its own --donor-key/--donor-cert, or
# RDMASWAP_TEST_UNCERTIFIED=1, e.g. `RDMASWAP_TEST_UNCERTIFIED=1 start_memserver ...` for one).
# Then it also sets DONOR_KEY, DONOR_CERT and DONOR_SERIAL (donor_cert_for).
# @ADDR@ in EXTRA_ARGS becomes MEMSERVER_ADDR (e.g. --advertise @ADDR@).
# Retries on the next ports in case something outside the tests took the port meanwhile; with
# MEMSERVER_FIXED_PORT set, uses that port (once).
_memserver_count=0
start_memserver() {
    local capacity=$1 slab=$2 deadline certify=1 cert_args=()
    shift 2
    has_auth_arg "$@" || set -- --auth-key "$AUTH_KEY" --admin-key "$ADMIN_KEY" "$@"
    uncertified_memserver "$@" && certify=0
    for _ in 1 2 3; do
        _memserver_count=$((_memserver_count + 1))
        MEMSERVER_PORT=${MEMSERVER_FIXED_PORT:-$(free_port)}
        MEMSERVER_ADDR="127.0.0.1:$MEMSERVER_PORT"
        MEMSERVER_LOG="$tmpdir/memserver-$_memserver_count.log"
        if ((certify)); then
            donor_cert_for "$MEMSERVER_PORT"
            cert_args=(--donor-key "$DONOR_KEY" --donor-cert "$DONOR_CERT")
        fi
        "$MEMSERVER" --listen 127.0.0.1 --port "$MEMSERVER_PORT" \
            --capacity "$capacity" --slab-size "$slab" --transport tcp "${@//@ADDR@/$MEMSERVER_ADDR}" \
            ${cert_args[@]+"${cert_args[@]}"} </dev/null >"$MEMSERVER_LOG" 2>&1 &
        MEMSERVER_PID=$!
        cleanup_pid "$MEMSERVER_PID"
        deadline=$((SECONDS + 30))
        while ((SECONDS < deadline)); do
            if ! kill -0 "$MEMSERVER_PID" 2>/dev/null; then
                break
            fi
            if ctl_status "$MEMSERVER_PORT" >/dev/null 2>&1; then
                log "memserver pid $MEMSERVER_PID on $MEMSERVER_ADDR (capacity $capacity, slab $slab)"
                return 0
            fi
            sleep 0.1
        done
        if kill -0 "$MEMSERVER_PID" 2>/dev/null; then
            fail "memserver on $MEMSERVER_ADDR did not answer rdmaswapctl status within 30 s"
        fi
        wait "$MEMSERVER_PID" 2>/dev/null || true
        if [[ -n ${MEMSERVER_FIXED_PORT:-} ]] || ! grep -qi 'in use' "$MEMSERVER_LOG"; then
            cat "$MEMSERVER_LOG" >&2
            fail "memserver exited at startup"
        fi
        log "port $MEMSERVER_PORT was taken, retrying"
    done
    fail "could not start memserver on a free port"
}

# Donor certificates (docs/security.md, "Roles").
# make_donor_ca: the test's CA: $DONOR_CA_KEY (secret), $DONOR_CA (its public key: donor-ca=)
# and $DONOR_CRL (an empty revocation list: donor-crl=). Once per test: start_memserver,
# start_certified_memserver and start_nbdkit call it when it has not run yet; later calls do
# nothing.
make_donor_ca() {
    [[ -n ${DONOR_CA_KEY:-} && -f $DONOR_CA_KEY ]] && return 0
    DONOR_CA_KEY="$tmpdir/donor-ca.key"
    DONOR_CA="$DONOR_CA_KEY.pub"
    DONOR_CRL="$tmpdir/donor-ca.crl"
    "$RDMASWAPCTL" ca create "$DONOR_CA_KEY" >/dev/null || fail "rdmaswapctl ca create"
    "$RDMASWAPCTL" crl create ca-key="$DONOR_CA_KEY" crl="$DONOR_CRL" >/dev/null ||
        fail "rdmaswapctl crl create"
}

# uncertified_memserver ARGS...: true if a memserver started with ARGS must get no certificate
# from start_memserver: RDMASWAP_TEST_UNCERTIFIED=1 (a test of an uncertified donor), --insecure
# (no handshake to prove anything in), or its own --donor-key/--donor-cert.
uncertified_memserver() {
    local a
    [[ ${RDMASWAP_TEST_UNCERTIFIED:-} == 1 ]] && return 0
    for a in "$@"; do
        case $a in
        --insecure | --donor-key | --donor-key=* | --donor-cert | --donor-cert=*) return 0 ;;
        esac
    done
    return 1
}

# donor_cert_for PORT: the donor key and certificate of the memserver on 127.0.0.1:PORT, from
# make_donor_ca's CA, for 127.0.0.1:PORT and the addresses in $DONOR_CERT_EXTRA (a comma list,
# e.g. a proxy in front of it). One key per port ($tmpdir/donor-PORT.key), kept when a memserver
# restarts on that port; its certificate is reused while it names the same addresses, else
# reissued. Sets DONOR_KEY, DONOR_CERT, DONOR_SERIAL.
donor_cert_for() {
    local port=$1 addrs="127.0.0.1:$1${DONOR_CERT_EXTRA:+,$DONOR_CERT_EXTRA}"
    make_donor_ca
    DONOR_KEY="$tmpdir/donor-$port.key"
    DONOR_CERT="$tmpdir/donor-$port.cert"
    if [[ ! -f $DONOR_KEY ]]; then
        "$RDMASWAPCTL" donor-key create "$DONOR_KEY" >/dev/null || fail "donor-key create $DONOR_KEY"
    fi
    if [[ ! -f $DONOR_CERT || $(cat "$DONOR_CERT.addresses") != "$addrs" ]]; then
        rm -f "$DONOR_CERT"
        "$RDMASWAPCTL" cert issue ca-key="$DONOR_CA_KEY" donor-key="$DONOR_KEY.pub" \
            name="donor-$port" addresses="$addrs" days=1 out="$DONOR_CERT" \
            >"$DONOR_CERT.txt" || fail "cert issue for 127.0.0.1:$port ($addrs)"
        echo "$addrs" >"$DONOR_CERT.addresses"
    fi
    DONOR_SERIAL=$(sed -n 's/^serial=//p' "$DONOR_CERT.txt")
}

# start_certified_memserver NAME CAPACITY SLAB_SIZE [EXTRA_ARGS...]: start_memserver on a free
# port with a donor key ($tmpdir/NAME.key) and a certificate from make_donor_ca's CA
# ($tmpdir/NAME.cert) for 127.0.0.1:PORT, or for $DONOR_CERT_ADDRESSES when set (a list for
# `rdmaswapctl cert issue addresses=`). Sets DONOR_SERIAL (the certificate's serial) and what
# start_memserver sets.
start_certified_memserver() {
    local name=$1 port
    shift
    make_donor_ca
    port=$(free_port)
    "$RDMASWAPCTL" donor-key create "$tmpdir/$name.key" >/dev/null || fail "donor-key create $name"
    "$RDMASWAPCTL" cert issue ca-key="$DONOR_CA_KEY" donor-key="$tmpdir/$name.key.pub" \
        name="$name" addresses="${DONOR_CERT_ADDRESSES:-127.0.0.1:$port}" days=1 \
        out="$tmpdir/$name.cert" >"$tmpdir/$name.cert.txt" || fail "cert issue $name"
    DONOR_SERIAL=$(sed -n 's/^serial=//p' "$tmpdir/$name.cert.txt")
    MEMSERVER_FIXED_PORT=$port start_memserver "$@" \
        --donor-key "$tmpdir/$name.key" --donor-cert "$tmpdir/$name.cert"
}

# start_nbdkit NAME [NBDKIT_ARGS...] -- PLUGIN_ARGS...
# Starts `nbdkit -f -U $tmpdir/NAME.sock -P $tmpdir/NAME.pid [NBDKIT_ARGS] PLUGIN.so PLUGIN_ARGS`
# in the background and waits for the socket and pid file. Sets NBDKIT_PID, NBDKIT_SOCK,
# NBDKIT_URI (nbd+unix:///?socket=...), NBDKIT_LOG. Fails if nbdkit exits during startup.
# The plugin defaults to the rdmaswap .so (given auth-key=$AUTH_KEY unless PLUGIN_ARGS say
# insecure= or auth-key=); set NBDKIT_PLUGIN to use another (e.g. memory).
# It uses certified donors only: donor-ca=$DONOR_CA donor-crl=$DONOR_CRL (make_donor_ca's),
# unless PLUGIN_ARGS say insecure= or donor-ca=, or RDMASWAP_TEST_UNCERTIFIED=1.
start_nbdkit() {
    local name=$1 deadline plugin=${NBDKIT_PLUGIN:-$PLUGIN}
    shift
    local nbdkit_args=()
    while [[ $# -gt 0 && $1 != -- ]]; do
        nbdkit_args+=("$1")
        shift
    done
    [[ ${1:-} == -- ]] && shift
    if [[ -z ${NBDKIT_PLUGIN:-} ]] && ! has_auth_arg "$@"; then
        set -- "$@" auth-key="$AUTH_KEY"
    fi
    if [[ -z ${NBDKIT_PLUGIN:-} ]] && ! uncertified_plugin "$@"; then
        make_donor_ca
        set -- "$@" donor-ca="$DONOR_CA" donor-crl="$DONOR_CRL"
    fi
    NBDKIT_SOCK="$tmpdir/$name.sock"
    # shellcheck disable=SC2034 # used by the test scripts
    NBDKIT_URI="nbd+unix:///?socket=$NBDKIT_SOCK"
    NBDKIT_LOG="$tmpdir/nbdkit-$name.log"
    local pidfile="$tmpdir/$name.pid"
    rm -f "$NBDKIT_SOCK" "$pidfile"
    nbdkit -f -U "$NBDKIT_SOCK" -P "$pidfile" "${nbdkit_args[@]}" "$plugin" "$@" \
        </dev/null >"$NBDKIT_LOG" 2>&1 &
    NBDKIT_PID=$!
    cleanup_pid "$NBDKIT_PID"
    deadline=$((SECONDS + 30))
    until [[ -S $NBDKIT_SOCK && -s $pidfile ]]; do
        if ! kill -0 "$NBDKIT_PID" 2>/dev/null; then
            cat "$NBDKIT_LOG" >&2
            fail "nbdkit exited at startup: nbdkit ${nbdkit_args[*]} $plugin $*"
        fi
        ((SECONDS < deadline)) || fail "nbdkit did not create $NBDKIT_SOCK within 30 s"
        sleep 0.1
    done
    log "nbdkit pid $NBDKIT_PID on $NBDKIT_SOCK: $(basename "$plugin") $*"
}

# uncertified_plugin PLUGIN_ARGS...: true if start_nbdkit must not add donor-ca=: the test
# says RDMASWAP_TEST_UNCERTIFIED=1, or the arguments say insecure= (donor-ca= needs the
# handshake) or donor-ca= (the test's own).
uncertified_plugin() {
    local a
    [[ ${RDMASWAP_TEST_UNCERTIFIED:-} == 1 ]] && return 0
    for a in "$@"; do
        case $a in
        insecure=* | donor-ca=*) return 0 ;;
        esac
    done
    return 1
}

# stop_nbdkit_clean: SIGTERM to $NBDKIT_PID; nbdkit must exit 0 within 20 s.
stop_nbdkit_clean() {
    local rc=0
    kill -TERM "$NBDKIT_PID"
    for _ in $(seq 200); do kill -0 "$NBDKIT_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$NBDKIT_PID" 2>/dev/null && fail "nbdkit did not exit within 20 s of SIGTERM"
    wait "$NBDKIT_PID" || rc=$?
    [[ $rc == 0 ]] || fail "nbdkit exited with $rc after SIGTERM"
}

# nbdsh_run [NBDSH_ARGS...]: nbdsh bounded in time (NBDSH_TIMEOUT seconds, default 50).
nbdsh_run() {
    timeout "${NBDSH_TIMEOUT:-50}" nbdsh "$@"
}

# proc_kb PID FIELD: a kB field of /proc/PID/status (VmLck, VmRSS, ...), as a number.
proc_kb() {
    awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"
}

# fio_verify_until_done PID OUT WHAT WHY: fio_verify_beside PID OUT WHAT, then wait for PID (an
# attacker), print OUT, and fail with WHY unless PID exited 0, or if no fio run overlapped it.
fio_verify_until_done() {
    local pid=$1 out=$2 what=$3 why=$4 rc=0
    fio_verify_beside "$pid" "$out" "$what"
    wait "$pid" || rc=$?
    cat "$out" >&2
    [[ $rc -eq 0 ]] || fail "$why (see above)"
    ((FIO_RUNS >= 1)) || fail "no fio run overlapped the attacker ($what)"
    log "fio write+verify passed $FIO_RUNS times $what"
}

# ctl_giveback PORT SIZE: `rdmaswapctl giveback` to the memserver on 127.0.0.1:PORT.
# fio_verify_beside PID OUT WHAT: fio write+verify (crc32c) through $NBDKIT_URI, over 24 MiB,
# run after run while process PID (an attacker) lives, at most 60 runs; every run must pass.
# On a failure, prints OUT (the attacker's output) and fails naming WHAT. Sets FIO_RUNS.
fio_verify_beside() {
    local pid=$1 out=$2 what=$3
    local args=(--ioengine=nbd --uri="$NBDKIT_URI" --rw=randwrite --bssplit=4k/50:128k/50
                --iodepth=8 --numjobs=3 --size=8M --offset_increment=8M --do_verify=1
                --verify=crc32c --verify_fatal=1 --verify_state_save=0 --output-format=json)
    FIO_RUNS=0
    while kill -0 "$pid" 2>/dev/null; do
        ((FIO_RUNS < 60)) || fail "the attacker did not finish within 60 fio runs"
        timeout 50 fio --name=run$FIO_RUNS --randseed=$FIO_RUNS "${args[@]}" >"$tmpdir/fio.json" ||
            { cat "$tmpdir/fio.json" "$out" >&2; fail "fio run $FIO_RUNS failed $what"; }
        "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/helpers/fio-check.py" "$tmpdir/fio.json" $((24 * 1024 * 1024 * 9 / 10)) ||
            fail "fio: see above"
        FIO_RUNS=$((FIO_RUNS + 1))
    done
}

# ctl_lend PORT SIZE: `rdmaswapctl lend`, the same way. Both authenticate with CTL_ADMIN (default
# admin-key=$ADMIN_KEY).
ctl_giveback() {
    timeout 10 "$RDMASWAPCTL" giveback "server=127.0.0.1:$1" "size=$2" "${CTL_ADMIN:-admin-key=$ADMIN_KEY}"
}
ctl_lend() {
    timeout 10 "$RDMASWAPCTL" lend "server=127.0.0.1:$1" "size=$2" "${CTL_ADMIN:-admin-key=$ADMIN_KEY}"
}

# expect_rss_drop PID BEFORE_KB MIB: fail unless the VmRSS of PID is at least 90% of MIB MiB
# below BEFORE_KB (memory given back to the kernel). Not under ThreadSanitizer, whose shadow
# memory is part of VmRSS and does not shrink with the memory given back (a drop of 26-45 of
# 56 MiB was measured): there it only logs. The main and ASan runs check it.
expect_rss_drop() {
    local after
    after=$(proc_kb "$1" VmRSS)
    log "pid $1 VmRSS $2 kB -> $after kB (expected about $3 MiB less)"
    if [[ ${RDMASWAP_SANITIZER:-} == thread ]]; then
        log "ThreadSanitizer build: resident memory not checked"
        return 0
    fi
    (($2 - after >= $3 * 1024 * 9 / 10)) ||
        fail "resident memory of pid $1 shrank by only $(($2 - after)) kB, expected ~$(($3 * 1024)) kB"
}

# start_etcd_cluster N: start an etcd cluster of N members (etcd-server from Debian) on ports of
# the test's block (free_port: client and peer URLs), data in $tmpdir/etcd-I, logs in
# $tmpdir/etcd-I.log, and wait (at most 30 s) until every member is healthy. Sets
# ETCD_ENDPOINTS (the client URLs, comma-separated), ETCD_PIDS, ETCD_CLIENT_URLS,
# ETCD_PEER_URLS and exports ETCDCTL_API=3. Skips the test if etcd is not installed. Never
# touches an etcd of the host (Debian's on 127.0.0.1:2379): the ports are the test's and every
# etcdctl call names its endpoints.
start_etcd_cluster() {
    local n=$1 i port
    command -v etcd >/dev/null || skip "etcd is not installed (apt-get install etcd-server)"
    command -v etcdctl >/dev/null || skip "etcdctl is not installed (apt-get install etcd-client)"
    export ETCDCTL_API=3
    ETCD_PIDS=() ETCD_CLIENT_URLS=() ETCD_PEER_URLS=() ETCD_INITIAL_CLUSTER=""
    ETCD_TOKEN="rdmaswap-test-$$-$RANDOM"
    for ((i = 0; i < 2 * n; i++)); do
        port=$(free_port)
        if ((i < n)); then
            ETCD_CLIENT_URLS+=("http://127.0.0.1:$port")
        else
            ETCD_PEER_URLS+=("http://127.0.0.1:$port")
        fi
    done
    for ((i = 0; i < n; i++)); do
        ETCD_INITIAL_CLUSTER+="${ETCD_INITIAL_CLUSTER:+,}m$i=${ETCD_PEER_URLS[i]}"
    done
    for ((i = 0; i < n; i++)); do
        start_etcd_member "$i"
    done
    ETCD_ENDPOINTS=$(IFS=,; echo "${ETCD_CLIENT_URLS[*]}")
    wait_etcd_healthy 30 "${ETCD_CLIENT_URLS[@]}"
    log "etcd cluster of $n: $ETCD_ENDPOINTS"
}

# start_etcd_member I: (re)start member I of the cluster of start_etcd_cluster, with its data
# directory (a restarted member keeps its data and rejoins). Sets ETCD_PIDS[I]. Does not wait.
# Every member also gets the etcd flags of the array ETCD_EXTRA_ARGS, if the test sets it (e.g.
# --snapshot-count 100).
start_etcd_member() {
    local i=$1
    # Short heartbeat and election timeouts: a cluster that lost its leader recovers in about a
    # second, not the default's several.
    etcd --name "m$i" --data-dir "$tmpdir/etcd-$i" \
        --listen-client-urls "${ETCD_CLIENT_URLS[i]}" --advertise-client-urls "${ETCD_CLIENT_URLS[i]}" \
        --listen-peer-urls "${ETCD_PEER_URLS[i]}" --initial-advertise-peer-urls "${ETCD_PEER_URLS[i]}" \
        --initial-cluster "$ETCD_INITIAL_CLUSTER" --initial-cluster-state new \
        --initial-cluster-token "$ETCD_TOKEN" --heartbeat-interval 100 --election-timeout 1000 \
        ${ETCD_EXTRA_ARGS[@]+"${ETCD_EXTRA_ARGS[@]}"} </dev/null >>"$tmpdir/etcd-$i.log" 2>&1 &
    ETCD_PIDS[i]=$!
    cleanup_pid "${ETCD_PIDS[i]}"
}

# stop_etcd_member I: SIGKILL member I and reap it.
stop_etcd_member() {
    kill -KILL "${ETCD_PIDS[$1]}" 2>/dev/null || true
    wait "${ETCD_PIDS[$1]}" 2>/dev/null || true
}

# wait_etcd_healthy SECONDS URL...: wait until every member at URL... is healthy (the cluster
# has a leader and serves a quorum read), at most SECONDS.
wait_etcd_healthy() {
    local secs=$1
    shift
    wait_until "$secs" "etcd members healthy: $*" \
        etcdctl --endpoints "$(IFS=,; echo "$*")" --dial-timeout=1s --command-timeout=2s endpoint health
}
