#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CPU per 4 KiB request in the plugin's logic, with no network: runs rdmaswap-bench-cpu (the real
# Volume over an in-memory data path, bench/cpu_per_request.cpp) with 1 to 16 threads for ns per
# request and its scaling, then counts instructions per request with one thread: with
# `perf stat -e instructions:u` when perf can count here, else with callgrind. Both separate
# the 4 KiB copies (see "copy excluded" in the output).
#
# Usage: bench/cpu-per-request.sh BUILD_DIR
# Environment (all optional):
#   THREADS=1,2,4,8,16  thread counts of the ns table
#   OPS=400000          requests per row of the ns table
#   COUNT_OPS=20000     requests per direction counted (callgrind runs ~50x slower)
#   COUNTER=auto        perf | callgrind | auto (perf if it can count instructions)
#   OUT=DIR             keep callgrind's files there (default: a temporary dir)
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
bench="$(cd "$1" && pwd)/bench/rdmaswap-bench-cpu"
[[ -x $bench ]] || { echo "$0: not built: $bench" >&2; exit 1; }
export PATH="/usr/bin:$PATH"
THREADS=${THREADS:-1,2,4,8,16}
OPS=${OPS:-400000}
COUNT_OPS=${COUNT_OPS:-20000}
COUNTER=${COUNTER:-auto}
out=${OUT:-$(mktemp -d -t rdmaswap-cpu.XXXXXX)}
mkdir -p "$out"

echo "Load average before: $(cut -d' ' -f1-3 /proc/loadavg)."
"$bench" --threads "$THREADS" --ops "$OPS"
echo

# perf_instructions ARGS...: user-space instructions of one run of the bench, or nothing.
perf_instructions() {
    perf stat -x, -e instructions:u -- "$@" 2>&1 >/dev/null | awk -F, '/instructions/ && $1 ~ /^[0-9]+$/ {print $1}'
}

if [[ $COUNTER == auto ]]; then
    COUNTER=callgrind
    if command -v perf >/dev/null && [[ -n $(perf_instructions true) ]]; then
        COUNTER=perf
    fi
fi

if [[ $COUNTER == perf ]]; then
    # Setup and fill cost the same in both runs: the difference of a run of 2N and one of N
    # requests is the cost of N requests. --no-copy drops the data path's copy (the in-memory
    # "remote" side); the Volume's copy into its bounce buffer remains, counted by callgrind.
    echo "Instructions (user space) per 4 KiB request, 1 thread, perf stat: (I(2N) - I(N)) / N, N = $COUNT_OPS."
    echo
    echo "| op | with the data path's copy | without it (--no-copy) |"
    echo "|---|---:|---:|"
    for op in read write; do
        row="| $op |"
        for copy in "" --no-copy; do
            # shellcheck disable=SC2086 # $copy is empty or one word
            i1=$(perf_instructions "$bench" --threads 1 --op "$op" --ops "$COUNT_OPS" $copy)
            # shellcheck disable=SC2086
            i2=$(perf_instructions "$bench" --threads 1 --op "$op" --ops $((2 * COUNT_OPS)) $copy)
            [[ -n $i1 && -n $i2 ]] || { echo "$0: perf cannot count instructions here" >&2; exit 1; }
            row+=" $(((i2 - i1) / COUNT_OPS)) |"
        done
        echo "$row"
    done
    exit 0
fi

if ! command -v valgrind >/dev/null || ! command -v callgrind_annotate >/dev/null; then
    echo "$0: perf cannot count instructions here and valgrind is missing" >&2
    exit 1
fi
echo "perf cannot count instructions here (or COUNTER=callgrind): callgrind, 1 thread, $COUNT_OPS"
echo "requests per direction, only inside the measured calls (--toggle-collect). Each function's"
echo "own instructions (Ir, exclusive) are put in one of four parts by its name:"
echo "  copy: memcpy/memmove (the 4 KiB copies: user buffer <-> the channel's bounce"
echo "        buffer in Volume, bounce buffer <-> \"remote\" memory in the in-memory data path);"
echo "  in-memory data path: MemDataPath (stands for the transport; not the real TCP/RDMA one);"
echo "  bench: the measured call's own wrapper;"
echo "  Volume: the rest (Volume and the libc/libstdc++ it calls: mutexes, clock, ...)."
echo
echo "| op | total | copy | in-memory data path | bench | Volume (plugin, copy excluded) |"
echo "|---|---:|---:|---:|---:|---:|"
for op in read write; do
    cg="$out/callgrind.$op"
    valgrind --tool=callgrind --callgrind-out-file="$cg" --toggle-collect="*bench_${op}_one*" \
        "$bench" --threads 1 --op "$op" --ops "$COUNT_OPS" >"$out/bench.$op.txt" 2>"$out/valgrind.$op.log"
    callgrind_annotate --auto=no --threshold=100 "$cg" >"$out/annotate.$op.txt"
    python3 - "$op" "$COUNT_OPS" "$out/annotate.$op.txt" <<'PY'
import re, sys
op, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
parts = {"copy": 0, "dp": 0, "bench": 0, "volume": 0}
for line in open(path):
    m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*)$", line)
    if not m or "PROGRAM TOTALS" in line:
        continue
    ir = int(m.group(1).replace(",", ""))
    fn = m.group(2).split(":", 1)[-1]
    if re.search(r"mem(cpy|move)", fn):
        parts["copy"] += ir
    elif "MemDataPath" in fn:
        parts["dp"] += ir
    elif "bench_" + op + "_one" in fn:
        parts["bench"] += ir
    else:
        parts["volume"] += ir
total = sum(parts.values())
print("| %s | %.0f | %.0f | %.0f | %.0f | **%.0f** |" % (op, total / n, parts["copy"] / n,
      parts["dp"] / n, parts["bench"] / n, parts["volume"] / n))
PY
done
echo
echo "Per-function counts: $out/annotate.{read,write}.txt"
