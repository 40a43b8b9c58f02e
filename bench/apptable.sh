#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The application table (issue 15; Infiniswap's headline experiment, scaled down): redis-server
# in a cgroup whose memory.max is 100 %, 75 % and 50 % of its working set, swapping to
#   rdma       rdmaswap over Soft-RoCE (rxe)       /dev/nbd0
#   tcp        rdmaswap over TCP                   /dev/nbd0
#   proxy      nbdkit's nbd plugin forwarding over TCP to nbdkit's memory plugin on the VM's
#              address (a remote RAM disk over NBD, what a user would pick instead)  /dev/nbd0
#   nvme-tcp   the kernel's NVMe-oF target (nvmet) exporting a brd RAM disk, and the kernel's
#              NVMe-oF host connected to it over TCP          /dev/nvmeXn1
#   nvme-rdma  the same over Soft-RoCE (nvmet-rdma, nvme-rdma) /dev/nvmeXn1
#   memory     nbdkit's memory plugin              /dev/nbd0 (the NBD path without rdmaswap)
#   zram       compressed RAM                      /dev/zram0
#   disk       a virtio disk (a sparse host file)  /dev/vda
# GET throughput and latency from redis-benchmark (uniformly random keys of the loaded set).
# One boot of the VM of the VM tests (tests/vm: Debian's kernel under qemu TCG, everything in
# one VM: the memserver, nbdkit, redis, redis-benchmark), the backends one after the other
# (tests/vm/run-vm-test.sh --runs app-...). With REPEAT=N, N boots one after the other, the
# backend order of boot r (0-based) rotated left by r (so no backend always runs first or
# last), and every figure of the table is the median of its N values (even N: the mean of the
# two middle ones). Writes OUT_DIR/apptable.md (the table, with each row relative to the
# 100 % row of its backend and to the disk, memory, proxy and nvme-tcp rows of the same level;
# then issue 28's goals for rdmaswap against the proxy and NVMe-oF over TCP) and
# OUT_DIR/apptable.png (gnuplot).
# The boots of REPEAT can run in separate invocations (BOOTS=0, BOOTS=1, ... with the same
# settings, e.g. each under its own lock): each boot's output is kept next to its console log
# (LOG with .out for .log), and the table is written once the outputs of all REPEAT boots with
# these settings are there (BOOTS=none: only that, no boot; a larger REPEAT with BOOTS= the new
# boots adds repeats to those already run).
#
# Software emulation: every absolute figure is far below native; compare within one run.
#
# Usage: bench/apptable.sh BUILD_DIR
# Environment (all optional):
#   BACKENDS="rdma tcp proxy nvme-tcp nvme-rdma memory zram disk"
#                                          the runs, in this order, in one boot (and the table's order)
#   REPEAT=1                               boots (1..9); the table shows the medians
#   BOOTS=all                              which of the REPEAT boots to run now (0-based, separated
#                                          by spaces), or none; the table needs all REPEAT outputs
#   KEYS=65536 VALUE=1024                  the data set: KEYS values of VALUE bytes (random base64)
#   REQUESTS=10000 CLIENTS=4               redis-benchmark -n and -c per level
#   LEVELS=100,75,50                       memory.max in % of the working set
#   OUT_DIR=docs                           where apptable.md and apptable.png go (source-relative)
#   LOG=                                   serial console log (default BUILD_DIR/vm-test-logs/apptable.log;
#                                          boot r > 0 of REPEAT: the name with -rR before .log); the
#                                          boot's output beside it, .out for .log
#   SKIP_BUILD=                            1: no `ninja -C BUILD_DIR` first (use the binaries as they are)
# Needs on the host: what the VM tests need, redis-server + redis-tools (copied into the VM) and
# gnuplot (gnuplot-nox); as root they are installed with apt-get when missing. Not part of CI.
# Exit status as run-vm-test.sh: 0 pass, 1 fail, 77 skip (no qemu or Debian kernel).
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
backends=${BACKENDS:-rdma tcp proxy nvme-tcp nvme-rdma memory zram disk}
levels=${LEVELS:-100,75,50}
repeat=${REPEAT:-1}
[[ $repeat =~ ^[1-9]$ ]] || { echo "$0: REPEAT: 1 to 9" >&2; exit 2; }
out_dir=${OUT_DIR:-docs}
case "$out_dir" in /*) ;; *) out_dir=$src/$out_dir ;; esac
blist=()
for b in $backends; do
    case "$b" in rdma|tcp|proxy|nvme-tcp|nvme-rdma|memory|zram|disk) blist+=("$b") ;;
        *) echo "$0: BACKENDS: rdma, tcp, proxy, nvme-tcp, nvme-rdma, memory, zram or disk" >&2; exit 2 ;; esac
done
nb=${#blist[@]}
[ "$nb" -gt 0 ] || { echo "$0: BACKENDS is empty" >&2; exit 2; }
backends=${blist[*]}   # one space between the names (the table's order)
boots=()
case "${BOOTS:-all}" in
    all) for ((r = 0; r < repeat; r++)); do boots+=("$r"); done ;;
    none) ;;
    *) for r in $BOOTS; do
           if ! [[ $r =~ ^[0-9]$ ]] || [ "$r" -ge "$repeat" ]; then
               echo "$0: BOOTS: boots 0 to $((repeat - 1)) of REPEAT=$repeat, all or none" >&2
               exit 2
           fi
           boots+=("$r")
       done ;;
esac

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
# the settings a boot's output must have been made with to join this table (not REPEAT: boot r's
# order depends on r alone, so a table of more repeats reuses the boots already run)
settings="backends=${backends// /,} levels=$levels keys=${KEYS:-65536} value=${VALUE:-1024} requests=${REQUESTS:-10000} clients=${CLIENTS:-4}"
boot_log() { if [ "$1" = 0 ]; then echo "$log"; else echo "${log%.log}-r$1.log"; fi; }
boot_out() { local l; l=$(boot_log "$1"); echo "${l%.log}.out"; }

# ninja first: the VM copies in the memserver and the plugin from BUILD_DIR
[ "${SKIP_BUILD:-}" = 1 ] || [ ${#boots[@]} = 0 ] || ninja -C "$build" > /dev/null
tmp=$(mktemp -d -t rdmaswap-apptable.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
for r in "${boots[@]}"; do
    runs=""
    order=""
    for ((i = 0; i < nb; i++)); do
        b=${blist[$(((i + r) % nb))]}
        runs+="${runs:+,}app-$b"
        order+="${order:+ }$b"
    done
    rlog=$(boot_log "$r")
    out=$(boot_out "$r")
    mkdir -p "$(dirname "$out")"
    [ "$repeat" = 1 ] || echo "bench/apptable.sh: repeat $((r + 1))/$repeat: $order"
    rstart=$SECONDS
    rdate=$(date -u '+%Y-%m-%d %H:%M UTC')
    set +e
    RDMASWAP_BUILD=$build RDMASWAP_SOURCE=$src "$src/tests/vm/run-vm-test.sh" --runs "$runs" \
        "${args[@]}" --log "$rlog" > "$out.tmp" 2>&1
    rc=$?
    set -e
    grep -a -E '^vm: \[app-|^run-vm-test: ' "$out.tmp" || true
    if [ "$rc" != 0 ]; then
        tail -n 80 "$out.tmp"
        mv "$out.tmp" "$out.failed"
        [ "$repeat" = 1 ] || echo "bench/apptable.sh: repeat $((r + 1))/$repeat failed"
        echo "bench/apptable.sh: exit $rc, $((SECONDS - start)) s wall (output: $out.failed)"
        exit "$rc"
    fi
    grep -a -q '^app: row ' "$out.tmp" || { echo "$0: no app rows in the output ($out.failed)" >&2; mv "$out.tmp" "$out.failed"; exit 1; }
    # what the table needs besides the rows: the settings, the boot's order, start and wall time
    {
        echo "apptable: settings $settings"
        echo "apptable: boot $r $((SECONDS - rstart)) $rdate; order $order"
    } >> "$out.tmp"
    mv "$out.tmp" "$out"
    [ "$repeat" = 1 ] || echo "bench/apptable.sh: repeat $((r + 1))/$repeat: $((SECONDS - rstart)) s"
done

# app: row B LEVEL LIMIT_KIB RPS AVG P50 P99 MAX PSWPIN PSWPOUT SECS;  app: ws B RSS_KIB CURRENT_KIB KEYS
# raw.rows and raw.ws: the same with the repeat (0-based) in front, from the outputs of all
# REPEAT boots (this invocation's and earlier ones' with the same settings)
: > "$tmp/raw.rows"
: > "$tmp/raw.ws"
: > "$tmp/boots"
missing=""
for ((r = 0; r < repeat; r++)); do
    out=$(boot_out "$r")
    if [ ! -s "$out" ]; then missing+=" $r"; continue; fi
    if ! grep -a -q -x -F "apptable: settings $settings" "$out"; then
        echo "$0: $out was made with other settings: $(grep -a '^apptable: settings ' "$out" || echo none); run boot $r again (BOOTS=$r)" >&2
        exit 1
    fi
    grep -a '^app: row ' "$out" | sed "s/^app: row /$r /" >> "$tmp/raw.rows"
    grep -a '^app: ws ' "$out" | sed "s/^app: ws /$r /" >> "$tmp/raw.ws" || true
    grep -a '^apptable: boot ' "$out" | sed 's/^apptable: boot //' >> "$tmp/boots"
    cp "$out" "$tmp/out.$r"
done
if [ -n "$missing" ]; then
    echo "bench/apptable.sh: boots$missing of REPEAT=$repeat not run yet with these settings; run them (BOOTS=\"${missing# }\") for the table; $((SECONDS - start)) s wall"
    exit 0
fi
# wall: the boots' own times added up (they may have run in separate invocations);
# started: the first boot's start
wall=$(awk '{ s += $2 } END { print s }' "$tmp/boots")
started=$(sort -k3,4 "$tmp/boots" | head -n 1 | awk '{ print $3, $4, $5 }' | sed 's/;$//')
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

cmdline="bench/apptable.sh BUILD"
for v in BACKENDS KEYS VALUE REQUESTS CLIENTS LEVELS REPEAT; do
    [ -z "${!v:-}" ] || cmdline="$v=\"${!v}\" $cmdline"
done
niceness=$(nice)
[ "$niceness" = 0 ] || cmdline="nice -n $niceness $cmdline"
split_note=""
[ ${#boots[@]} = "$repeat" ] \
    || split_note="one invocation per boot, with BOOTS=r, the table from their outputs; "
kver=$(grep -a -o 'kernel [^ ]*-amd64' "$tmp/out.0" | head -n 1 || true)

# the table: ratios against the 100 % row of the same backend and the same level of
# disk/memory/proxy/nvme-tcp
table=$(awk '
    { b[NR] = $1; lv[NR] = $2; lim[NR] = $3; rps[NR] = $4; p50[NR] = $6; p99[NR] = $7; pin[NR] = $9
      if ($2 == 100) full[$1] = NR
      if ($1 == "disk") disk[$2] = NR
      if ($1 == "memory") mem[$2] = NR
      if ($1 == "proxy") prx[$2] = NR
      if ($1 == "nvme-tcp") nvt[$2] = NR }
    function ratio(a, b) { return (b > 0) ? sprintf("%.2f", a / b) : "-" }
    END {
        print "| backend | memory.max | limit MiB | GET/s | p50 ms | p99 ms | GET/s vs 100 % | p99 vs 100 % | GET/s vs disk | GET/s vs memory | GET/s vs proxy | GET/s vs nvme-tcp | p99 vs disk | pswpin |"
        print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        for (i = 1; i <= NR; i++) {
            f = full[b[i]]; d = disk[lv[i]]; m = mem[lv[i]]; x = prx[lv[i]]; t = nvt[lv[i]]
            printf "| %s | %d %% | %.1f | %.0f | %.3f | %.3f | %s | %s | %s | %s | %s | %s | %s | %d |\n",
                b[i], lv[i], lim[i] / 1024, rps[i], p50[i], p99[i],
                f ? ratio(rps[i], rps[f]) : "-", f ? ratio(p99[i], p99[f]) : "-",
                d ? ratio(rps[i], rps[d]) : "-", m ? ratio(rps[i], rps[m]) : "-",
                x ? ratio(rps[i], rps[x]) : "-", t ? ratio(rps[i], rps[t]) : "-",
                d ? ratio(p99[i], p99[d]) : "-", pin[i]
        }
    }' "$tmp/rows")
# issue 28's goals: rdmaswap (rdma, tcp) at every level below 100 % at least 1.2x the proxy's
# GET/s and 0.7x NVMe-oF over TCP's; judged on the medians, shown with the same ratio within
# each boot (raw.rows: the repeat in front); rdma against nvme-rdma beside them (no goal)
goals=$(awk -v repeat="$repeat" '
    FNR == 1 { file++ }
    file == 1 { rps[$1, $2] = $4; if ($2 < 100) lv[$2] = 1; next }
    { raw[$1, $2, $3] = $5 }
    function ratio(a, b) { return (b > 0) ? a / b : -1 }
    function fmt(x) { return (x < 0) ? "-" : sprintf("%.2f", x) }
    function perboot(b, o, l,    r, s, x) {
        s = ""
        for (r = 0; r < repeat; r++) {
            x = ((r, o, l) in raw && (r, b, l) in raw) ? ratio(raw[r, b, l], raw[r, o, l]) : -1
            s = s (r ? ", " : "") fmt(x)
        }
        return s
    }
    function verdict(x, goal) { return (x < 0) ? "-" : (x >= goal ? "yes" : "**no**") }
    END {
        n = asorti_levels()
        if (!n) exit
        split("rdma tcp", bs, " ")
        for (i = 1; i <= 2; i++) for (j = 1; j <= n; j++) {
            b = bs[i]; l = ls[j]
            if (!((b, l) in rps)) continue
            xp = ((("proxy", l) in rps)) ? ratio(rps[b, l], rps["proxy", l]) : -1
            xt = ((("nvme-tcp", l) in rps)) ? ratio(rps[b, l], rps["nvme-tcp", l]) : -1
            xr = (b == "rdma" && (("nvme-rdma", l) in rps)) ? ratio(rps[b, l], rps["nvme-rdma", l]) : -1
            if (!rows++) {
                print "| rdmaswap | memory.max | vs proxy (goal >= 1.20) | per boot | held | vs nvme-tcp (goal >= 0.70) | per boot | held | rdma vs nvme-rdma | per boot |"
                print "|---|---:|---:|---|---|---:|---|---|---:|---|"
            }
            printf "| %s | %d %% | %s | %s | %s | %s | %s | %s | %s | %s |\n", b, l,
                fmt(xp), perboot(b, "proxy", l), verdict(xp, 1.2),
                fmt(xt), perboot(b, "nvme-tcp", l), verdict(xt, 0.7),
                fmt(xr), (b == "rdma") ? perboot(b, "nvme-rdma", l) : "-"
            if (xp >= 0) { tot++; if (xp >= 1.2) held++ }
            if (xt >= 0) { tot++; if (xt >= 0.7) held++ }
        }
        if (rows) printf "SUMMARY %d %d\n", held, tot
    }
    # the levels below 100 %, highest first
    function asorti_levels(    k, m, a, b, t) {
        m = 0
        for (k in lv) ls[++m] = k + 0
        for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++) if (ls[b] > ls[a]) { t = ls[a]; ls[a] = ls[b]; ls[b] = t }
        return m
    }' "$tmp/rows" "$tmp/raw.rows")
goals_sum=$(sed -n 's/^SUMMARY //p' <<< "$goals")
goals=$(grep -v '^SUMMARY ' <<< "$goals" || true)
# the 100 % rows swap (almost) nothing: their spread is the host's load changing during the run
spread=$(awk '$2 == 100 { if (!n++ || $4 < lo) lo = $4; if ($4 > hi) hi = $4 }
    END { if (n > 1) printf "%.0f to %.0f GET/s (%.2fx)", lo, hi, hi / lo }' "$tmp/rows")
agree=$(awk '$2 == 100 { if (!n++ || $4 < lo) lo = $4; if ($4 > hi) hi = $4 }
    END { if (n > 1) print (hi <= 1.15 * lo) ? "yes" : "no" }' "$tmp/rows")
# and per backend, its 100 % row over the repeats (raw.rows: the repeat in front)
bspread=$(awk -v order="$backends" '$3 == 100 { b = $2; if (!n[b]++ || $5 < lo[b]) lo[b] = $5; if ($5 > hi[b]) hi[b] = $5 }
    END { nb = split(order, bs, " ")
          for (i = 1; i <= nb; i++) { b = bs[i]; if (!n[b]) continue
              printf "%s%s %.0f to %.0f (%.2fx)", (k++ ? ", " : ""), b, lo[b], hi[b], (lo[b] > 0 ? hi[b] / lo[b] : 0) } }' "$tmp/raw.rows")
ws=$(awk '{ printf "%s%s %.1f MiB (redis RSS %.1f MiB)", (NR > 1 ? ", " : ""), $1, $3 / 1024, $2 / 1024 }' "$tmp/ws")
bootlist=$(sort -n "$tmp/boots" | awk '{ t = $3 " " $4 " " $5; sub(/;$/, "", t); o = $0; sub(/^.*; order /, "", o)
    printf "%s%d (%s): %s, %d s", (NR > 1 ? "; " : ""), $1, o, t, $2 }')

mkdir -p "$out_dir"
{
    echo "# Application table: redis GETs under memory limits, per swap device"
    echo
    if [ "$repeat" = 1 ]; then
        echo "Measured $started by \`$cmdline\` (bench/apptable.sh; $wall s wall, one VM boot;"
    else
        echo "Measured $started by \`$cmdline\` (bench/apptable.sh; $split_note$wall s of VM boots in all, $repeat boots;"
    fi
    echo "${kver:-Debian kernel} under qemu TCG, 2 virtual CPUs, 2 GiB)."
    echo
    echo "**Software emulation.** Everything runs in one qemu TCG guest (no KVM), RDMA is Soft-RoCE"
    echo "(rxe) on a veth pair, and the memserver, nbdkit, the NVMe-oF target and host, redis-server"
    echo "and redis-benchmark share its two virtual CPUs. Absolute figures are far below native"
    echo "hardware (TCG alone is roughly 50-100x slower) and vary with the host's load between runs:"
    echo "compare the rows of this one run with each other, not with other runs or other systems."
    echo
    echo "redis-server 7.0 (no persistence: \`--save '' --appendonly no\`) in a cgroup v2 child,"
    echo "${KEYS:-65536} keys of ${VALUE:-1024} bytes of random base64 text loaded with \`redis-cli --pipe\`;"
    echo "the working set W is the cgroup's \`memory.current\` after the load (what \`memory.max\`"
    echo "limits): $ws. Then \`memory.max\` = ${levels//,/ %, } % of W in turn, and at each level"
    echo "\`redis-benchmark -t get -r ${KEYS:-65536} -n ${REQUESTS:-10000} -c ${CLIENTS:-4} --csv\` (uniformly random"
    echo "keys, no warm-up: the limit is set, then measured). The values of 256 keys spread over the"
    echo "key space, read after the load and after the last level, must agree (they did), and pages"
    echo "must have been swapped out below 100 % (they were). Swap devices,"
    echo "256 MiB each, one at a time: **rdma** and **tcp**: rdmaswap (memserver + nbdkit plugin,"
    echo "defaults) on \`/dev/nbd0\`; **proxy**: nbdkit's nbd plugin on \`/dev/nbd0\` forwarding over TCP"
    echo "to nbdkit's memory plugin listening on the VM's address and the memserver's port (a remote"
    echo "RAM disk over plain NBD; both nbdkits with \`--swap\`, the memory plugin with"
    echo "\`allocator=malloc,mlock=true\` like the memory backend); **nvme-tcp** and **nvme-rdma**: the"
    echo "kernel's NVMe-oF target (nvmet, configured through configfs) exporting a brd RAM disk"
    echo "\`/dev/ram0\` on the VM's address, port 4420, and the kernel's NVMe-oF host connected to it"
    echo "over TCP or over the Soft-RoCE device (nvme-tcp, nvme-rdma: \`/dev/nvme0n1\`); **memory**:"
    echo "nbdkit's memory plugin on \`/dev/nbd0\` (the same NBD path without rdmaswap or a network hop);"
    echo "**zram**: \`/dev/zram0\` (lzo-rle; the random base64 values compress to about 3/4 at best);"
    echo "**disk**: \`/dev/vda\`, a virtio disk on a sparse file of the host (qemu's default writeback"
    echo "cache: the host's page cache sits in front of it, so it is a fast disk)."
    echo
    echo "Ratios: \"vs 100 %\" against the same backend's 100 % row; \"vs disk\", \"vs memory\", \"vs"
    echo "proxy\" and \"vs nvme-tcp\" against that backend's row at the same level. pswpin: pages"
    echo "swapped in during the level."
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
        echo "The boots (order, start, length): $bootlist."
    fi
    if [ "$repeat" = 1 ] && [ -n "$spread" ]; then
        echo
        echo "**Noise check.** At 100 % nothing swaps, so the 100 % rows should agree; here they range"
        echo "from $spread: within 15 % of each other: **$agree**. Where they differ much, the host's"
        echo "load changed while the backends ran one after the other, and only the \"vs 100 %\" columns"
        echo "(each backend against itself, minutes apart at most) mean much; the columns against other"
        echo "backends then mix in the load change."
    elif [ "$repeat" != 1 ]; then
        echo
        echo "**Noise check.** At 100 % nothing swaps, so the 100 % rows should agree."
        [ -z "$spread" ] || echo "The medians range from $spread: within 15 % of each other: **$agree**."
        echo "Per backend, the GET/s of its 100 % row over the $repeat runs: $bspread."
        echo "A wide range within one backend means the host's load changed between or during the"
        echo "runs; the median damps it, the rotated order spreads it over the backends. Where the"
        echo "medians of the backends still differ much, only the \"vs 100 %\" columns (each backend"
        echo "against itself) mean much; the columns against other backends then mix in the load change."
    fi
    echo
    echo "$table"
    if [ -n "$goals" ]; then
        echo
        echo "**Issue 28's goals**: rdmaswap at least 1.2x the GET/s of the nbd proxy and at least 0.7x"
        echo "that of NVMe-oF over TCP at 75 % and 50 % fit, over TCP (tcp) and over rxe (rdma). Judged"
        echo "on the medians above; \"per boot\" is the same ratio within each boot (boot 0, 1, ...:"
        echo "the two backends minutes apart under the same load). rdma against nvme-rdma (both over"
        echo "rxe) is shown beside them, with no goal. Held: ${goals_sum% *} of ${goals_sum#* }."
        echo
        echo "$goals"
    fi
    echo
    echo "![GET throughput and p99 latency per backend and memory level](apptable.png)"
} > "$out_dir/apptable.md"

# the plot: GET/s and p99 per level, one bar per backend
awk '{ print $2, $1, $4, $7 }' "$tmp/rows" > "$tmp/plot"
med_title=""
[ "$repeat" = 1 ] || med_title="; medians of $repeat runs"
{
    echo "set terminal pngcairo size 1300,500 font 'sans,10'"
    echo "set output '$out_dir/apptable.png'"
    echo "set multiplot layout 1,2 title 'redis GET under memory.max (qemu TCG + Soft-RoCE: compare within this run; $started$med_title)'"
    echo "set style data histogram; set style histogram cluster gap 1; set style fill solid 0.8 border -1"
    echo "set boxwidth 0.9; set grid ytics; set key outside right top vertical; set xlabel 'memory.max (% of working set)'"
    echo "set ylabel 'GET/s'; set title 'throughput (log scale)'; set logscale y; set yrange [*:*]"
    printf "plot "
    i=0
    for b in $backends; do
        i=$((i + 1))
        printf "'%s' using 3:xtic(1) title '%s'" "$tmp/plot.$b" "$b"
        [ "$i" = "$nb" ] || printf ", "
        awk -v b="$b" '$2 == b' "$tmp/plot" > "$tmp/plot.$b"
    done
    echo
    echo "set ylabel 'p99 latency (ms)'; set title 'p99 latency (log scale)'"
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
echo "bench/apptable.sh: wrote $out_dir/apptable.md and $out_dir/apptable.png; $wall s of VM boots, $((SECONDS - start)) s wall now"
