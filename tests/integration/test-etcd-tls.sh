#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# etcd over TLS with credentials (issue 26): a real etcd 3.4 on https loopback with client
# certificates required (--client-cert-auth) and auth enabled, certificates made here with the
# openssl CLI, and the roles of docs/deployment.md ("etcd over TLS with credentials"): a donor
# may write only its own registration, a compute host only its volume's records (and read the
# registrations).
# - a memserver with TLS and its donor user registers; a plugin with TLS and the compute user
#   finds it in etcd, stores its holders record there and serves I/O (nbdsh writes, reads back,
#   compares). etcd's tokens expire here 1 s after their last use (--auth-token-ttl 1), so the
#   memserver's re-put of its free slabs meets "invalid auth token" and must authenticate
#   again; then etcd restarts (forgetting every token): the plugin's watch, opened again with
#   its old token, is refused and must authenticate again, and a donor registered then is seen
#   by it and added;
# - the donor's user cannot write another donor's key, the compute user cannot write a donor's
#   key (etcdctl with their credentials fails);
# - a plugin without the CA, or with a wrong password, refuses to start with a clear error
#   within its timeout=; bad TLS options are refused at configuration (plugin and memserver);
# - no password and no token appears in any log.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires openssl version
requires_nbdsh
requires_build memserver plugin ctl
command -v etcd >/dev/null || skip "etcd is not installed (apt-get install etcd-server)"
command -v etcdctl >/dev/null || skip "etcdctl is not installed (apt-get install etcd-client)"
export ETCDCTL_API=3

pki="$tmpdir/pki"
mkdir -m 700 "$pki"
# secret FILE TEXT: a file only we may read (mode 0600), as the programs demand of secrets.
secret() { (umask 077 && printf '%s\n' "$2" >"$1"); }

# 0. Bad options: refused at configuration, naming the key (no etcd needed).
refused() {
    local what=$1 out rc=0
    shift
    out=$(timeout 20 nbdkit -f -U "$tmpdir/bad.sock" "$PLUGIN" size=16M auth-key="$AUTH_KEY" "$@" 2>&1) || rc=$?
    [[ $rc != 0 && $rc != 124 && $out == *"$what"* ]] ||
        fail "nbdkit rdmaswap $* exited $rc without a message naming '$what': $out"
}
secret "$pki/pw-0600" x
(umask 022 && echo x >"$pki/pw-0644")
refused "etcd-cacert= needs https:// etcd endpoints, not http://127.0.0.1:1" \
    etcd=http://127.0.0.1:1 etcd-cacert="$pki/ca.crt"
refused "etcd-user= needs https:// etcd endpoints" \
    etcd=http://127.0.0.1:1 etcd-user=u etcd-password-file="$pki/pw-0600"
refused "etcd-cert= needs etcd-key= as well" etcd=https://127.0.0.1:1 etcd-cert="$pki/c.crt"
refused "etcd-user= needs etcd-password-file= as well" etcd=https://127.0.0.1:1 etcd-user=u
refused "etcd-cacert= needs etcd=" server=127.0.0.1:1 etcd-cacert="$pki/ca.crt"
refused "etcd-cacert file $pki/ca.crt: No such file or directory" \
    etcd=https://127.0.0.1:1 etcd-cacert="$pki/ca.crt"
refused "etcd-password-file file $pki/pw-0644: " \
    etcd=https://127.0.0.1:1 etcd-user=u etcd-password-file="$pki/pw-0644"
