#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The application table (issue 15; Infiniswap's headline experiment, scaled down): redis-server
# in a cgroup whose memory.max is 100 %, 75 % and 50 % of its working set, swapping to
#   rdma    rdmaswap over Soft-RoCE (rxe)       /dev/nbd0
#   tcp     rdmaswap over TCP                   /dev/nbd0
#   memory  nbdkit's memory plugin              /dev/nbd0 (the NBD path without rdmaswap)
#   zram    compressed RAM                      /dev/zram0
#   disk    a virtio disk (a sparse host file)  /dev/vda
# GET throughput and latency from redis-benchmark (uniformly random keys of the loaded set).
# One boot of the VM of the VM tests (tests/vm: Debian's kernel under qemu TCG, everything in
# one VM: the memserver, nbdkit, redis, redis-benchmark), the backends one after the other
# (tests/vm/run-vm-test.sh --runs app-...). With REPEAT=N, N boots one after the other, the
# backend order of boot r (0-based) rotated left by r (so no backend always runs first or
# last), and every figure of the table is the median of its N values (even N: the mean of the
# two middle ones). Writes OUT_DIR/apptable.md (the table, with each row relative to the
# 100 % row of its backend and to the disk and memory rows of the same level) and
# OUT_DIR/apptable.png (gnuplot).
#
# Software emulation: every absolute figure is far below native; compare within one run.
#
# Usage: bench/apptable.sh BUILD_DIR
# Environment (all optional):
#   BACKENDS="rdma tcp memory zram disk"   the runs, in this order, in one boot (and the table's order)
#   REPEAT=1                               boots (1..9); the table shows the medians
#   KEYS=65536 VALUE=1024                  the data set: KEYS values of VALUE bytes (random base64)
#   REQUESTS=10000 CLIENTS=4               redis-benchmark -n and -c per level
#   LEVELS=100,75,50                       memory.max in % of the working set
#   OUT_DIR=docs                           where apptable.md and apptable.png go (source-relative)
#   LOG=                                   serial console log (default BUILD_DIR/vm-test-logs/apptable.log;
#                                          boot r > 0 of REPEAT: the name with -rR before .log)
#   SKIP_BUILD=                            1: no `ninja -C BUILD_DIR` first (use the binaries as they are)
# Needs on the host: what the VM tests need, redis-server + redis-tools (copied into the VM) and
# gnuplot (gnuplot-nox); as root they are installed with apt-get when missing. Not part of CI.
# Exit status as run-vm-test.sh: 0 pass, 1 fail, 77 skip (no qemu or Debian kernel).
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
backends=${BACKENDS:-rdma tcp memory zram disk}
levels=${LEVELS:-100,75,50}
repeat=${REPEAT:-1}
[[ $repeat =~ ^[1-9]$ ]] || { echo "$0: REPEAT: 1 to 9" >&2; exit 2; }
out_dir=${OUT_DIR:-docs}
case "$out_dir" in /*) ;; *) out_dir=$src/$out_dir ;; esac
blist=()
for b in $backends; do
    case "$b" in rdma|tcp|memory|zram|disk) blist+=("$b") ;;
        *) echo "$0: BACKENDS: rdma, tcp, memory, zram or disk" >&2; exit 2 ;; esac
done
nb=${#blist[@]}
[ "$nb" -gt 0 ] || { echo "$0: BACKENDS is empty" >&2; exit 2; }

# host packages: redis (copied into the VM) and gnuplot
need=()
command -v redis-server > /dev/null || need+=(redis-server)
command -v redis-benchmark > /dev/null || need+=(redis-tools)
command -v gnuplot > /dev/null || need+=(gnuplot-nox)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}"
    else
        echo "$0: missing ${need[*]}: apt-get install ${need[*]}" >&2
        exit 1
    fi
fi

args=(--app-keys "${KEYS:-65536}" --app-value "${VALUE:-1024}"
      --app-requests "${REQUESTS:-10000}" --app-clients "${CLIENTS:-4}" --app-levels "$levels"
      --quiet)
log=${LOG:-$build/vm-test-logs/apptable.log}

# ninja first: the VM copies in the memserver and the plugin from BUILD_DIR
[ "${SKIP_BUILD:-}" = 1 ] || ninja -C "$build" > /dev/null
tmp=$(mktemp -d -t rdmaswap-apptable.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
started=$(date -u '+%Y-%m-%d %H:%M UTC')
# app: row B LEVEL LIMIT_KIB RPS AVG P50 P99 MAX PSWPIN PSWPOUT SECS;  app: ws B RSS_KIB CURRENT_KIB KEYS
# raw.rows and raw.ws: the same with the repeat (0-based) in front
: > "$tmp/raw.rows"
: > "$tmp/raw.ws"
for ((r = 0; r < repeat; r++)); do
    runs=""
    order=""
    for ((i = 0; i < nb; i++)); do
        b=${blist[$(((i + r) % nb))]}
        runs+="${runs:+,}app-$b"
        order+="${order:+ }$b"
    done
    rlog=$log
    [ "$r" = 0 ] || rlog=${log%.log}-r$r.log
    out=$tmp/out.$r
    [ "$repeat" = 1 ] || echo "bench/apptable.sh: repeat $((r + 1))/$repeat: $order"
    rstart=$SECONDS
    set +e
    RDMASWAP_BUILD=$build RDMASWAP_SOURCE=$src "$src/tests/vm/run-vm-test.sh" --runs "$runs" \
        "${args[@]}" --log "$rlog" > "$out" 2>&1
    rc=$?
    set -e
    wall=$((SECONDS - start))
    grep -a -E '^vm: \[app-|^run-vm-test: ' "$out" || true
    if [ "$rc" != 0 ]; then
        tail -n 80 "$out"
        [ "$repeat" = 1 ] || echo "bench/apptable.sh: repeat $((r + 1))/$repeat failed"
        echo "bench/apptable.sh: exit $rc, $wall s wall"
        exit "$rc"
    fi
    grep -a '^app: row ' "$out" | sed "s/^app: row /$r /" > "$tmp/rows.$r" || true
    [ -s "$tmp/rows.$r" ] || { echo "$0: no app rows in the output" >&2; exit 1; }
    cat "$tmp/rows.$r" >> "$tmp/raw.rows"
    grep -a '^app: ws ' "$out" | sed "s/^app: ws /$r /" >> "$tmp/raw.ws" || true
    [ "$repeat" = 1 ] || echo "bench/apptable.sh: repeat $((r + 1))/$repeat: $((SECONDS - rstart)) s"
done
wall=$((SECONDS - start))
if [ "$repeat" != 1 ]; then
    echo "bench/apptable.sh: raw rows (repeat B LEVEL LIMIT_KIB RPS AVG P50 P99 MAX PSWPIN PSWPOUT SECS):"
    cat "$tmp/raw.rows"
fi

# the medians over the repeats of every numeric column, per (backend, level) in the order of
# BACKENDS and LEVELS (not the rotated one): rows and ws as one boot writes them
median='
    # odd count: the middle value as written (REPEAT=1: the rows as they are); even: the mean
    # of the two middle ones
    function med(key, col,    n, k, j, x, t) {
        n = cnt[key]
        for (k = 1; k <= n; k++) x[k] = k
        for (k = 2; k <= n; k++) {
            t = x[k]
            for (j = k - 1; j >= 1 && val[key, col, x[j]] + 0 > val[key, col, t] + 0; j--) x[j + 1] = x[j]
            x[j + 1] = t
        }
        if (n % 2) return val[key, col, x[(n + 1) / 2]]
        return sprintf("%.10g", (val[key, col, x[n / 2]] + val[key, col, x[n / 2 + 1]]) / 2)
    }'
awk -v order="$backends" -v levels="$levels" -v repeat="$repeat" "$median"'
    { key = $2 SUBSEP $3; n = ++cnt[key]; ncol = NF
      for (c = 4; c <= NF; c++) val[key, c, n] = $c }
    END {
        nb = split(order, bs, " "); nl = split(levels, ls, ",")
        for (i = 1; i <= nb; i++) for (j = 1; j <= nl; j++) {
            key = bs[i] SUBSEP ls[j]
            if (!cnt[key]) continue
            if (cnt[key] != repeat)
                printf "bench/apptable.sh: %s %s %%: %d rows for %d repeats\n", bs[i], ls[j], cnt[key], repeat > "/dev/stderr"
            line = bs[i] " " ls[j]
            for (c = 4; c <= ncol; c++) line = line " " med(key, c)
            print line
        }
    }' "$tmp/raw.rows" > "$tmp/rows"
awk -v order="$backends" -v repeat="$repeat" "$median"'
    { key = $2; n = ++cnt[key]; ncol = NF
      for (c = 3; c <= NF; c++) val[key, c, n] = $c }
    END {
        nb = split(order, bs, " ")
        for (i = 1; i <= nb; i++) {
            key = bs[i]
            if (!cnt[key]) continue
            line = bs[i]
            for (c = 3; c <= ncol; c++) line = line " " med(key, c)
            print line
        }
    }' "$tmp/raw.ws" > "$tmp/ws"
[ -s "$tmp/rows" ] || { echo "$0: no app rows in the output" >&2; exit 1; }

cmdline="nice -n 10 bench/apptable.sh BUILD"
for v in BACKENDS KEYS VALUE REQUESTS CLIENTS LEVELS REPEAT; do
    [ -z "${!v:-}" ] || cmdline="$v=\"${!v}\" $cmdline"
done
kver=$(grep -a -o 'kernel [^ ]*-amd64' "$tmp/out.0" | head -n 1 || true)

# the table: ratios against the 100 % row of the same backend and the same level of disk/memory
table=$(awk '
    { b[NR] = $1; lv[NR] = $2; lim[NR] = $3; rps[NR] = $4; p50[NR] = $6; p99[NR] = $7; pin[NR] = $9
      if ($2 == 100) full[$1] = NR
      if ($1 == "disk") disk[$2] = NR
      if ($1 == "memory") mem[$2] = NR }
    function ratio(a, b) { return (b > 0) ? sprintf("%.2f", a / b) : "-" }
    END {
        print "| backend | memory.max | limit MiB | GET/s | p50 ms | p99 ms | GET/s vs 100 % | p99 vs 100 % | GET/s vs disk | GET/s vs memory | p99 vs disk | pswpin |"
        print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        for (i = 1; i <= NR; i++) {
            f = full[b[i]]; d = disk[lv[i]]; m = mem[lv[i]]
            printf "| %s | %d %% | %.1f | %.0f | %.3f | %.3f | %s | %s | %s | %s | %s | %d |\n",
                b[i], lv[i], lim[i] / 1024, rps[i], p50[i], p99[i],
                f ? ratio(rps[i], rps[f]) : "-", f ? ratio(p99[i], p99[f]) : "-",
                d ? ratio(rps[i], rps[d]) : "-", m ? ratio(rps[i], rps[m]) : "-",
                d ? ratio(p99[i], p99[d]) : "-", pin[i]
        }
    }' "$tmp/rows")
# the 100 % rows swap (almost) nothing: their spread is the host's load changing during the run
spread=$(awk '$2 == 100 { if (!n++ || $4 < lo) lo = $4; if ($4 > hi) hi = $4 }
    END { if (n > 1) printf "%.0f to %.0f GET/s (%.1fx)", lo, hi, hi / lo }' "$tmp/rows")
# and per backend, its 100 % row over the repeats (raw.rows: the repeat in front)
bspread=$(awk -v order="$backends" '$3 == 100 { b = $2; if (!n[b]++ || $5 < lo[b]) lo[b] = $5; if ($5 > hi[b]) hi[b] = $5 }
    END { nb = split(order, bs, " ")
          for (i = 1; i <= nb; i++) { b = bs[i]; if (!n[b]) continue
              printf "%s%s %.0f to %.0f (%.2fx)", (k++ ? ", " : ""), b, lo[b], hi[b], (lo[b] > 0 ? hi[b] / lo[b] : 0) } }' "$tmp/raw.rows")
ws=$(awk '{ printf "%s%s %.1f MiB (redis RSS %.1f MiB)", (NR > 1 ? ", " : ""), $1, $3 / 1024, $2 / 1024 }' "$tmp/ws")

mkdir -p "$out_dir"
{
    echo "# Application table: redis GETs under memory limits, per swap device"
    echo
    if [ "$repeat" = 1 ]; then
        echo "Measured $started by \`$cmdline\` (bench/apptable.sh; $wall s wall, one VM boot;"
    else
        echo "Measured $started by \`$cmdline\` (bench/apptable.sh; $wall s wall in all, $repeat VM boots;"
    fi
    echo "${kver:-Debian kernel} under qemu TCG, 2 virtual CPUs, 2 GiB)."
    echo
    echo "**Software emulation.** Everything runs in one qemu TCG guest (no KVM), RDMA is Soft-RoCE"
    echo "(rxe) on a veth pair, and the memserver, nbdkit, redis-server and redis-benchmark share its"
    echo "two virtual CPUs. Absolute figures are far below native hardware (TCG alone is roughly"
    echo "50-100x slower) and vary with the host's load between runs: compare the rows of this one"
    echo "run with each other, not with other runs or other systems."
    echo
    echo "redis-server 7.0 (no persistence: \`--save '' --appendonly no\`) in a cgroup v2 child,"
    echo "${KEYS:-65536} keys of ${VALUE:-1024} bytes of random base64 text loaded with \`redis-cli --pipe\`;"
    echo "the working set W is the cgroup's \`memory.current\` after the load (what \`memory.max\`"
    echo "limits): $ws. Then \`memory.max\` = 100 %, 75 %, 50 % of W in turn, and at each level"
    echo "\`redis-benchmark -t get -r ${KEYS:-65536} -n ${REQUESTS:-10000} -c ${CLIENTS:-4} --csv\` (uniformly random"
    echo "keys, no warm-up: the limit is set, then measured). The values of 256 keys spread over the"
    echo "key space, read after the load and after the last level, must agree (they did). Swap devices, 256 MiB"
    echo "each, one at a time: **rdma** and **tcp**: rdmaswap (memserver + nbdkit plugin) on"
    echo "\`/dev/nbd0\`; **memory**: nbdkit's memory plugin on \`/dev/nbd0\` (the same NBD path without"
    echo "rdmaswap); **zram**: \`/dev/zram0\` (lzo-rle; the random base64 values compress to about"
    echo "3/4 at best); **disk**: \`/dev/vda\`, a virtio disk on a sparse file of the host (qemu's"
    echo "default writeback cache: the host's page cache sits in front of it, so it is a fast disk)."
    echo
    echo "Ratios: \"vs 100 %\" against the same backend's 100 % row; \"vs disk\" and \"vs memory\""
    echo "against that backend's row at the same level. pswpin: pages swapped in during the level."
    if [ "$repeat" != 1 ]; then
        echo
        echo "**Repeats.** $repeat runs: $repeat boots of the VM one after the other, boot r (r = 0 to"
        echo "$((repeat - 1))) running the backends in the order above rotated left by r, so that each"
        echo "backend ran at $repeat different moments of the bench. Every figure here (the working sets,"
        echo "the limit, GET/s, latencies, pswpin) is the median of its $repeat values, one per run"
        if [ $((repeat % 2)) = 0 ]; then
            echo "(an even count: the mean of the two middle values; with 2 runs simply the mean, which"
            echo "does not reject an outlier). The ratios are ratios of these medians."
        else
            echo "(the middle value). The ratios are ratios of these medians."
        fi
    fi
    if [ "$repeat" = 1 ] && [ -n "$spread" ]; then
        echo
        echo "**Noise check.** At 100 % nothing swaps, so the 100 % rows should agree; here they range"
        echo "from $spread. Where they differ much, the host's load changed while the"
        echo "backends ran one after the other, and only the \"vs 100 %\" columns (each backend against"
        echo "itself, minutes apart at most) mean much; the \"vs disk\"/\"vs memory\" columns then mix in"
        echo "the load change."
    elif [ "$repeat" != 1 ]; then
        echo
        echo "**Noise check.** At 100 % nothing swaps, so the 100 % rows should agree."
        [ -z "$spread" ] || echo "The medians range from $spread."
        echo "Per backend, the GET/s of its 100 % row over the $repeat runs: $bspread."
        echo "A wide range within one backend means the host's load changed between or during the"
        echo "runs; the median damps it, the rotated order spreads it over the backends. Where the"
        echo "medians of the backends still differ much, only the \"vs 100 %\" columns (each backend"
        echo "against itself) mean much; the \"vs disk\"/\"vs memory\" columns then mix in the load change."
    fi
    echo
    echo "$table"
    echo
    echo "![GET throughput and p99 latency per backend and memory level](apptable.png)"
} > "$out_dir/apptable.md"

# the plot: GET/s and p99 per level, one bar per backend
awk '{ print $2, $1, $4, $7 }' "$tmp/rows" > "$tmp/plot"
med_title=""
[ "$repeat" = 1 ] || med_title="; medians of $repeat runs"
{
    echo "set terminal pngcairo size 1000,420 font 'sans,10'"
    echo "set output '$out_dir/apptable.png'"
    echo "set multiplot layout 1,2 title 'redis GET under memory.max (qemu TCG + Soft-RoCE: compare within this run; $started$med_title)'"
    echo "set style data histogram; set style histogram cluster gap 1; set style fill solid 0.8 border -1"
    echo "set boxwidth 0.9; set grid ytics; set key top right; set xlabel 'memory.max (% of working set)'"
    echo "set ylabel 'GET/s'; set title 'throughput'; set yrange [0:*]"
    printf "plot "
    i=0
    for b in $backends; do
        i=$((i + 1))
        printf "'%s' using 3:xtic(1) title '%s'" "$tmp/plot.$b" "$b"
        [ "$i" = "$nb" ] || printf ", "
        awk -v b="$b" '$2 == b' "$tmp/plot" > "$tmp/plot.$b"
    done
    echo
    echo "set ylabel 'p99 latency (ms)'; set title 'p99 latency (log scale)'; set logscale y; set yrange [*:*]; set key top left"
    printf "plot "
    i=0
    for b in $backends; do
        i=$((i + 1))
        printf "'%s' using 4:xtic(1) title '%s'" "$tmp/plot.$b" "$b"
        [ "$i" = "$nb" ] || printf ", "
    done
    echo
    echo "unset multiplot"
} > "$tmp/plot.gp"
gnuplot "$tmp/plot.gp"

cat "$out_dir/apptable.md"
echo "bench/apptable.sh: wrote $out_dir/apptable.md and $out_dir/apptable.png; $wall s wall"
