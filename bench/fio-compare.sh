#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Compare rdmaswap (nbdkit plugin -> memserver over TCP on 127.0.0.1) with two nbdkit setups:
# - proxy: nbdkit's own nbd plugin forwarding over TCP on 127.0.0.1 to `nbdkit memory` (the same
#   topology as rdmaswap: client -> Unix socket -> nbdkit -> TCP -> server; what a user without
#   rdmaswap would run);
# - memory: nbdkit's memory plugin alone (the cost of NBD itself).
# All three are served on a Unix socket and driven by fio's NBD engine. Prints a markdown table:
# IOPS, p50 and p99 completion latency of each, the IOPS ratios rdmaswap/proxy and
# rdmaswap/memory, the CPU the servers used, and the machine's context switches per request (a
# sleep and a wake-up each, mostly: what a request costs on small machines; docs/performance.md).
#
# Usage: bench/fio-compare.sh BUILD_DIR
# Environment (all optional):
#   RUNTIME=10          seconds per measurement (after RAMP=2 seconds of warm-up)
#   SIZE=1G             device size; it is filled first so every read hits written data
#   SLAB=64M            memserver slab size (capacity = SIZE)
#   THREADS=16          nbdkit --threads, for both servers
#   RDMASWAP_ARGS=      extra plugin parameters, e.g. "threads=4"
#   ROWS="..."          subset of rows, e.g. "randread:4k:1 randwrite:128k:32"
#   REPEAT=1            measure each row REPEAT times, alternating the three servers, and report
#                       the median of each column (ratios: of the per-run ratios, with their
#                       range in brackets) (for noisy machines)
#   OUT=DIR             keep fio's JSON and the server logs there (default: a temporary dir)
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
memserver="$build/memserver/rdmaswap-memserver"
plugin="$build/nbdkit-plugin/nbdkit-rdmaswap-plugin.so"
ctl="$build/tools/rdmaswapctl"
for f in "$memserver" "$plugin" "$ctl"; do
    [[ -e $f ]] || { echo "$0: not built: $f" >&2; exit 1; }
done
for c in nbdkit nbdinfo fio jq python3; do
    command -v "$c" >/dev/null || { echo "$0: needs $c" >&2; exit 1; }
done

export PATH="/usr/bin:$PATH"
RUNTIME=${RUNTIME:-10}
RAMP=${RAMP:-2}
SIZE=${SIZE:-1G}
SLAB=${SLAB:-64M}
THREADS=${THREADS:-16}
RDMASWAP_ARGS=${RDMASWAP_ARGS:-}
REPEAT=${REPEAT:-1}
ROWS=${ROWS:-"randread:4k:1 randwrite:4k:1 randread:4k:32 randwrite:4k:32 randread:32k:32 randwrite:128k:32"}
out=${OUT:-$(mktemp -d -t rdmaswap-bench.XXXXXX)}
export STATE_DIRECTORY="$out/state" # the plugin's default volume key: here, not in /var/lib
mkdir -p "$out"
rm -f "$out/rdmaswap.sock" "$out/proxy.sock" "$out/memory.sock"
hz=$(getconf CLK_TCK)

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

# CPU seconds (user+system, all threads) a process has used so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Context switches of the whole machine so far (nbdkit's worker threads end with each client
# connection, so per-process counts would miss them; keep the machine otherwise quiet).
ctx_switches() { awk '$1 == "ctxt" {print $2}' /proc/stat; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
key="$out/auth.key"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$key")
"$memserver" --listen 127.0.0.1 --port "$port" --capacity "$SIZE" --slab-size "$SLAB" \
    --transport tcp --log-level warn --auth-key "$key" 2>"$out/memserver.log" &
ms_pid=$!
pids+=("$ms_pid")
wait_for 60 "$ctl" status "server=127.0.0.1:$port" auth-key="$key"

# shellcheck disable=SC2086 # RDMASWAP_ARGS is a list of key=value words
nbdkit -f --threads "$THREADS" -U "$out/rdmaswap.sock" "$plugin" \
    server="127.0.0.1:$port" size="$SIZE" transport=tcp auth-key="$key" $RDMASWAP_ARGS \
    2>"$out/nbdkit-rdmaswap.log" &
rs_pid=$!
pids+=("$rs_pid")
nbdkit -f --threads "$THREADS" -U "$out/memory.sock" memory "$SIZE" allocator=malloc \
    2>"$out/nbdkit-memory.log" &
mem_pid=$!
pids+=("$mem_pid")
# The proxy: `nbdkit memory` on TCP 127.0.0.1 only, and nbdkit's nbd plugin in front of it.
proxy_port=$(free_port)
nbdkit -f --threads "$THREADS" -i 127.0.0.1 -p "$proxy_port" memory "$SIZE" allocator=malloc \
    2>"$out/nbdkit-proxy-backend.log" &
pb_pid=$!
pids+=("$pb_pid")
wait_for 30 nbdinfo --size "nbd://127.0.0.1:$proxy_port"
nbdkit -f --threads "$THREADS" -U "$out/proxy.sock" nbd hostname=127.0.0.1 port="$proxy_port" \
    2>"$out/nbdkit-proxy.log" &
px_pid=$!
pids+=("$px_pid")
wait_for 30 test -S "$out/rdmaswap.sock"
wait_for 30 test -S "$out/proxy.sock"
wait_for 30 test -S "$out/memory.sock"

uri() { echo "nbd+unix:///?socket=$out/$1.sock"; }

# Fill both devices so reads hit written (non-zero) data everywhere.
for t in rdmaswap proxy memory; do
    fio --name=fill --ioengine=nbd --uri="$(uri $t)" --rw=write --bs=1M --iodepth=8 \
        --size="$SIZE" --refill_buffers --output-format=json --output="$out/fill-$t.json" \
        >/dev/null 2>&1
done

# run TARGET RW BS QD: one fio measurement; prints "iops p50_us p99_us server_cpu% backend_cpu%
# cs_per_request" (backend: the memserver for rdmaswap, the proxy's `nbdkit memory`; 0 for memory).
run() {
    local t=$1 rw=$2 bs=$3 qd=$4 json server_pid backend_pid a0 b0 a1 b1 t0 t1 c0 c1 iops
    json="$out/$t-$rw-$bs-qd$qd-${rep:-1}.json"
    case $t in
    rdmaswap) server_pid=$rs_pid backend_pid=$ms_pid ;;
    proxy) server_pid=$px_pid backend_pid=$pb_pid ;;
    memory) server_pid=$mem_pid backend_pid= ;;
    esac
    # CPU and context switches are sampled around the whole fio run (ramp included) and divided
    # by its wall time (and the switches, by the IOPS too).
    a0=$(cpu_ticks "$server_pid"); b0=0; [[ -n $backend_pid ]] && b0=$(cpu_ticks "$backend_pid")
    c0=$(ctx_switches)
    t0=$(date +%s.%N)
    fio --name="$t-$rw-$bs-qd$qd" --ioengine=nbd --uri="$(uri "$t")" --rw="$rw" --bs="$bs" \
        --iodepth="$qd" --numjobs=1 --size="$SIZE" --time_based --runtime="$RUNTIME" \
        --ramp_time="$RAMP" --norandommap --randrepeat=0 --output-format=json --output="$json" \
        >/dev/null 2>&1
    a1=$(cpu_ticks "$server_pid"); b1=0; [[ -n $backend_pid ]] && b1=$(cpu_ticks "$backend_pid")
    c1=$(ctx_switches)
    t1=$(date +%s.%N)
    local dir="read"
    [[ $rw == *write ]] && dir="write"
    iops=$(jq -r --arg d "$dir" '.jobs[0][$d].iops' "$json")
    jq -r --arg d "$dir" '.jobs[0][$d] |
        "\(.iops) \(.clat_ns.percentile["50.000000"] / 1000) \(.clat_ns.percentile["99.000000"] / 1000)"' \
        "$json" | tr '\n' ' '
    python3 -c "import sys; a0,a1,b0,b1,t0,t1,hz,c0,c1,iops=map(float,sys.argv[1:]); w=t1-t0
