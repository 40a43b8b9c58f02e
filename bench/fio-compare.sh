#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Cost per request: rdmaswap (nbdkit plugin -> memserver over TCP on 127.0.0.1) against
# - proxy: nbdkit's own nbd plugin forwarding over TCP on 127.0.0.1 to `nbdkit memory` (the same
#   topology as rdmaswap: client -> Unix socket -> nbdkit -> TCP -> server; what a user without
#   rdmaswap would run);
# - memory: nbdkit's memory plugin alone (the cost of NBD itself, on the client side);
# - base (BASE=DIR, or several NAME=DIR): rdmaswap of other build directories (commits' builds),
#   so a regression shows against the project's own best in the same run;
# - variants (VARIANTS=...): this build with other settings (are the defaults the best?).
# All are served on Unix sockets (FRONT=tcp: on ports of 127.0.0.1) and driven by fio's NBD
# engine, one after the other for each row and repetition (the targets' order rotates by
# repetition), and every column is the median of REPEAT runs (ratios: of the per-run ratios,
# with their range in brackets).
#
# MODE=two-host pins the client side (fio and the nbdkit in front) to CLIENT_CPUS and the
# donor side (the memserver, the proxy's `nbdkit memory`) to DONOR_CPUS, as two hosts would
# be (taskset); MODE=unpinned (the default) lets the scheduler place everything.
#
# Columns (per request: the rate over the fio run ÷ its IOPS):
#   IOPS, mean and p99 completion latency (fio's clat);
#   client µs/req: CPU time of fio and the front nbdkit (process CPU from /proc: every thread,
#     ended ones included); donor µs/req: of the memserver or the proxy's nbdkit memory;
#   client set / donor set µs/req (two-host): the busy time of those CPUs (/proc/stat; it also
#     counts interrupts and anything else running there: a check on the process figures);
#   cs/req: context switches on the client's / donor's CPUs (perf stat -a -A), or of the whole
#     machine when unpinned or without perf (/proc/stat ctxt).
#
# Usage: bench/fio-compare.sh BUILD_DIR
# Environment (all optional):
#   MODE=unpinned       or two-host
#   CLIENT_CPUS, DONOR_CPUS  two-host CPU lists (default: the first half of the CPUs, the rest)
#   RUNTIME=10          seconds per measurement (after RAMP=2 seconds of warm-up)
#   SIZE=1G             device size; it is filled first so every read hits written data
#   SLAB=64M            memserver slab size (capacity = SIZE)
#   THREADS=16          nbdkit --threads, for every front nbdkit
#   RDMASWAP_ARGS=      extra plugin parameters, e.g. "paths=16"
#   MEMSERVER_ARGS=     extra memserver options, e.g. "--threads 16"
#   BASE=DIR            another build directory: target "base"; or "NAME=DIR NAME=DIR ...":
#                       one target per directory (BASE_ARGS=, BASE_MEMSERVER_ARGS=
#                       its plugin parameters and memserver options)
#   VARIANTS="NAME=PLUGIN ARGS|MEMSERVER ARGS|ENV;..."  this build again with other settings
#                       (ENV: VAR=VALUE words for the front nbdkit), e.g.
#                       VARIANTS="p16=paths=16|--threads 16;t16=|--threads 16"
#   TARGETS=            subset and order, e.g. "rdmaswap proxy" (default: rdmaswap, base,
#                       the variants, proxy, memory)
#   ROWS="..."          rows rw:bs:qd (default: 4k QD1 and QD32 reads and writes, 32k QD8 reads
#                       (swap-in with readahead), 128k QD8 writes (swap-out))
#   REPEAT=3            runs of each row and target
#   FRONT=unix          how fio reaches the front nbdkits: their Unix sockets, or tcp (each on a
#                       port of 127.0.0.1; TCP honours MSG_MORE, so a write's header and payload
#                       arrive together)
#   PROFILE="rw:bs:qd ..."  after the table, run these rows once more per target under
#                       `perf record` on the client's CPUs and print where the client's time
#                       goes, in µs per request: fio, nbdkit's own work, and the forwarding (the
#                       frames of the rdmaswap plugin, or of the nbd plugin and libnbd) split into
#                       send, receive, wait and user space (needs perf; best with MODE=two-host)
#   OUT=DIR             keep fio's JSON, the per-run records and the server logs there
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
export PATH="/usr/bin:/usr/sbin:$PATH"
MODE=${MODE:-unpinned}
RUNTIME=${RUNTIME:-10}
RAMP=${RAMP:-2}
SIZE=${SIZE:-1G}
SLAB=${SLAB:-64M}
THREADS=${THREADS:-16}
RDMASWAP_ARGS=${RDMASWAP_ARGS:-}
MEMSERVER_ARGS=${MEMSERVER_ARGS:-}
BASE=${BASE:-}
BASE_ARGS=${BASE_ARGS:-}
BASE_MEMSERVER_ARGS=${BASE_MEMSERVER_ARGS:-}
VARIANTS=${VARIANTS:-}
REPEAT=${REPEAT:-3}
FRONT=${FRONT:-unix}
[[ $FRONT == unix || $FRONT == tcp ]] || { echo "$0: FRONT=unix or tcp" >&2; exit 2; }
ROWS=${ROWS:-"randread:4k:1 randwrite:4k:1 randread:4k:32 randwrite:4k:32 randread:32k:8 randwrite:128k:8"}
out=${OUT:-$(mktemp -d -t rdmaswap-bench.XXXXXX)}
out=$(mkdir -p "$out" && cd "$out" && pwd)
export STATE_DIRECTORY="$out/state" # the plugin's default volume key: here, not in /var/lib

