#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prometheus metrics on both sides: the memserver's /metrics (--metrics-listen) and the plugin's
# metrics-file= pass `promtool check metrics` (format and lint); after N bytes are written and
# read through nbdkit, the memserver's TCP byte counters, the plugin's byte counters and its
# latency histograms grew by at least that; `rdmaswapctl status --json` carries the same fields
# as the key=value output, numbers as numbers; a bad --metrics-listen is refused at start.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_nbdsh
requires_build memserver plugin ctl
# A declared dependency (tools/install-deps.sh: prometheus), so its absence is a failure.
command -v promtool >/dev/null || fail "promtool not found: apt-get install prometheus"

# --- A bad --metrics-listen value is refused at start, saying why.
for bad in nonsense 127.0.0.1 127.0.0.1:99999 localhost:9471 '[::1]9471'; do
    rc=0
    timeout 20 "$MEMSERVER" --insecure --listen 127.0.0.1 --port 0 --capacity 4M \
        --slab-size 1M --transport tcp --metrics-listen "$bad" >"$tmpdir/bad.out" 2>&1 || rc=$?
    [[ $rc -eq 2 ]] || { cat "$tmpdir/bad.out" >&2; fail "--metrics-listen '$bad': exit $rc, not 2"; }
    grep -qF -- "--metrics-listen '$bad' is not ADDR:PORT" "$tmpdir/bad.out" ||
        { cat "$tmpdir/bad.out" >&2; fail "--metrics-listen '$bad': no clear message"; }
done
log "bad --metrics-listen values refused"

start_memserver 64M 1M --metrics-listen 127.0.0.1:0
wait_until 10 "the memserver's metrics line" grep -q 'serving metrics on http://' "$MEMSERVER_LOG"
mport=$(sed -n 's|.*serving metrics on http://127\.0\.0\.1:\([0-9]*\)/metrics.*|\1|p' "$MEMSERVER_LOG")
[[ -n $mport ]] || fail "no metrics port in the memserver's log"
log "memserver metrics on port $mport"

# An address in use: a clear error at start, and the memserver does not run.
rc=0
timeout 20 "$MEMSERVER" --insecure --listen 127.0.0.1 --port 0 --capacity 4M --slab-size 1M \
    --transport tcp --metrics-listen "127.0.0.1:$mport" >"$tmpdir/busy.out" 2>&1 || rc=$?
[[ $rc -ne 0 ]] || fail "a second memserver started with a metrics port in use"
grep -q -- "--metrics-listen: cannot listen on 127.0.0.1:$mport: Address already in use" \
    "$tmpdir/busy.out" || { cat "$tmpdir/busy.out" >&2; fail "metrics port in use: no clear message"; }

# fetch URL FILE: GET, bounded in time; fails on anything but 200.
fetch() {
    timeout 10 "$PYTHON" -c '
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    ct = r.headers["Content-Type"]
    assert ct.startswith("text/plain; version=0.0.4"), ct
    open(sys.argv[2], "wb").write(r.read())' "$1" "$2" || fail "GET $1 failed"
}
# check_metrics FILE WHAT: promtool accepts it, with no lint problem either.
check_metrics() {
    local out
    out=$(promtool check metrics <"$1" 2>&1) || { echo "$out" >&2; fail "promtool: $2 is not valid"; }
    [[ -z $out ]] || { echo "$out" >&2; fail "promtool lint: $2"; }
}
# metric FILE NAME [LABEL=VALUE...]: the value of the one sample of NAME with those labels
# (and maybe others); fails unless exactly one matches.
metric() {
    "$PYTHON" - "$@" <<'PY'
import re, sys
path, name, want = sys.argv[1], sys.argv[2], dict(a.split("=", 1) for a in sys.argv[3:])
found = []
for line in open(path):
    m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line.strip())
    if not m or m.group(1) != name:
        continue
    labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
    if all(labels.get(k) == v for k, v in want.items()):
        found.append(m.group(4))
if len(found) != 1:
    sys.exit("%s %s: %d samples match in %s" % (name, want, len(found), path))
print(int(float(found[0])) if float(found[0]).is_integer() else found[0])
PY
}

murl="http://127.0.0.1:$mport/metrics"
fetch "$murl" "$tmpdir/ms0.prom"
check_metrics "$tmpdir/ms0.prom" "the memserver's /metrics"
[[ $(metric "$tmpdir/ms0.prom" rdmaswap_memserver_capacity_bytes) -eq $((64 << 20)) ]] ||
    fail "capacity_bytes is not 64 MiB"
[[ $(metric "$tmpdir/ms0.prom" rdmaswap_memserver_slabs state=free) -eq 64 ]] ||
    fail "not 64 free slabs at start"