out=$(timeout 20 "$MEMSERVER" --listen 127.0.0.1 --port 1 --capacity 16M --slab-size 1M \
    --insecure --etcd http://127.0.0.1:1 --advertise 127.0.0.1:1 --etcd-cacert "$pki/ca.crt" 2>&1) &&
    fail "the memserver accepted --etcd-cacert with an http:// etcd"
[[ $out == *"--etcd-cacert needs https:// etcd endpoints"* ]] ||
    fail "the memserver did not say why it refused --etcd-cacert with http://: $out"

# 1. The certificates: a CA, etcd's (for IP 127.0.0.1), and a client certificate for each
# host. A client certificate for etcd's gateway must have no CommonName (etcd 3.4 refuses one:
# "CommonName of client sending a request against gateway will be ignored").
ossl() { openssl "$@" 2>>"$tmpdir/openssl.log" || fail "openssl $*: $(tail -3 "$tmpdir/openssl.log")"; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=rdmaswap-test-etcd-ca -keyout "$pki/ca.key" -out "$pki/ca.crt"
# sign NAME SUBJECT EXTENSIONS: $pki/NAME.key (mode 0600) and $pki/NAME.crt from the CA.
sign() {
    (umask 077 && ossl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr")
    printf '%s\n' "$3" >"$pki/$1.ext"
    ossl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -days 1 -extfile "$pki/$1.ext" -out "$pki/$1.crt"
}
sign server /CN=etcd "subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth,clientAuth"
for c in donor compute admin; do
    sign "$c" "/O=rdmaswap/OU=$c" "extendedKeyUsage=clientAuth"
done

# 2. etcd on https loopback, client certificates required.
client_port=$(free_port)
peer_port=$(free_port)
url="https://127.0.0.1:$client_port"
# start_etcd: (re)start it on its data directory. Sets ETCD_PID.
start_etcd() {
    etcd --name tls0 --data-dir "$tmpdir/etcd-tls" \
        --listen-client-urls "$url" --advertise-client-urls "$url" \
        --listen-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-cluster "tls0=http://127.0.0.1:$peer_port" --initial-cluster-state new \
        --cert-file "$pki/server.crt" --key-file "$pki/server.key" \
        --trusted-ca-file "$pki/ca.crt" --client-cert-auth --auth-token-ttl 1 \
        --heartbeat-interval 100 --election-timeout 1000 </dev/null >>"$tmpdir/etcd-tls.log" 2>&1 &
    ETCD_PID=$!
    cleanup_pid "$ETCD_PID"
}
start_etcd
# ectl CERT [--user U:P] ARGS...: etcdctl over TLS with the client certificate CERT.
ectl() {
    local c=$1
    shift
    timeout 10 etcdctl --endpoints "$url" --cacert "$pki/ca.crt" --cert "$pki/$c.crt" \
        --key "$pki/$c.key" --dial-timeout=2s --command-timeout=3s "$@"
}
wait_until 30 "etcd on $url healthy" ectl admin endpoint health

# 3. Users and roles (docs/deployment.md "etcd over TLS with credentials"), then auth on.
prefix=/rdmaswap-tls/
volume=tls-vol
root_pw=$(openssl rand -hex 16) donor_pw=$(openssl rand -hex 16) compute_pw=$(openssl rand -hex 16)
secret "$pki/donor.pw" "$donor_pw"
secret "$pki/donor-B.pw" "$donor_pw-B"
secret "$pki/compute.pw" "$compute_pw"
secret "$pki/wrong.pw" "not-$compute_pw"
donor_port=$(free_port)
donor_b_port=$(free_port)
donor_addr="127.0.0.1:$donor_port"
donor_b_addr="127.0.0.1:$donor_b_port"
root=(--user "root:$root_pw")
{
    ectl admin user add "root:$root_pw"
    ectl admin role add root
    ectl admin user grant-role root root
    # A donor: its own registration, nothing else.
    ectl admin role add donor-A
    ectl admin role grant-permission donor-A readwrite "${prefix}donors/$donor_addr"
    ectl admin user add "donor-A:$donor_pw"
    ectl admin user grant-role donor-A donor-A
    ectl admin role add donor-B
    ectl admin role grant-permission donor-B readwrite "${prefix}donors/$donor_b_addr"
    ectl admin user add "donor-B:$donor_pw-B"
    ectl admin user grant-role donor-B donor-B
    ectl admin auth enable
} >>"$tmpdir/etcdctl.log" 2>&1 || fail "setting up etcd's users: $(tail -5 "$tmpdir/etcdctl.log")"

# 4. The memserver registers with TLS and its donor user.
etcd_tls=(--etcd-cacert "$pki/ca.crt" --etcd-cert "$pki/donor.crt" --etcd-key "$pki/donor.key")
MEMSERVER_FIXED_PORT=$donor_port start_memserver 64M 1M --etcd "$url" --advertise @ADDR@ \
    --etcd-prefix "$prefix" "${etcd_tls[@]}" --etcd-user donor-A --etcd-password-file "$pki/donor.pw"
registration() { ectl admin "${root[@]}" get --print-value-only "${prefix}donors/$donor_addr"; }
registered() { [[ -n $(registration) ]]; }
wait_until 10 "registration of $donor_addr over TLS" registered
log "memserver $donor_addr registered over TLS as etcd user donor-A"

# The compute role (made with auth on, as an operator adds a host).
{
    ectl admin "${root[@]}" role add compute
    ectl admin "${root[@]}" role grant-permission compute readwrite --prefix=true "${prefix}volumes/$volume/"
    ectl admin "${root[@]}" role grant-permission compute read --prefix=true "${prefix}donors/"
    ectl admin "${root[@]}" user add "compute:$compute_pw"
    ectl admin "${root[@]}" user grant-role compute compute
} >>"$tmpdir/etcdctl.log" 2>&1 || fail "setting up the compute user: $(tail -5 "$tmpdir/etcdctl.log")"

# 5. Least privilege, with etcdctl and each user's credentials.
as_donor=(--user "donor-A:$donor_pw")
as_compute=(--user "compute:$compute_pw")
denied() { # WHO ARGS...: the write must fail with "permission denied"
    local who=$1 out
    shift
    if out=$(ectl "$@" 2>&1); then fail "$who could: etcdctl $*"; fi
    [[ $out == *"permission denied"* ]] || fail "$who: etcdctl $* failed, but not as denied: $out"
}
ectl donor "${as_donor[@]}" put "${prefix}donors/$donor_addr" "$(registration)" >/dev/null ||
    fail "the donor's user cannot write its own key"
denied "the donor's user" donor "${as_donor[@]}" put "${prefix}donors/127.0.0.1:1" x
denied "the donor's user" donor "${as_donor[@]}" put "${prefix}volumes/$volume/holders" x
denied "the compute user" compute "${as_compute[@]}" put "${prefix}donors/$donor_addr" x
denied "the compute user" compute "${as_compute[@]}" del "${prefix}donors/$donor_addr"
denied "the compute user" compute "${as_compute[@]}" put "${prefix}volumes/other/holders" x
log "etcdctl: donor-A may write its own key only; compute may not write a donor's key"

# 6. A plugin with TLS and the compute user: discovery, the watch, the holders record, I/O.
plugin_tls=(etcd="$url" etcd-prefix="$prefix" etcd-cacert="$pki/ca.crt" etcd-cert="$pki/compute.crt"
            etcd-key="$pki/compute.key" etcd-user=compute volume="$volume" size=16M replicas=1
            lease=60 timeout=5 statusfile="$tmpdir/status")
start_nbdkit tls -v -- "${plugin_tls[@]}" etcd-password-file="$pki/compute.pw"
grep -q "etcd gave 1 donor(s) under ${prefix}donors/" "$NBDKIT_LOG" ||
    fail "nbdkit did not find the donor in etcd over TLS"
free_before=$("$PYTHON" -c 'import json,sys; print(json.loads(sys.argv[1])["slabs_free"])' "$(registration)")
nbdsh_run -u "$NBDKIT_URI" -c '
import os
data = os.urandom(8 << 20)
h.pwrite(data, 4 << 20)
h.flush()
assert h.pread(8 << 20, 4 << 20) == data, "read back differs"
'
log "nbdsh: 8 MiB written and read back through a plugin that found its donor over TLS"
holders_put() { [[ -n $(ectl admin "${root[@]}" get --print-value-only "${prefix}volumes/$volume/holders") ]]; }
wait_until 10 "the holders record of $volume in etcd (the compute user's put)" holders_put
# The memserver's re-put of its free slabs, seconds after its last request: its token expired,
# so a new one, then the put.
reput() {
    local v
    v=$(registration) || return 1
    (($("$PYTHON" -c 'import json,sys; print(json.loads(sys.argv[1])["slabs_free"])' "$v") < free_before))
}
wait_until 15 "the memserver's re-put of its free slabs (slabs_free < $free_before)" reput
log "the memserver re-put its registration with a new token; the plugin stored its holders record"
# etcd restarts: it forgot every token (simple tokens live in its memory). The plugin's watch
# breaks and is opened again with its old token, which etcd refuses ("invalid auth token"):
# the client authenticates again and opens it. A donor registered then is seen and joins.
kill -TERM "$ETCD_PID"
wait "$ETCD_PID" 2>/dev/null || true
start_etcd
wait_until 30 "etcd on $url healthy again" ectl admin "${root[@]}" endpoint health
MEMSERVER_FIXED_PORT=$donor_b_port start_memserver 64M 1M --etcd "$url" --advertise @ADDR@ \
    --etcd-prefix "$prefix" --etcd-cacert "$pki/ca.crt" --etcd-cert "$pki/donor.crt" \
    --etcd-key "$pki/donor.key" --etcd-user donor-B --etcd-password-file "$pki/donor-B.pw"
donor_ok() { grep -q "^donor\.[0-9]*=$1 state=ok " "$tmpdir/status" 2>/dev/null; }
wait_until 20 "the plugin's watch to add $donor_b_addr" donor_ok "$donor_b_addr"
log "the donor registered later ($donor_b_addr, etcd user donor-B) was seen by the watch and added"
# (The restart broke the watch: one warning "cannot watch the donors (... watch stream ended
# ...)", and no other reason.)
grep -E "warning: .*etcd: cannot (watch|list).*(auth|permission|SSL|certificate)" "$NBDKIT_LOG" &&
    fail "the plugin could not watch or list the donors over TLS with its credentials"
stop_nbdkit_clean

# 7. Refusals within timeout=: no CA (the system's store does not know ours), a wrong
# password. Another donor cache: etcd's refusal must not be covered by the cache.
start_refused() {
    local what=$1 out rc=0 t0
    shift
    t0=$SECONDS
    out=$(timeout 30 nbdkit -f -U "$tmpdir/refused.sock" "$PLUGIN" auth-key="$AUTH_KEY" \
        donor-cache="$tmpdir/none.donors" "$@" 2>&1) || rc=$?
    [[ $rc != 0 && $rc != 124 ]] || fail "nbdkit started (exit $rc): $out"
    [[ $out == *"$what"* ]] || fail "nbdkit's refusal does not say '$what': $out"
    ((SECONDS - t0 <= 8)) || fail "nbdkit took $((SECONDS - t0)) s to refuse (timeout=3)"
    log "refused in $((SECONDS - t0)) s: $(grep -o "rdmaswap: etcd is not reachable.*" <<<"$out" | head -c 300)"
    echo "$out" >>"$tmpdir/refusals.log"
}
no_ca=()
for a in "${plugin_tls[@]}"; do
    case $a in etcd-cacert=* | timeout=*) ;; *) no_ca+=("$a") ;; esac
done
start_refused "SSL certificate problem" "${no_ca[@]}" etcd-password-file="$pki/compute.pw" timeout=3
start_refused "authentication failed, invalid user ID or password" \
    "${plugin_tls[@]/timeout=5/timeout=3}" etcd-password-file="$pki/wrong.pw"

# 8. No password and no token in any log (etcd's simple tokens: 16 letters, '.', a number).
for pw in "$root_pw" "$donor_pw" "$compute_pw"; do # ($donor_pw-B contains $donor_pw)
    ! grep -rqF -- "$pw" "$tmpdir"/*.log || fail "a password appears in $(grep -rlF -- "$pw" "$tmpdir"/*.log)"
done
! grep -rqE '[A-Za-z]{16}\.[0-9]+' "$tmpdir"/memserver-*.log "$tmpdir"/nbdkit-*.log "$tmpdir/refusals.log" ||
    fail "something like an etcd token appears in a log: $(grep -rhoE '[A-Za-z]{16}\.[0-9]+' "$tmpdir"/*.log | head -3)"
! grep -rqi "authorization" "$tmpdir"/memserver-*.log "$tmpdir"/nbdkit-*.log ||
    fail "an Authorization header appears in a log"
log "PASS"