for c in nbdkit nbdinfo fio jq python3 taskset; do
    command -v "$c" >/dev/null || { echo "$0: needs $c" >&2; exit 1; }
done
check_build() {
    local f
    for f in "$1/memserver/rdmaswap-memserver" "$1/nbdkit-plugin/nbdkit-rdmaswap-plugin.so" \
        "$1/tools/rdmaswapctl"; do
        [[ -e $f ]] || { echo "$0: not built: $f" >&2; exit 1; }
    done
}
check_build "$build"
declare -A base_dir
bases=()
for b in $BASE; do
    bname=base bdir=$b
    [[ $b == *=* ]] && bname=${b%%=*} bdir=${b#*=}
    [[ $bname =~ ^[a-z0-9][a-z0-9_.-]*$ && -z ${base_dir[$bname]:-} ]] || { echo "$0: BASE: NAME=DIR, names unique" >&2; exit 2; }
    base_dir[$bname]=$(cd "$bdir" && pwd)
    check_build "${base_dir[$bname]}"
    bases+=("$bname")
done

ncpu=$(nproc)
case $MODE in
unpinned)
    CLIENT_CPUS=0-$((ncpu - 1))
    DONOR_CPUS=$CLIENT_CPUS
    ;;
two-host)
    ((ncpu >= 2)) || { echo "$0: two-host mode needs 2 CPUs" >&2; exit 1; }
    CLIENT_CPUS=${CLIENT_CPUS:-0-$((ncpu / 2 - 1))}
    DONOR_CPUS=${DONOR_CPUS:-$((ncpu / 2))-$((ncpu - 1))}
    ;;
*) echo "$0: MODE: unpinned or two-host" >&2; exit 2 ;;
esac
# cpus LIST: the CPU numbers of a taskset list ("0-3,6").
cpus() {
    python3 -c 'import sys
s = set()
for p in sys.argv[1].split(","):
    a, _, b = p.partition("-")
    s.update(range(int(a), int(b or a) + 1))
print(" ".join(map(str, sorted(s))))' "$1"
}
client_cpus=$(cpus "$CLIENT_CPUS")
donor_cpus=$(cpus "$DONOR_CPUS")
perf_ok=
if command -v perf >/dev/null && perf stat -a -A -x, -e context-switches -o /dev/null true 2>/dev/null; then
    perf_ok=1