print('%.0f %.0f %.2f' % (100*(a1-a0)/hz/w, 100*(b1-b0)/hz/w, (c1-c0)/w/iops if iops else float('nan')))" \
        "$a0" "$a1" "$b0" "$b1" "$t0" "$t1" "$hz" "$c0" "$c1" "$iops"
}

echo "rdmaswap (TCP, 127.0.0.1, slab $SLAB) vs proxy (nbdkit nbd -> TCP 127.0.0.1 -> nbdkit memory) vs"
echo "nbdkit memory (allocator=malloc); fio nbd engine, 1 job,"
echo "${RUNTIME}s per row after ${RAMP}s ramp, device $SIZE (filled), nbdkit --threads $THREADS, $(nproc) CPUs."
echo "Latency: fio completion latency (clat). CPU: % of one core, whole fio run incl. ramp."
echo "cs/req: context switches of the whole machine per request (rate over the fio run ÷ IOPS)."
[[ $REPEAT -gt 1 ]] && echo "Each column: the median of $REPEAT alternating runs (range of each ratio in brackets)."
echo "Load average before: $(cut -d' ' -f1-3 /proc/loadavg) (anything else running skews every column)."
echo
echo "| workload | QD | rdmaswap IOPS | p50 µs | p99 µs | proxy IOPS | p50 µs | p99 µs | memory IOPS | p50 µs | p99 µs | ÷ proxy | ÷ memory | CPU% nbdkit-rdmaswap | CPU% memserver | CPU% nbdkit-proxy | CPU% proxy's memory | CPU% nbdkit-memory | cs/req rdmaswap | cs/req proxy | cs/req memory |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for row in $ROWS; do
    IFS=: read -r rw bs qd <<<"$row"
    results=()
    for ((rep = 1; rep <= REPEAT; rep++)); do
        results+=("$(run rdmaswap "$rw" "$bs" "$qd") $(run proxy "$rw" "$bs" "$qd") $(run memory "$rw" "$bs" "$qd")")
    done
    python3 - "$rw" "$bs" "$qd" "${results[@]}" <<'PY'
import sys
rw, bs, qd = sys.argv[1:4]
import statistics
# Each run: for rdmaswap, proxy, memory in turn: iops p50 p99 server_cpu backend_cpu cs_per_req
# (6 fields each, 18 in all); the two ratios are appended (18, 19).
runs = [list(map(float, r.split())) for r in sys.argv[4:]]
for r in runs:  # the ratios of each run (the three targets ran back to back)
    r.append(r[0] / r[6] if r[6] else float("nan"))
    r.append(r[0] / r[12] if r[12] else float("nan"))
med = [statistics.median(r[i] for r in runs) for i in range(len(runs[0]))]
def ratio(i):
    vals = sorted(r[i] for r in runs)
    spread = "" if len(vals) == 1 else " (%.2f-%.2f)" % (vals[0], vals[-1])
    return "%.2f%s" % (med[i], spread)
print("| %s %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f |"
      % (rw, bs, qd, med[0], med[1], med[2], med[6], med[7], med[8], med[12], med[13], med[14],
         ratio(18), ratio(19), med[3], med[4], med[9], med[10], med[15],
         med[5], med[11], med[17]))
PY
done
echo
echo "Load average after: $(cut -d' ' -f1-3 /proc/loadavg). Raw fio JSON and logs: $out"