# Only /metrics, and only GET/HEAD.
code=$(timeout 10 "$PYTHON" -c '
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1], timeout=5)
except urllib.error.HTTPError as e:
    print(e.code)' "http://127.0.0.1:$mport/other")
[[ $code == 404 ]] || fail "GET /other answered $code, not 404"

prom="$tmpdir/volume.prom"
# (backup= too, so that its metrics are there to check)
start_nbdkit m -- server="$MEMSERVER_ADDR" size=32M metrics-file="$prom" \
    statusfile="$tmpdir/volume.status" backup="$tmpdir/backup" volume-key="$tmpdir/volume.key"
wait_until 10 "the metrics file" test -s "$prom"
check_metrics "$prom" "the plugin's metrics-file"
metric "$prom" rdmaswap_volume_info transport=tcp >/dev/null
[[ $(metric "$prom" rdmaswap_volume_donor_state donor="$MEMSERVER_ADDR" state=ok) -eq 1 ]] ||
    fail "the donor is not ok in the metrics file"
fetch "$murl" "$tmpdir/ms1.prom"
cp "$prom" "$tmpdir/vol1.prom"

# Write N bytes (16 writes of 128 KiB, 64 of 4 KiB, across slabs) and read them back.
n=$((16 * 131072 + 64 * 4096))
NBDSH_TIMEOUT=50 nbdsh_run -u "$NBDKIT_URI" -c - <<'PY'
import os
data = os.urandom(131072)
for i in range(16):
    h.pwrite(data, i * 1536 * 1024)
for i in range(64):
    h.pwrite(data[:4096], 20 * 1024 * 1024 + i * 4096)
for i in range(16):
    assert h.pread(131072, i * 1536 * 1024) == data
for i in range(64):
    assert h.pread(4096, 20 * 1024 * 1024 + i * 4096) == data[:4096]
PY
fetch "$murl" "$tmpdir/ms2.prom"
check_metrics "$tmpdir/ms2.prom" "the memserver's /metrics after I/O"
# The metrics file is rewritten every second, maybe while the reads were under way: wait for
# one that counts every write and every read as ended (80 of each). A request is counted when
# it starts, its bytes when it succeeds and its latency last.
grew() {
    local w r
    w=$(metric "$prom" rdmaswap_volume_request_duration_seconds_count direction=write) &&
        ((w >= 80)) &&
        r=$(metric "$prom" rdmaswap_volume_request_duration_seconds_count direction=read) &&
        ((r >= 80))
}
wait_until 10 "the metrics file to count the writes and the reads" grew
cp "$prom" "$tmpdir/vol2.prom"
check_metrics "$tmpdir/vol2.prom" "the plugin's metrics-file after I/O"

# grown FILE0 FILE1 AT_LEAST WHAT NAME [LABELS...]: the sample grew by at least AT_LEAST.
grown() {
    local f0=$1 f1=$2 min=$3 what=$4 a b
    shift 4
    a=$(metric "$f0" "$@") || fail "$what: not in $f0"
    b=$(metric "$f1" "$@") || fail "$what: not in $f1"
    log "$what: $a -> $b (at least +$min)"
    ((b - a >= min)) || fail "$what grew by $((b - a)), expected at least $min"
}
grown "$tmpdir/ms1.prom" "$tmpdir/ms2.prom" $n "memserver TCP bytes written" \
    rdmaswap_memserver_bytes_total transport=tcp direction=write
grown "$tmpdir/ms1.prom" "$tmpdir/ms2.prom" $n "memserver TCP bytes read" \
    rdmaswap_memserver_bytes_total transport=tcp direction=read
grown "$tmpdir/ms1.prom" "$tmpdir/ms2.prom" 80 "memserver TCP write requests" \
    rdmaswap_memserver_requests_total transport=tcp direction=write
grown "$tmpdir/vol1.prom" "$tmpdir/vol2.prom" $n "plugin bytes written" \
    rdmaswap_volume_bytes_total direction=write
grown "$tmpdir/vol1.prom" "$tmpdir/vol2.prom" $n "plugin bytes read" \
    rdmaswap_volume_bytes_total direction=read
grown "$tmpdir/vol1.prom" "$tmpdir/vol2.prom" 80 "plugin write latency count" \
    rdmaswap_volume_request_duration_seconds_count direction=write
grown "$tmpdir/vol1.prom" "$tmpdir/vol2.prom" 80 "plugin read latency count" \
    rdmaswap_volume_request_duration_seconds_count direction=read
