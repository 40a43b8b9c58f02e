#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The holders record of a volume in etcd (common/cluster/holders.h, issue 14) against a real
# single-member etcd on loopback: absent at first, put and read back, refused when it is
# another volume's or not a record; with the first endpoint dead. etcdctl reads the key put
# as the documented JSON.
set -euo pipefail
source "$(dirname "$0")/functions.sh"

check="$RDMASWAP_BUILD/tests/integration/etcd-client-check"
[[ -x $check ]] || fail "not built: $check"
start_etcd_cluster 1
prefix=/rdmaswap-holders-test/
dead="http://127.0.0.1:$(free_port)"
timeout 20 "$check" "$dead,$ETCD_ENDPOINTS" holders "$prefix" ||
    fail "the holders record in etcd: see above"
value=$(timeout 10 etcdctl --endpoints "$ETCD_ENDPOINTS" --dial-timeout=2s --command-timeout=3s \
    get --print-value-only "${prefix}volumes/vol%2F1/holders")
"$PYTHON" - "$value" <<'PY' || fail "the record at ${prefix}volumes/vol%2F1/holders is not as documented: $value"
import json, sys
r = json.loads(sys.argv[1])
assert r == {"version": 1, "volume": "vol/1", "donors": ["h1:1", "h2:2"]}, r
PY
log "record: $value"
log "PASS"