fi

pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

wait_for() { # SECONDS CMD...: retry CMD every 0.1 s
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { echo "$0: timed out: $*" >&2; exit 1; }
        sleep 0.1
    done
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
key="$out/auth.key"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$key")

# Each target: its socket $out/NAME.sock, the pid of its front (client side) and of its
# back end (donor side; none for memory).
declare -A front back front_port
targets=()

# front_listen NAME: the listening options of target NAME's front nbdkit: its Unix socket
# $out/NAME.sock, or with FRONT=tcp a port on 127.0.0.1 (front_port[NAME], chosen by
# new_front first: front_listen runs in a subshell).
new_front() { [[ $FRONT != tcp ]] || front_port[$1]=$(free_port); }
front_listen() {
    if [[ $FRONT == tcp ]]; then
        echo "-i 127.0.0.1 -p ${front_port[$1]}"
    else
        echo "-U $out/$1.sock"
    fi
}

# start_rdmaswap NAME BUILD PLUGIN_ARGS MEMSERVER_ARGS [ENV]
start_rdmaswap() {
    local name=$1 b=$2 port
    port=$(free_port)
    # shellcheck disable=SC2086 # the ARGS are lists of words
    taskset -c "$DONOR_CPUS" "$b/memserver/rdmaswap-memserver" --listen 127.0.0.1 --port "$port" \
        --capacity "$SIZE" --slab-size "$SLAB" --transport tcp --log-level warn --auth-key "$key" \
        $4 2>"$out/memserver-$name.log" &
    back[$name]=$!
    pids+=("$!")
    wait_for 60 "$b/tools/rdmaswapctl" status "server=127.0.0.1:$port" auth-key="$key"
    new_front "$name"
    # shellcheck disable=SC2086,SC2046
    env ${5:-} taskset -c "$CLIENT_CPUS" nbdkit -f --threads "$THREADS" $(front_listen "$name") \
        "$b/nbdkit-plugin/nbdkit-rdmaswap-plugin.so" server="127.0.0.1:$port" size="$SIZE" \
        transport=tcp auth-key="$key" $3 2>"$out/nbdkit-$name.log" &
    front[$name]=$!
    pids+=("$!")
    targets+=("$name")
}

declare -A describe
describe[rdmaswap]="this build${RDMASWAP_ARGS:+, plugin: $RDMASWAP_ARGS}${MEMSERVER_ARGS:+, memserver: $MEMSERVER_ARGS}"
start_rdmaswap rdmaswap "$build" "$RDMASWAP_ARGS" "$MEMSERVER_ARGS"
for b in "${bases[@]}"; do
    describe[$b]="${base_dir[$b]}${BASE_ARGS:+, plugin: $BASE_ARGS}${BASE_MEMSERVER_ARGS:+, memserver: $BASE_MEMSERVER_ARGS}"
    start_rdmaswap "$b" "${base_dir[$b]}" "$BASE_ARGS" "$BASE_MEMSERVER_ARGS"
done
if [[ -n $VARIANTS ]]; then
    IFS=';' read -r -a vlist <<<"$VARIANTS"
    for v in "${vlist[@]}"; do
        vname=${v%%=*}
        vargs=${v#*=}
        [[ $vname =~ ^[a-z][a-z0-9_-]*$ && $v == *=* ]] || { echo "$0: VARIANTS: NAME=PLUGIN ARGS|MEMSERVER ARGS" >&2; exit 2; }
        IFS='|' read -r vplugin vms venv <<<"$vargs"
        describe[$vname]="this build, plugin: ${vplugin:-defaults}; memserver: ${vms:-defaults}${venv:+; environment: $venv}"
        start_rdmaswap "$vname" "$build" "$vplugin" "$vms" "$venv"
    done
fi
# The proxy: `nbdkit memory` on TCP 127.0.0.1 (donor side), nbdkit's nbd plugin in front.
proxy_port=$(free_port)
taskset -c "$DONOR_CPUS" nbdkit -f --threads "$THREADS" -i 127.0.0.1 -p "$proxy_port" memory "$SIZE" \
    allocator=malloc 2>"$out/nbdkit-proxy-backend.log" &
back[proxy]=$!
pids+=("$!")
wait_for 30 nbdinfo --size "nbd://127.0.0.1:$proxy_port"
new_front proxy
# shellcheck disable=SC2046 # front_listen's words
taskset -c "$CLIENT_CPUS" nbdkit -f --threads "$THREADS" $(front_listen proxy) nbd hostname=127.0.0.1 \
    port="$proxy_port" 2>"$out/nbdkit-proxy.log" &
front[proxy]=$!
pids+=("$!")
targets+=(proxy)
describe[proxy]="nbdkit nbd plugin -> TCP 127.0.0.1 -> nbdkit memory (allocator=malloc)"
new_front memory
# shellcheck disable=SC2046
taskset -c "$CLIENT_CPUS" nbdkit -f --threads "$THREADS" $(front_listen memory) memory "$SIZE" \
    allocator=malloc 2>"$out/nbdkit-memory.log" &
front[memory]=$!
pids+=("$!")
targets+=(memory)
describe[memory]="nbdkit memory (allocator=malloc) alone, on the client side"
if [[ -n ${TARGETS:-} ]]; then
    for t in $TARGETS; do
        [[ -n ${front[$t]:-} ]] || { echo "$0: TARGETS: no target $t (have: ${targets[*]})" >&2; exit 2; }
    done
    read -r -a targets <<<"$TARGETS"
fi
uri() {
    if [[ $FRONT == tcp ]]; then
        echo "nbd://127.0.0.1:${front_port[$1]}"
    else
        echo "nbd+unix:///?socket=$out/$1.sock"
    fi
}
for t in "${targets[@]}"; do
    wait_for 60 nbdinfo --size "$(uri "$t")"
done

# Fill every device so reads hit written (non-zero) data everywhere.
for t in "${targets[@]}"; do
    taskset -c "$CLIENT_CPUS" fio --name=fill --ioengine=nbd --uri="$(uri "$t")" --rw=write --bs=1M \
        --iodepth=8 --size="$SIZE" --refill_buffers --output-format=json \
        --output="$out/fill-$t.json" >/dev/null 2>&1
done

# CPU seconds (user+system, every thread, ended ones included) of a process so far.
hz=$(getconf CLK_TCK)
cpu_ticks() { if [[ -n $1 ]]; then awk '{print $14 + $15}' "/proc/$1/stat"; else echo 0; fi; }
# Busy ticks of each CPU of a list, summed (user nice system irq softirq steal).
busy_ticks() {
    local list=" $1 "
    awk -v l="$list" '$1 ~ /^cpu[0-9]+$/ { n = substr($1, 4); if (index(l, " " n " ")) s += $2 + $3 + $4 + $7 + $8 + $9 } END { print s + 0 }' /proc/stat
}
ctxt() { awk '$1 == "ctxt" {print $2}' /proc/stat; }

records="$out/records.jsonl"
: >"$records"
# run TARGET RW BS QD REP: one fio measurement, appended to $records as one JSON object.
run() {
    local t=$1 rw=$2 bs=$3 qd=$4 rep=$5 json a0 a1 b0 b1 cb0 cb1 db0 db1 c0 c1 t0 t1 dir
    json="$out/$t-$rw-$bs-qd$qd-$rep.json"
    a0=$(cpu_ticks "${front[$t]}"); b0=$(cpu_ticks "${back[$t]:-}")
    cb0=$(busy_ticks "$client_cpus"); db0=$(busy_ticks "$donor_cpus"); c0=$(ctxt)
    t0=$(date +%s.%N)
    local wrap=(python3 -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
r = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write("%f %d\n" % (r.ru_utime + r.ru_stime, r.ru_nvcsw + r.ru_nivcsw))
sys.exit(rc)' "$out/fio-rusage")
    local perf=()
    [[ -n $perf_ok ]] && perf=(perf stat -a -A -x "," -e context-switches -o "$out/perf-cs.csv" --)
    "${perf[@]}" taskset -c "$CLIENT_CPUS" "${wrap[@]}" fio --name="$t-$rw-$bs-qd$qd" --ioengine=nbd \
        --uri="$(uri "$t")" --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs=1 --size="$SIZE" \
        --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" --norandommap --randrepeat=0 \
        --output-format=json --output="$json" >/dev/null 2>&1
    t1=$(date +%s.%N)
    a1=$(cpu_ticks "${front[$t]}"); b1=$(cpu_ticks "${back[$t]:-}")
    cb1=$(busy_ticks "$client_cpus"); db1=$(busy_ticks "$donor_cpus"); c1=$(ctxt)
    dir="read"
    [[ $rw == *write ]] && dir="write"
    local pcs=""
    [[ -n $perf_ok ]] && pcs=$(cat "$out/perf-cs.csv")
    python3 - "$t" "$rw" "$bs" "$qd" "$rep" "$json" "$dir" "$hz" "$t0" "$t1" "$a0" "$a1" "$b0" "$b1" \
        "$cb0" "$cb1" "$db0" "$db1" "$c0" "$c1" "$(cat "$out/fio-rusage")" "$client_cpus" \
        "$donor_cpus" "$pcs" >>"$records" <<'PY'
import json, sys
(t, rw, bs, qd, rep, path, d, hz, t0, t1, a0, a1, b0, b1, cb0, cb1, db0, db1, c0, c1, fio_ru,
 ccpus, dcpus, pcs) = sys.argv[1:]
hz = float(hz)
j = json.load(open(path))["jobs"][0][d]
wall = float(t1) - float(t0)
iops = j["iops"]
req = iops * wall  # requests over the sampled interval, at the measured rate
fio_cpu, fio_cs = fio_ru.split()
us = lambda seconds: 1e6 * seconds / req if req else float("nan")
front = (float(a1) - float(a0)) / hz
rec = {
    "target": t, "rw": rw, "bs": bs, "qd": int(qd), "rep": int(rep), "iops": iops,
    "mean_us": j["clat_ns"]["mean"] / 1000,
    "p99_us": j["clat_ns"]["percentile"]["99.000000"] / 1000,
    "client_us": us(float(fio_cpu) + front), "fio_us": us(float(fio_cpu)), "front_us": us(front),
    "donor_us": us((float(b1) - float(b0)) / hz),
    "client_set_us": us((float(cb1) - float(cb0)) / hz),
    "donor_set_us": us((float(db1) - float(db0)) / hz),
    "machine_cs": (float(c1) - float(c0)) / req if req else float("nan"),
}
if pcs.strip():
    per = {}
    for line in pcs.splitlines():
        f = line.split(",")
        if len(f) > 3 and f[0].startswith("CPU") and f[3].startswith("context-switches"):
            per[int(f[0][3:])] = float(f[1])
    cc = sum(per.get(int(c), 0) for c in ccpus.split())
    dc = sum(per.get(int(c), 0) for c in dcpus.split())
    rec["client_cs"] = cc / req if req else float("nan")
    rec["donor_cs"] = dc / req if req else float("nan")
print(json.dumps(rec))
PY
}

echo "MODE=$MODE: fio nbd engine, 1 job, ${RUNTIME}s per run after ${RAMP}s ramp, device $SIZE (filled),"
echo "nbdkit --threads $THREADS, memserver slab $SLAB, $ncpu CPUs; medians of $REPEAT runs (targets rotated)."
if [[ $MODE == two-host ]]; then
    echo "Client side (fio, the front nbdkit) on CPUs $CLIENT_CPUS; donor side (memserver, proxy's nbdkit memory) on CPUs $DONOR_CPUS."
fi
for t in "${targets[@]}"; do echo "- $t: ${describe[$t]}"; done
echo "Load average before: $(cut -d' ' -f1-3 /proc/loadavg) (anything else running skews every column)."
echo
ntargets=${#targets[@]}
for row in $ROWS; do
    IFS=: read -r rw bs qd <<<"$row"
    for ((rep = 1; rep <= REPEAT; rep++)); do
        for ((k = 0; k < ntargets; k++)); do
            run "${targets[$(((k + rep - 1) % ntargets))]}" "$rw" "$bs" "$qd" "$rep"
        done
    done
done

python3 - "$records" "$MODE" "${targets[@]}" <<'PY'
import json, statistics, sys
path, mode, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
recs = [json.loads(l) for l in open(path)]
rows = []
for r in recs:
    k = (r["rw"], r["bs"], r["qd"])
    if k not in rows:
        rows.append(k)
by = {}
for r in recs:
    by.setdefault((r["rw"], r["bs"], r["qd"], r["rep"]), {})[r["target"]] = r
def med(vals):
    vals = [v for v in vals if v == v]
    return statistics.median(vals) if vals else float("nan")
def ratio_cell(row, t, key, ref):
    vals = []
    for (rw, bs, qd, rep), d in by.items():
        if (rw, bs, qd) == row and t in d and ref in d and d[ref][key]:
            vals.append(d[t][key] / d[ref][key])
    if not vals:
        return ""
    vals.sort()
    m = statistics.median(vals)
    return "%.2f" % m if len(vals) == 1 else "%.2f (%.2f-%.2f)" % (m, vals[0], vals[-1])
pinned = mode == "two-host"
has_cs = any("client_cs" in r for r in recs)
cols = ["workload", "target", "IOPS", "÷ proxy", "mean µs", "p99 µs", "client µs/req",
        "÷ proxy", "(fio / nbdkit)", "donor µs/req"]
if pinned:
    cols += ["client set µs/req", "donor set µs/req"]
cols += ["client cs/req", "donor cs/req"] if pinned and has_cs else ["cs/req (machine)"]
print("| " + " | ".join(cols) + " |")
print("|" + "|".join(["---"] * 2 + ["---:"] * (len(cols) - 2)) + "|")
for row in rows:
    for t in targets:
        rs = [r for r in recs if (r["rw"], r["bs"], r["qd"]) == row and r["target"] == t]
        if not rs:
            continue
        m = lambda k: med([r.get(k, float("nan")) for r in rs])
        cells = ["%s %s QD%d" % row, t, "%.0f" % m("iops"),
                 ratio_cell(row, t, "iops", "proxy") if t != "proxy" else "",
                 "%.0f" % m("mean_us"), "%.0f" % m("p99_us"), "%.1f" % m("client_us"),
                 ratio_cell(row, t, "client_us", "proxy") if t != "proxy" else "",
                 "%.1f / %.1f" % (m("fio_us"), m("front_us")),
                 "%.1f" % m("donor_us") if t != "memory" else ""]
        if pinned:
            cells += ["%.1f" % m("client_set_us"), "%.1f" % m("donor_set_us")]
        if pinned and has_cs:
            cells += ["%.2f" % m("client_cs"), "%.2f" % m("donor_cs")]
        else:
            cells += ["%.2f" % m("machine_cs")]
        print("| " + " | ".join(cells) + " |")
PY

# profile TARGET RW BS QD: one more fio run under perf record (client CPUs, call graphs), and
# the client's time per request by where it went.
profile() {
    local t=$1 rw=$2 bs=$3 qd=$4 dir="read" secs=3
    [[ $rw == *write ]] && dir="write"
    taskset -c "$CLIENT_CPUS" fio --name=profile --ioengine=nbd --uri="$(uri "$t")" --rw="$rw" --bs="$bs" \
        --iodepth="$qd" --numjobs=1 --size="$SIZE" --time_based --runtime=$((secs + 2)) \
        --norandommap --randrepeat=0 --output-format=json --output="$out/profile-$t.json" >/dev/null 2>&1 &
    local fio_pid=$!
    sleep 1
    perf record -q -F 1000 -C "$CLIENT_CPUS" --call-graph dwarf,8192 -o "$out/perf-$t.data" \
        -- sleep "$secs" >/dev/null 2>&1
    wait "$fio_pid"
    perf script -i "$out/perf-$t.data" 2>/dev/null >"$out/perf-$t.txt"
    python3 - "$t" "$rw $bs QD$qd" "$out/perf-$t.txt" "$out/profile-$t.json" "$dir" "$secs" <<'PY'
import collections, json, sys
t, row, path, fjson, d, secs = sys.argv[1:]
iops = json.load(open(fjson))["jobs"][0][d]["iops"]
req = iops * float(secs)
forward_dsos = ("nbdkit-rdmaswap-plugin", "nbdkit-nbd-plugin", "libnbd.so")
calls = [("send", ("__sys_sendmsg", "__sys_sendto", "ksys_write", "do_writev")),
         ("receive", ("__sys_recvmsg", "__sys_recvfrom", "ksys_read", "do_readv")),
         ("wait", ("do_sys_poll", "do_futex", "do_epoll_wait", "__x64_sys_ppoll"))]
cells = collections.Counter()
for sample in open(path).read().split("\n\n"):
    lines = [l.strip() for l in sample.strip().split("\n") if l.strip()]
    if len(lines) < 2:
        continue
    comm, frames = lines[0].split()[0], "\n".join(lines[1:])
    if comm.startswith("swapper"):
        continue
    who = ("forwarding" if any(x in frames for x in forward_dsos) else "nbdkit") \
        if comm.startswith("nbdkit") else "fio" if comm.startswith("fio") else "other"
    kind = next((k for k, marks in calls if any(m in frames for m in marks)),
                "other kernel" if "[kernel" in lines[1] else "user")
    cells[(who, kind)] += 1
    if kind == "send" and ("sock_def_readable" in frames or "try_to_wake_up" in frames):
        cells[(who, "(waking the peer)")] += 1
us = lambda n: 1000.0 * n / req  # one sample = 1 ms of a CPU (-F 1000)
kinds = ["send", "(waking the peer)", "receive", "wait", "user", "other kernel"]
for who in ("fio", "nbdkit", "forwarding", "other"):
    total = sum(v for (w, k), v in cells.items() if w == who and k != "(waking the peer)")
    print("| %s | %s | %s | %.1f | %s |" % (row, t, who, us(total),
          " | ".join("%.1f" % us(cells[(who, k)]) for k in kinds)))
PY
}
if [[ -n ${PROFILE:-} ]]; then
    command -v perf >/dev/null || { echo "$0: PROFILE needs perf" >&2; exit 1; }
    echo
    echo "Where the client's CPU time goes (perf record -F 1000 on CPUs $CLIENT_CPUS, 3 s of one more run), µs per request:"
    echo "(forwarding: samples with the rdmaswap plugin's, or the nbd plugin's and libnbd's, frames;"
    echo "\"waking the peer\": the part of send spent waking the receiver; wait: poll, futex, epoll)"
    echo
    echo "| row | target | who | µs/req | send | (waking the peer) | receive | wait | user | other kernel |"
    echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    for row in $PROFILE; do
        IFS=: read -r rw bs qd <<<"$row"
        for t in "${targets[@]}"; do profile "$t" "$rw" "$bs" "$qd"; done
    done
fi
echo
echo "Load average after: $(cut -d' ' -f1-3 /proc/loadavg). Raw fio JSON, records and logs: $out"