grown "$tmpdir/vol1.prom" "$tmpdir/vol2.prom" 80 "plugin writes in the +Inf bucket" \
    rdmaswap_volume_request_duration_seconds_bucket direction=write le=+Inf
# Slabs: 16 writes 1.5 MiB apart and the 4 KiB ones at 20 MiB touch 17 slabs of 1 MiB.
[[ $(metric "$tmpdir/ms2.prom" rdmaswap_memserver_slabs state=used) -eq 17 ]] ||
    fail "the memserver does not count 17 used slabs"
[[ $(metric "$tmpdir/vol2.prom" rdmaswap_volume_slabs_live) -eq 17 ]] ||
    fail "the volume does not count 17 live slabs"
[[ $(metric "$tmpdir/ms2.prom" rdmaswap_memserver_sessions state=attached) -ge 1 ]] ||
    fail "no attached session counted"

# --- rdmaswapctl status --json: one object per target, the same fields as key=value.
ctl_status "$MEMSERVER_PORT" >"$tmpdir/ctl.txt"
timeout 10 "$RDMASWAPCTL" status --json "server=127.0.0.1:$MEMSERVER_PORT" \
    "auth-key=$AUTH_KEY" >"$tmpdir/ctl.json" || fail "rdmaswapctl status --json server= failed"
timeout 10 "$RDMASWAPCTL" status "volume=$tmpdir/volume.status" >"$tmpdir/vctl.txt" ||
    fail "rdmaswapctl status volume= failed"
timeout 10 "$RDMASWAPCTL" status --json "volume=$tmpdir/volume.status" >"$tmpdir/vctl.json" ||
    fail "rdmaswapctl status --json volume= failed"
"$PYTHON" - "$tmpdir" "$MEMSERVER_ADDR" <<'PY' || fail "rdmaswapctl status --json: see above"
import json, sys
d, addr = sys.argv[1], sys.argv[2]

def text(path):
    kv = {}
    for line in open(path):
        if "=" in line:
            k, v = line.rstrip("\n").split("=", 1)
            kv[k] = v
    return kv

def one_object(path):
    lines = [l for l in open(path) if l.strip()]
    assert len(lines) == 1, "%s: %d lines, expected one JSON object" % (path, len(lines))
    obj = json.loads(lines[0])
    assert isinstance(obj, dict), path
    return obj

for name, special in (("ctl", ("session.",)), ("vctl", ("donor.",))):
    t, j = text("%s/%s.txt" % (d, name)), one_object("%s/%s.json" % (d, name))
    for k, v in t.items():
        if k.startswith(special):
            continue
        if k in ("age_seconds",):  # may differ by a second between the two runs
            assert isinstance(j[k], int), k
            continue
        assert k in j, "%s: %s missing from the JSON" % (name, k)
        want = int(v) if v.isdigit() else v
        assert j[k] == want, "%s: %s is %r in JSON, %r in text" % (name, k, j[k], want)
        if v.isdigit():
            assert isinstance(j[k], int), "%s: %s is not a number" % (name, k)
s = one_object(d + "/ctl.json")
assert s["server"] == addr and s["slabs_used"] == 17, s
assert isinstance(s["session_list"], list) and s["session_list"], s
assert s["session_list"][0]["state"] == "live" and s["session_list"][0]["slabs"] == 17, s
v = one_object(d + "/vctl.json")
assert v["io_write_bytes"] >= 16 * 131072 + 64 * 4096, v
assert v["donors"][0]["address"] == addr and v["donors"][0]["state"] == "ok", v
assert v["donors"][0]["slabs"] == 17, v
print("rdmaswapctl --json: server and volume objects match the key=value output")
PY
# Every metric name the dashboard and docs/metrics.md use is one that the outputs have.
"$PYTHON" - "${RDMASWAP_SOURCE:?}/docs" "$tmpdir/ms2.prom" "$tmpdir/vol2.prom" <<'PY' ||
import re, sys
docs, outputs = sys.argv[1], sys.argv[2:]
have = set()
for path in outputs:
    for line in open(path):
        m = re.match(r"# TYPE (\S+) ", line)
        if m:
            have.add(m.group(1))
for doc in ("grafana-dashboard.json", "metrics.md"):
    used = set(re.findall(r"rdmaswap_(?:volume|memserver)_[a-z_]+", open(docs + "/" + doc).read()))
    base = {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count"))
            and re.sub(r"_(bucket|sum|count)$", "", n) in have else n for n in used}
    missing = sorted(base - have)
    if missing:
        sys.exit("%s names metrics that are not exported: %s" % (doc, ", ".join(missing)))
print("dashboard and docs/metrics.md use exported names only")
PY
    fail "docs name metrics that do not exist (see above)"
log "metrics and status --json checked"
