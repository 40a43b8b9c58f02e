#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Boot the Debian kernel in a qemu TCG VM with a generated busybox initramfs and test swap over NBD:
# nbd-client -swap -> nbdkit (rdmaswap plugin, or the memory plugin as baseline) -> memserver over
# TCP or Soft-RoCE, all inside the one VM.  The guest side is guest-init.sh (copied in as /init),
# which sources guest/lib.sh, guest/boot.sh and guest/scenarios/*.sh (copied in as /guest).
#
# Exit: 0 pass, 1 fail (guest FAIL line, time-out, kernel warning, missing binary), 77 skip (no qemu
# or no Debian kernel with modules).  See tests/vm/README.md.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: run-vm-test.sh [--mode rdma|tcp|memory|kill|pressure|twohost] [--bench] [--mib N] [options]

  --mode M          rdma (default): rdmaswap over Soft-RoCE, plus rdmaswap-rdma-tests
                    tcp: rdmaswap over TCP;  memory: nbdkit memory plugin (harness baseline)
                    kill: kill -9 the memserver under a live /dev/nbd0, expect EIO, no hang
                    pressure: memory pressure on the whole VM (no cgroup), see --transport
                    twohost: two VMs joined by a qemu socket netdev: VM A runs the memserver,
                    VM B nbdkit + plugin over RDMA, nbd-client and swap (a few MiB only)
  --etcd            twohost: VM A also runs a single-member etcd (the host's /usr/bin/etcd,
                    copied in), its memserver registers there (--etcd --advertise), and VM B's
                    plugin gets etcd= and no server=: it must find the donor through etcd
                    (skips, exit 77, without etcd and etcdctl: etcd-server, etcd-client)
  --transport L     pressure: comma-separated transports, run in this order in one boot:
                    rdma (default), tcp, memory
  --crypt           swap through dm-crypt (plain, random key, aes-xts-plain64) over /dev/nbd0,
                    in every swap run of the mode; checks the memserver holds no plaintext
  --prefill         write all of /dev/nbd0 before mkswap, so that every slab is granted (and its
                    memory region registered) before the workload: a diagnostic workaround for
                    the slab-grant deadlock under whole-VM pressure (see README)
  --plugin-args S   extra rdmaswap plugin parameters, e.g. "timeout=2"
  --no-realtime     plugin realtime=0 and memservers without --realtime: a diagnostic, to see
                    the whole-VM pressure deadlock that real-time priority prevents (README)
  --runs L          one boot, these swap runs in order (comma-separated), then a table; a run
                    is [pressure-][crypt-]rdma|tcp|memory, e.g. pressure-rdma,pressure-tcp,crypt-rdma,
                    or repkill-rdma|tcp, or alloc-rdma|tcp, or acct-rdma|tcp|proxy (below)
  --extra-runs L    runs added to the boot of --mode rdma|tcp|memory (after its own run) or
                    --mode kill (before the kill), same names as --runs
                    repkill-T: 3 memservers, plugin replicas=2 over T, cgroup swap, one memserver
                    that holds slabs killed (-9) mid-run: every page verified, no I/O error,
                    the volume back to full redundancy (issue 4)
                    alloc-T: nbdkit + plugin (and the memserver) under tests/alloc's allocation
                    counter, nbddrive's requests over T, 0 allocations required (issue 5)
                    reattach-T: nbdkit (volume=, lease=, 2 memservers over T, replicas=2)
                    killed -9 after REA_MIB MiB were written to /dev/nbd0, restarted with the
                    same volume: the new plugin must take the slabs over and every byte must
                    read back (block level; nbd-client reconnected by hand)
                    persist-T: the same under swap with nbd-client -swap -persist -nonetlink,
                    killed mid-swapload (by hand: see README for what this kernel does)
                    reconnect-T: swap on /dev/nbd0 attached by rdmaswap-nbd connect
                    (netlink, dead-connection timeout), nbdkit killed -9 mid-swapload and
                    restarted, rdmaswap-nbd reconnect: every page must verify, no I/O error
                    acct-T: data path accounting (issue 13): fio's nbd engine on nbdkit with
                    the plugin over T, rows of random reads and writes; per request the
                    WRs posted, doorbells, CQ polls (empty), completions, sleeps, batches,
                    nbdkit's and the donor's CPU, from the plugin's status file
                    (RDMASWAP-VM-ACCT lines; fio is copied into the image;
                    bench/rdma-accounting.sh). acct-proxy: the same rows through nbdkit's
                    nbd plugin to an nbdkit memory plugin over TCP (CPU and requests only)
                    soak-T: the fault soak (issue 11): 3 memservers over T, each on its own
                    veth link, replicas=2; swapload and a 4 KiB O_DIRECT probe of /dev/nbd0
                    every 100 ms while netem delay, netem loss, an nftables partition,
                    SIGSTOP/SIGCONT and kill -9 + restart hit one donor after another; every
                    page verified, no I/O error, no hung task; meanwhile nbdhistory checks
                    every read of a second export (a second nbdkit with the plugin) against
                    the guarantee: no violation (report: RDMASWAP-VM-SOAK lines)
                    fence-rdma: the RDMA fence (issue 25): tests/vm/rdmafence with two data
                    paths of one session, tc holding one path's write past timeout= and
                    delivering it after a newer write through the other: never read back
                    app-B: the application table (issue 15, bench/apptable.sh): redis-server
                    (no persistence) in a cgroup, loaded with --app-keys random values, then
                    memory.max at each of --app-levels % of its working set and redis-benchmark
                    GETs; B is the swap device: rdma|tcp (rdmaswap on /dev/nbd0), proxy (nbdkit's
                    nbd plugin on /dev/nbd0 forwarding over TCP to an nbdkit memory plugin on
                    the VM's address), nvme-tcp|nvme-rdma (the kernel's NVMe-oF target exporting
                    a brd RAM disk, the kernel's NVMe-oF host connected to it over TCP or
                    Soft-RoCE: /dev/nvmeXn1), memory (nbdkit's memory plugin), zram (/dev/zram0)
                    or disk (/dev/vda: a virtio disk on a sparse host file); report:
                    RDMASWAP-VM-APP lines
  --app-keys N      app runs: keys loaded into redis (default 65536)
  --app-value N     app runs: bytes per value, random base64 text (default 1024)
  --app-requests N  app runs: redis-benchmark GET requests per level (default 10000)
  --app-clients N   app runs: redis-benchmark -c (default 4)
  --app-levels L    app runs: memory.max levels in % of the working set (default 100,75,50)
  --app-swap SIZE   app runs: size of the swap device (default 256M)
  --acct-seconds N  acct runs: seconds of fio per row (default 5)
  --acct-rows L     acct runs: the rows, RW:BS:QD separated by spaces (default "randread:4k:1
                    randwrite:4k:1 randread:4k:32 randwrite:4k:32 randread:32k:8")
  --soak-seconds N  soak runs: how long the workload, probe and faults last (default 120)
  --soak-seed N     soak runs: seed of the fault schedule (default: random, printed)
  --soak-timeout N  soak runs: the plugin's timeout= in seconds (default 3)
  --soak-mib N      soak runs: swapload's working set in MiB (default 64; cgroup 32M, device 64M)
  --no-reconnect    reconnect runs: leave rdmaswap-nbd reconnect out (the run must FAIL)
  --reattach-lease N  reattach/persist runs: the plugin's lease= (default 60; 0 must FAIL)
  --reattach-volume NAME  reattach/persist runs: volume= of the restarted nbdkit (default the
                    first one's, vmtest; another name must FAIL)
  --replicas N      repkill runs: the plugin's replicas= (default 2; 1 must make them FAIL)
  --alloc-requests N  alloc runs: requests counted in steady state (default 100000)
  --bench           one boot, the swap workload over rdma, tcp and memory; prints a table
  --bench-modes L   comma-separated subset/order for --bench (default rdma,tcp,memory)
  --mib N           swapload working set in MiB of the cgroup runs (default 256; twohost 24)
  --cg-max SIZE     memory.max of the workload cgroup (default 64M; twohost 8M)
  --pressure-extra N  pressure runs: swapload needs MemAvailable + N MiB (default 256)
  --capacity SIZE   memserver --capacity and plugin size= (default 768M; with pressure runs
                    384M; twohost 256M)
  --passes P        swapload verify passes (default 2)
  --rewrite         swapload rewrites every page in each pass (more swap-out traffic)
  --swapload-args S extra swapload arguments (e.g. "--inject zero" to see a FAIL)
  --min-pswpout N   pages of pswpout required of a cgroup run (default N*200, i.e. 200 MiB for
                    256 MiB; with another --cg-max 3/4 of N minus memory.max)
  --conns N         nbd-client -C N (default 1); reconnect runs: rdmaswap-nbd --connections N
  --kill-transport T  transport of --mode kill: rdma (default) or tcp
  --stats           put nbdkit's stats filter in front of the plugin and print its report
  --timeout S       wall-clock limit for the VM (default 600 s; --bench, --runs, pressure:
                    200 + 450 per run)
  --mem MIB         VM memory (default 2048; with pressure runs 1024; twohost 768 each)
  --smp N           VM CPUs (default 2; twohost 1 each)
  --port N          twohost: host loopback TCP port of the socket netdev (default: a free one)
  --sysrq-before S  a VM still running S seconds before --timeout gets SysRq w,m,l,t through
                    qemu's monitor, to show on its console where it hangs (default 45; 0: never)
  --log FILE        serial console log (default $RDMASWAP_BUILD/vm-test-logs/<mode>.log;
                    twohost: FILE for VM B and FILE with -server before .log for VM A)
  --keep            keep the temporary directory (initramfs tree, image)
  --force           boot even if the plugin's --dump-plugin says rdmaswap_rdma=no
  --verbose         stream the console while the VM runs (default when stdout is a terminal)
  --quiet           do not stream the console
environment: RDMASWAP_BUILD (meson build dir, required), RDMASWAP_SOURCE (source dir, optional)
EOF
}

MODE=rdma
BENCH=0
BENCH_MODES=rdma,tcp,memory
TRANSPORTS=rdma
CRYPT=0
ETCD=0
PREFILL=0
PLUGIN_ARGS=""
REALTIME=1
RUNS=""
EXTRA_RUNS=""
REPLICAS=2
REA_LEASE=60
REA_VOLUME2=""
REC_SKIP=0
ALLOC_REQUESTS=100000
ACCT_SECONDS=5
ACCT_ROWS=""
APP_KEYS=65536
APP_VALUE=1024
APP_REQUESTS=10000
APP_CLIENTS=4
APP_LEVELS=100,75,50
APP_SWAP=256M
SOAK_SECONDS=120
SOAK_SEED=""
SOAK_PLUGIN_TIMEOUT=3
SOAK_MIB=64
MIB=""
CG_MAX=""
PRESSURE_EXTRA=256
CAPACITY=""
PORT=""
PASSES=2
REWRITE=0
SWAPLOAD_EXTRA=""
MIN_PSWPOUT=""
CONNS=1
KILL_TRANSPORT=rdma
STATS=0
TIMEOUT=""
MEM=""
SMP=""
LOG=""
KEEP=0
FORCE=0
SYSRQ_BEFORE=45
VERBOSE=""

die() { echo "run-vm-test: ERROR: $*" >&2; exit 1; }
skip() { echo "run-vm-test: SKIP: $*" >&2; exit 77; }
note() { echo "run-vm-test: $*" >&2; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

while [ $# -gt 0 ]; do
    case "$1" in
        --mode) MODE=${2:?--mode needs a value}; shift ;;
        --mode=*) MODE=${1#*=} ;;
        --bench) BENCH=1 ;;
        --bench-modes) BENCH_MODES=${2:?}; shift ;;
        --transport) TRANSPORTS=${2:?}; shift ;;
        --crypt) CRYPT=1 ;;
        --etcd) ETCD=1 ;;
        --prefill) PREFILL=1 ;;
        --plugin-args) PLUGIN_ARGS=${2?}; shift ;;
        --no-realtime) REALTIME=0 ;;
        --runs) RUNS=${2:?}; MODE=runs; shift ;;
        --extra-runs) EXTRA_RUNS=${2:?}; shift ;;
        --replicas) REPLICAS=${2:?}; shift ;;
        --reattach-lease) REA_LEASE=${2:?}; shift ;;
        --reattach-volume) REA_VOLUME2=${2:?}; shift ;;
        --no-reconnect) REC_SKIP=1 ;;
        --alloc-requests) ALLOC_REQUESTS=${2:?}; shift ;;
        --acct-seconds) ACCT_SECONDS=${2:?}; shift ;;
        --acct-rows) ACCT_ROWS=${2:?}; shift ;;
        --app-keys) APP_KEYS=${2:?}; shift ;;
        --app-value) APP_VALUE=${2:?}; shift ;;
        --app-requests) APP_REQUESTS=${2:?}; shift ;;
        --app-clients) APP_CLIENTS=${2:?}; shift ;;
        --app-levels) APP_LEVELS=${2:?}; shift ;;
        --app-swap) APP_SWAP=${2:?}; shift ;;
        --soak-seconds) SOAK_SECONDS=${2:?}; shift ;;
        --soak-seed) SOAK_SEED=${2:?}; shift ;;
        --soak-timeout) SOAK_PLUGIN_TIMEOUT=${2:?}; shift ;;
        --soak-mib) SOAK_MIB=${2:?}; shift ;;
        --mib) MIB=${2:?}; shift ;;
        --cg-max) CG_MAX=${2:?}; shift ;;
        --pressure-extra) PRESSURE_EXTRA=${2:?}; shift ;;
        --capacity) CAPACITY=${2:?}; shift ;;
        --port) PORT=${2:?}; shift ;;
        --sysrq-before) SYSRQ_BEFORE=${2:?}; shift ;;
        --passes) PASSES=${2:?}; shift ;;
        --rewrite) REWRITE=1 ;;
        --swapload-args) SWAPLOAD_EXTRA=${2?}; shift ;;
        --min-pswpout) MIN_PSWPOUT=${2:?}; shift ;;
        --conns) CONNS=${2:?}; shift ;;
        --kill-transport) KILL_TRANSPORT=${2:?}; shift ;;
        --stats) STATS=1 ;;
        --timeout) TIMEOUT=${2:?}; shift ;;
        --mem) MEM=${2:?}; shift ;;
        --smp) SMP=${2:?}; shift ;;
        --log) LOG=${2:?}; shift ;;
        --keep) KEEP=1 ;;
        --force) FORCE=1 ;;
        --verbose) VERBOSE=1 ;;
        --quiet) VERBOSE=0 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
    shift
done

case "$MODE" in
    rdma|tcp|memory|kill|pressure|twohost|runs) ;;
    *) die "--mode must be rdma, tcp, memory, kill, pressure or twohost" ;;
esac
case "$KILL_TRANSPORT" in rdma|tcp) ;; *) die "--kill-transport must be rdma or tcp" ;; esac
[ "$BENCH" = 0 ] || [ "$MODE" != runs ] || die "--bench and --runs do not combine"
[ "$CRYPT" = 0 ] || [ "$MODE" != runs ] || die "--crypt and --runs do not combine (name the runs crypt-...)"
case "$MODE" in kill|twohost) [ "$CRYPT" = 0 ] || die "--crypt does not apply to --mode $MODE" ;; esac
[ "$ETCD" = 0 ] || [ "$MODE" = twohost ] || die "--etcd needs --mode twohost"

# The swap runs of this boot (guest RUNS): [pressure-][crypt-]rdma|tcp|memory
cpfx=""
[ "$CRYPT" = 0 ] || cpfx=crypt-
if [ "$BENCH" = 1 ]; then
    MODE=bench
    RUNS=""
    for m in ${BENCH_MODES//,/ }; do RUNS+=" $cpfx$m"; done
else
    case "$MODE" in
        rdma|tcp|memory) RUNS=$cpfx$MODE ;;
        pressure) RUNS=""; for t in ${TRANSPORTS//,/ }; do RUNS+=" pressure-$cpfx$t"; done ;;
        runs) RUNS=${RUNS//,/ } ;;
        kill|twohost) RUNS="" ;;
    esac
fi
if [ -n "$EXTRA_RUNS" ]; then
    case "$MODE" in
        rdma|tcp|memory|kill) RUNS+=" ${EXTRA_RUNS//,/ }" ;;
        *) die "--extra-runs needs --mode rdma, tcp, memory or kill (or name the runs in --runs)" ;;
    esac
fi
RUNS=$(xargs <<< "$RUNS")   # trim
has_pressure=0 has_cgroup=0 has_crypt=0 has_alloc=0 has_reconnect=0 has_soak=0 has_acct=0
has_app=0 has_zram=0 has_disk=0 has_fence=0 has_proxy=0 has_nvme=0
run_transports=""
for r in $RUNS; do
    t=$r
    case "$t" in
        repkill-rdma|repkill-tcp) has_cgroup=1; run_transports+=" ${t#repkill-}"; continue ;;
        backupkill-rdma|backupkill-tcp) has_cgroup=1; run_transports+=" ${t#backupkill-}"; continue ;;
        alloc-rdma|alloc-tcp) has_alloc=1; run_transports+=" ${t#alloc-}"; continue ;;
        acct-rdma|acct-tcp) has_acct=1; run_transports+=" ${t#acct-}"; continue ;;
        acct-proxy) has_acct=1; has_proxy=1; continue ;;
        reattach-rdma|reattach-tcp) run_transports+=" ${t#reattach-}"; continue ;;
        persist-rdma|persist-tcp) has_cgroup=1; run_transports+=" ${t#persist-}"; continue ;;
        reconnect-rdma|reconnect-tcp) has_cgroup=1; has_reconnect=1; run_transports+=" ${t#reconnect-}"; continue ;;
        soak-rdma|soak-tcp) has_soak=$((has_soak + 1)); run_transports+=" ${t#soak-}"; continue ;;
        fence-rdma) has_fence=1; run_transports+=" rdma"; continue ;;
        app-rdma|app-tcp) has_app=1; run_transports+=" ${t#app-}"; continue ;;
        app-memory) has_app=1; continue ;;
        app-proxy) has_app=1; has_proxy=1; continue ;;
        app-nvme-tcp|app-nvme-rdma) has_app=1; has_nvme=1; continue ;;
        app-zram) has_app=1; has_zram=1; continue ;;
        app-disk) has_app=1; has_disk=1; continue ;;
    esac
    case "$t" in pressure-*) has_pressure=1; t=${t#pressure-} ;; *) has_cgroup=1 ;; esac
    case "$t" in crypt-*) has_crypt=1; t=${t#crypt-} ;; esac
    case "$t" in rdma|tcp|memory) run_transports+=" $t" ;; *) die "unknown swap run '$r' (want [pressure-][crypt-]rdma|tcp|memory, repkill-, backupkill-, alloc-, acct-, reattach-, persist-, reconnect- or soak-rdma|tcp, fence-rdma, or app-rdma|tcp|proxy|nvme-tcp|nvme-rdma|memory|zram|disk)" ;; esac
done
[ "$MODE" != twohost ] || has_cgroup=1
case "$MODE" in kill|twohost) ;; *) [ -n "$RUNS" ] || die "no swap runs given" ;; esac

# Defaults that depend on the mode
if [ "$MODE" = twohost ]; then
    : "${MIB:=24}" "${CG_MAX:=8M}" "${MEM:=768}" "${SMP:=1}" "${CAPACITY:=256M}"
elif [ "$has_pressure" = 1 ]; then
    : "${MIB:=256}" "${CG_MAX:=64M}" "${MEM:=1024}" "${SMP:=2}" "${CAPACITY:=384M}"
else
    : "${MIB:=256}" "${CG_MAX:=64M}" "${MEM:=2048}" "${SMP:=2}" "${CAPACITY:=768M}"
fi
if [ -z "$TIMEOUT" ]; then
    TIMEOUT=600
    if [ "$BENCH" = 1 ] || [ "$MODE" = runs ] || [ "$MODE" = pressure ]; then
        n=$(wc -w <<< "$RUNS")
        # a soak run takes its length plus about 3 minutes (start, prefill, end, teardown)
        TIMEOUT=$((200 + 450 * (n - has_soak) + (SOAK_SECONDS + 300) * has_soak))
    fi
fi
is_uint "$SYSRQ_BEFORE" || die "--sysrq-before needs an integer"
is_uint "$REA_LEASE" || die "--reattach-lease needs an integer"
[ -z "$REA_VOLUME2" ] || [[ "$REA_VOLUME2" =~ ^[!-~]{1,64}$ ]] || die "--reattach-volume: 1 to 64 printable characters, no space"
for v in MIB PASSES CONNS TIMEOUT MEM SMP PRESSURE_EXTRA REPLICAS ALLOC_REQUESTS SOAK_SECONDS \
        SOAK_PLUGIN_TIMEOUT SOAK_MIB ACCT_SECONDS; do
    is_uint "${!v}" && [ "${!v}" -gt 0 ] || die "--${v,,} needs a positive integer"
done
for v in APP_KEYS APP_VALUE APP_REQUESTS APP_CLIENTS; do
    is_uint "${!v}" && [ "${!v}" -gt 0 ] || die "--$(tr '_A-Z' '-a-z' <<< "$v") needs a positive integer"
done
[[ "$APP_LEVELS" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--app-levels needs percentages separated by commas, e.g. 100,75,50"
[[ "$APP_SWAP" =~ ^[0-9]+[MG]$ ]] || die "--app-swap needs a size like 256M or 1G"
[ "$SOAK_MIB" -ge 48 ] || die "--soak-mib must be at least 48 (the soak's cgroup has memory.max=32M)"
for r in $ACCT_ROWS; do
    [[ "$r" =~ ^(randread|randwrite|read|write):[0-9]+[kKmM]?:[0-9]+$ ]] \
        || die "--acct-rows: '$r' is not RW:BS:QD (e.g. randread:4k:32)"
done
[ -n "$SOAK_SEED" ] || SOAK_SEED=$((RANDOM * 32768 + RANDOM))
is_uint "$SOAK_SEED" || die "--soak-seed needs an integer"
[[ "$CG_MAX" =~ ^[0-9]+M$ ]] || die "--cg-max needs a size in MiB like 64M"
[[ "$CAPACITY" =~ ^[0-9]+[MG]$ ]] || die "--capacity needs a size like 384M or 1G"
[ -z "$PORT" ] || { is_uint "$PORT" && [ "$PORT" -gt 1023 ] && [ "$PORT" -lt 65536 ]; } \
    || die "--port needs a TCP port number above 1023"
CG_MIB=${CG_MAX%M}
if [ "$has_cgroup" = 1 ] && [ "$MIB" -lt $((CG_MIB + 16)) ]; then
    die "--mib must be at least $((CG_MIB + 16)): the workload cgroup's memory.max is $CG_MAX"
fi
[ -z "$MIN_PSWPOUT" ] || is_uint "$MIN_PSWPOUT" || die "--min-pswpout needs an integer"
if [ -z "$MIN_PSWPOUT" ]; then
    if [ "$CG_MAX" = 64M ]; then
        MIN_PSWPOUT=$((MIB * 200))
    else
        MIN_PSWPOUT=$(((MIB - CG_MIB) * 192))   # 3/4 of what does not fit in the cgroup
    fi
fi
[ -n "$VERBOSE" ] || { if [ -t 1 ]; then VERBOSE=1; else VERBOSE=0; fi; }

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST_INIT=$SCRIPT_DIR/guest-init.sh
[ -r "$GUEST_INIT" ] || die "missing $GUEST_INIT"
GUEST_DIR=$SCRIPT_DIR/guest   # the harness and the scenarios /init sources (copied in as /guest)
[ -r "$GUEST_DIR/lib.sh" ] && [ -r "$GUEST_DIR/boot.sh" ] || die "missing $GUEST_DIR/lib.sh or boot.sh"

# ----- skip conditions: qemu and a Debian kernel with its modules ------------------------------
QEMU=$(command -v qemu-system-x86_64 || true)
[ -n "$QEMU" ] || skip "qemu-system-x86_64 not installed (apt-get install qemu-system-x86)"
KVER=""
for k in /boot/vmlinuz-*-amd64; do
    [ -e "$k" ] || continue
    v=${k#/boot/vmlinuz-}
    [ -r "/lib/modules/$v/modules.dep" ] || continue
    KVER=$(printf '%s\n%s\n' "$KVER" "$v" | sed '/^$/d' | sort -V | tail -n 1)
done
[ -n "$KVER" ] || skip "no /boot/vmlinuz-*-amd64 with /lib/modules/<ver> (apt-get install linux-image-amd64)"
KERNEL=/boot/vmlinuz-$KVER
[ -r "$KERNEL" ] || skip "$KERNEL is not readable"
# --etcd: the host's etcd and etcdctl go into the image
ETCD_BIN="" ETCDCTL_BIN=""
if [ "$ETCD" = 1 ]; then
    ETCD_BIN=$(PATH=/usr/bin:/usr/sbin:$PATH command -v etcd || true)
    ETCDCTL_BIN=$(PATH=/usr/bin:/usr/sbin:$PATH command -v etcdctl || true)
    # (bash's command -v names a file that is not executable if it finds no other)
    [ -f "$ETCD_BIN" ] && [ -x "$ETCD_BIN" ] && [ -f "$ETCDCTL_BIN" ] && [ -x "$ETCDCTL_BIN" ] \
        || skip "--etcd needs etcd and etcdctl on the host (apt-get install etcd-server etcd-client)"
fi

# ----- host tools (their absence is a failure, not a skip) --------------------------------------
need_cmd() {
    local p
    p=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH command -v "$1" || true)
    [ -n "$p" ] || die "'$1' not found on the host (apt-get install $2)"
    printf '%s\n' "$p"
}
BUSYBOX=$(need_cmd busybox busybox-static)
if ldd "$BUSYBOX" > /dev/null 2>&1; then
    die "$BUSYBOX is dynamically linked; install busybox-static"
fi
CPIO=$(need_cmd cpio cpio)
MODPROBE=$(need_cmd modprobe kmod)
IP=$(need_cmd ip iproute2)
RDMA=$(need_cmd rdma iproute2)
NBD_CLIENT=$(need_cmd nbd-client nbd-client)
NBDKIT=$(need_cmd nbdkit nbdkit)
TC="" NFT="" CHRT=""
if [ "$has_soak" != 0 ]; then
    TC=$(need_cmd tc iproute2)
    NFT=$(need_cmd nft nftables)
    CHRT=$(need_cmd chrt util-linux)
fi
[ "$has_fence" = 0 ] || [ -n "$TC" ] || TC=$(need_cmd tc iproute2)   # fence runs: tc's hold
FIO=""
[ "$has_acct" = 0 ] || FIO=$(need_cmd fio fio)
REDIS_SERVER="" REDIS_CLI="" REDIS_BENCHMARK=""
if [ "$has_app" = 1 ]; then
    REDIS_SERVER=$(need_cmd redis-server redis-server)
    REDIS_CLI=$(need_cmd redis-cli redis-tools)
    REDIS_BENCHMARK=$(need_cmd redis-benchmark redis-tools)
    need_cmd python3 python3 > /dev/null
fi
CRYPTSETUP=""
if [ "$has_crypt" = 1 ]; then
    CRYPTSETUP=$(need_cmd cryptsetup cryptsetup-bin)
fi
need_cmd timeout coreutils > /dev/null
need_cmd ldd libc-bin > /dev/null

[ -n "${RDMASWAP_BUILD:-}" ] || die "RDMASWAP_BUILD (the meson build directory) is not set"
[ -d "$RDMASWAP_BUILD" ] || die "RDMASWAP_BUILD=$RDMASWAP_BUILD is not a directory"
RDMASWAP_BUILD=$(cd "$RDMASWAP_BUILD" && pwd)

B_SWAPLOAD=$RDMASWAP_BUILD/tests/vm/swapload
B_MEMSCAN=$RDMASWAP_BUILD/tests/vm/memscan
B_NBDDRIVE=$RDMASWAP_BUILD/tests/vm/nbddrive
B_NBDPROBE=$RDMASWAP_BUILD/tests/vm/nbdprobe
B_RDMAFENCE=$RDMASWAP_BUILD/tests/vm/rdmafence
B_NBDHISTORY=$RDMASWAP_BUILD/tests/vm/nbdhistory
B_ALLOC_COUNTER=$RDMASWAP_BUILD/tests/alloc/librdmaswap-alloc-counter.so
B_MEMSERVER=$RDMASWAP_BUILD/memserver/rdmaswap-memserver
B_PLUGIN=$RDMASWAP_BUILD/nbdkit-plugin/nbdkit-rdmaswap-plugin.so
B_CTL=$RDMASWAP_BUILD/tools/rdmaswapctl
B_NBD=$RDMASWAP_BUILD/tools/rdmaswap-nbd
B_RDMA_TESTS=$RDMASWAP_BUILD/tests/rdma/rdmaswap-rdma-tests

# What the chosen mode needs.
need_swapload=0 need_rdmaswap=0 need_rdma=0 want_rdma_tests=0
need_crypt=$has_crypt need_memscan=0
case "$MODE" in
    kill)
        need_rdmaswap=1; [ "$KILL_TRANSPORT" = tcp ] || need_rdma=1
        [ -z "$RUNS" ] || need_swapload=1
        for t in $run_transports; do [ "$t" != rdma ] || need_rdma=1; done
        ;;
    twohost) need_swapload=1; need_rdmaswap=1; need_rdma=1; need_memscan=1 ;;
    *)
        need_swapload=1
        [ "$MODE" != rdma ] || want_rdma_tests=1
        for t in $run_transports; do
            case "$t" in
                tcp) need_rdmaswap=1 ;;
                rdma) need_rdmaswap=1; need_rdma=1 ;;
            esac
        done
        [ "$need_crypt" = 0 ] || need_memscan=1
        ;;
esac
missing=()
[ "$need_swapload" = 0 ] || [ -x "$B_SWAPLOAD" ] || missing+=("$B_SWAPLOAD")
[ "$need_memscan" = 0 ] || [ -x "$B_MEMSCAN" ] || missing+=("$B_MEMSCAN")
[ "$has_soak" = 0 ] || [ -x "$B_NBDPROBE" ] || missing+=("$B_NBDPROBE")
[ "$has_fence" = 0 ] || [ -x "$B_RDMAFENCE" ] || missing+=("$B_RDMAFENCE")
[ "$has_soak" = 0 ] || [ -x "$B_NBDHISTORY" ] || missing+=("$B_NBDHISTORY")
if [ "$has_alloc" = 1 ]; then
    [ -x "$B_NBDDRIVE" ] || missing+=("$B_NBDDRIVE")
    [ -f "$B_ALLOC_COUNTER" ] || missing+=("$B_ALLOC_COUNTER")
fi
if [ "$need_rdmaswap" = 1 ]; then
    [ -x "$B_MEMSERVER" ] || missing+=("$B_MEMSERVER")
    [ -f "$B_PLUGIN" ] || missing+=("$B_PLUGIN")
    [ -x "$B_CTL" ] || missing+=("$B_CTL")
fi
[ "$has_reconnect" = 0 ] || [ -x "$B_NBD" ] || missing+=("$B_NBD")
if [ ${#missing[@]} -gt 0 ]; then
    die "mode '$MODE' needs binaries that are not built in $RDMASWAP_BUILD:$(printf '\n    %s' "${missing[@]}")
    (build them: ninja -C $RDMASWAP_BUILD)"
fi
if [ "$need_rdmaswap" = 1 ] && [ "$need_rdma" = 1 ] && [ "$FORCE" = 0 ]; then
    # Fail fast (no boot) when the plugin says it was built without RDMA.
    if dump=$("$NBDKIT" "$B_PLUGIN" --dump-plugin 2> /dev/null) \
            && grep -qx 'rdmaswap_rdma=no' <<< "$dump"; then
        die "mode '$MODE' needs RDMA but '$NBDKIT $B_PLUGIN --dump-plugin' says rdmaswap_rdma=no (--force boots anyway)"
    fi
fi
RXE_DRIVER=/etc/libibverbs.d/rxe.driver
RXE_LIB=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so 2> /dev/null | head -n 1 || true)
if [ "$need_rdma" = 1 ] && { [ ! -r "$RXE_DRIVER" ] || [ -z "$RXE_LIB" ]; }; then
    die "the rxe verbs provider is missing ($RXE_DRIVER, librxe-rdmav*.so): apt-get install ibverbs-providers"
fi

# ----- temp dir, cleanup --------------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rdmaswap-vm.XXXXXX")
declare -A QPIDS=()   # VM name -> pid of timeout(1) running its qemu
WATCHERS=()           # pids of the SysRq watcher subshells
TAILPID=""
stop_watchers() {
    local w
    for w in "${WATCHERS[@]}"; do
        pkill -P "$w" 2> /dev/null || true   # its sleep
        kill "$w" 2> /dev/null || true
    done
    WATCHERS=()
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_watchers
    if [ -n "$TAILPID" ]; then kill "$TAILPID" 2> /dev/null || true; fi
    local qpid kids
    for qpid in "${QPIDS[@]}"; do
        kill -0 "$qpid" 2> /dev/null || continue
        # $qpid is timeout(1); its child is qemu.  TERM is passed on, KILL would not be.
        kids=$(pgrep -P "$qpid" 2> /dev/null || true)
        kill -TERM "$qpid" 2> /dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$qpid" 2> /dev/null || break
            sleep 0.5
        done
        # shellcheck disable=SC2086
        kill -KILL $kids "$qpid" 2> /dev/null || true
    done
    if [ "$KEEP" = 1 ]; then
        note "kept $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -z "$LOG" ]; then
    LOG=$RDMASWAP_BUILD/vm-test-logs/$MODE.log
    [ "$ETCD" = 0 ] || LOG=$RDMASWAP_BUILD/vm-test-logs/$MODE-etcd.log
fi
mkdir -p "$(dirname "$LOG")"
LOG=$(cd "$(dirname "$LOG")" && pwd)/$(basename "$LOG")

# ----- initramfs -----------------------------------------------------------------------------
ROOT=$WORK/root
mkdir -p "$ROOT"/usr/{bin,sbin,lib,lib64} "$ROOT"/usr/local/bin \
    "$ROOT"/{dev,proc,sys,run,tmp,etc/rdmaswap-vm,root}
ln -s usr/bin "$ROOT/bin"
ln -s usr/sbin "$ROOT/sbin"
ln -s usr/lib "$ROOT/lib"
ln -s usr/lib64 "$ROOT/lib64"
chmod 1777 "$ROOT/tmp"

declare -A COPIED=()
# add_file SRC [DEST]: copy (dereferenced) into the image at DEST (default: same path)
add_file() {
    local src=$1 dst=${2:-$1}
    [ -z "${COPIED[$dst]:-}" ] || return 0
    [ -e "$src" ] || die "cannot copy $src into the image: it does not exist"
    mkdir -p "$ROOT$(dirname "$dst")"
    cp -L "$src" "$ROOT$dst"
    COPIED[$dst]=1
}
# add_elf SRC [DEST]: the file plus every library ldd lists for it
add_elf() {
    local src=$1 dst=${2:-$1} out line lib
    add_file "$src" "$dst"
    out=$(ldd "$src" 2>&1) || {
        grep -q 'not a dynamic executable' <<< "$out" && return 0
        die "ldd $src failed: $out"
    }
    if grep -q 'not found' <<< "$out"; then
        die "ldd $src: missing libraries:
$(grep 'not found' <<< "$out")"
    fi
    while read -r line; do
        case "$line" in
            *'=> /'*) lib=${line#*=> }; lib=${lib%% (*} ;;
            /*) lib=${line%% (*} ;;
            *) continue ;;
        esac
        add_file "$lib"
    done <<< "$out"
}

# busybox and its applets (real tools copied below take precedence)
add_file "$BUSYBOX" /usr/bin/busybox

# iproute2 (busybox's ip cannot create veth pairs), nbd-client, nbdkit + plugins
add_elf "$IP" /usr/sbin/ip
add_elf "$RDMA" /usr/sbin/rdma
add_elf "$NBD_CLIENT" /usr/sbin/nbd-client
add_elf "$NBDKIT" /usr/sbin/nbdkit
NBDKIT_PLUGINDIR=$(pkg-config --variable=plugindir nbdkit 2> /dev/null || true)
[ -n "$NBDKIT_PLUGINDIR" ] || NBDKIT_PLUGINDIR=/usr/lib/x86_64-linux-gnu/nbdkit/plugins
NBDKIT_FILTERDIR=$(pkg-config --variable=filterdir nbdkit 2> /dev/null || true)
[ -n "$NBDKIT_FILTERDIR" ] || NBDKIT_FILTERDIR=/usr/lib/x86_64-linux-gnu/nbdkit/filters
add_elf "$NBDKIT_PLUGINDIR/nbdkit-memory-plugin.so"
add_elf "$NBDKIT_FILTERDIR/nbdkit-stats-filter.so"

# glibc dlopens libgcc_s for thread cancellation/unwinding; ldd does not show it
# (awk reads all of ldconfig's output: exiting early would kill ldconfig with SIGPIPE, and with
# pipefail and set -e that ended this script with status 141, now and then)
LIBGCC=$(ldconfig -p 2> /dev/null | awk '/libgcc_s\.so\.1 .*x86-64/ && !f { print $NF; f = 1 }' || true)
[ -n "$LIBGCC" ] || LIBGCC=/lib/x86_64-linux-gnu/libgcc_s.so.1
add_file "$LIBGCC"

# Soft-RoCE userspace provider and perftest for a sanity check
if [ -r "$RXE_DRIVER" ] && [ -n "$RXE_LIB" ]; then
    add_file "$RXE_DRIVER"
    add_elf "$RXE_LIB"
fi
for t in ib_read_lat ib_write_bw; do
    p=$(command -v "$t" || true)
    [ -z "$p" ] || add_elf "$p" "/usr/bin/$t"
done

# dm-crypt for crypt runs (cryptsetup-bin); libdevmapper makes the /dev/mapper nodes itself
[ -z "$CRYPTSETUP" ] || add_elf "$CRYPTSETUP" /usr/sbin/cryptsetup
# soak runs: netem (tc) and the partition (nft), called by path like ip (busybox has no tc)
[ -z "$TC" ] || add_elf "$TC" /usr/sbin/tc
[ -z "$NFT" ] || add_elf "$NFT" /usr/sbin/nft
[ -z "$CHRT" ] || add_elf "$CHRT" /usr/bin/chrt   # the injector runs real-time
# twohost --etcd: etcd (VM A) and etcdctl (both VMs; ~38 MiB together)
[ -z "$ETCD_BIN" ] || add_elf "$ETCD_BIN" /usr/bin/etcd
[ -z "$ETCDCTL_BIN" ] || add_elf "$ETCDCTL_BIN" /usr/bin/etcdctl
# acct runs: fio (its nbd engine is built in; its libraries are ~80 MiB, so only then)
[ -z "$FIO" ] || add_elf "$FIO" /usr/bin/fio
# app-proxy and acct-proxy: the front nbdkit's nbd plugin (with libnbd)
[ "$has_proxy" = 0 ] || add_elf "$NBDKIT_PLUGINDIR/nbdkit-nbd-plugin.so"
# app runs: redis, and the data set as redis protocol for redis-cli --pipe: APP_KEYS SETs of
# key:%012d (redis-benchmark -r's key names) to APP_VALUE bytes of random base64 text
# (6 bits of entropy per byte, so that zram cannot store it for nothing; fixed seed)
if [ "$has_app" = 1 ]; then
    add_elf "$REDIS_SERVER" /usr/bin/redis-server
    add_elf "$REDIS_CLI" /usr/bin/redis-cli
    add_elf "$REDIS_BENCHMARK" /usr/bin/redis-benchmark
    python3 - "$APP_KEYS" "$APP_VALUE" > "$ROOT/etc/rdmaswap-vm/app-load.resp" <<'PY'
import base64, random, sys
keys, size = int(sys.argv[1]), int(sys.argv[2])
rnd = random.Random(15)
out = sys.stdout.buffer
for i in range(keys):
    k = b"key:%012d" % i
    v = base64.b64encode(rnd.randbytes(size * 3 // 4 + 3))[:size]
    out.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v))
PY
fi

# the project's binaries
[ -x "$B_SWAPLOAD" ] && add_elf "$B_SWAPLOAD" /usr/local/bin/swapload
[ -x "$B_MEMSCAN" ] && add_elf "$B_MEMSCAN" /usr/local/bin/memscan
[ "$has_soak" = 0 ] || add_elf "$B_NBDPROBE" /usr/local/bin/nbdprobe
[ "$has_fence" = 0 ] || add_elf "$B_RDMAFENCE" /usr/local/bin/rdmafence
[ "$has_soak" = 0 ] || add_elf "$B_NBDHISTORY" /usr/local/bin/nbdhistory
if [ "$has_alloc" = 1 ]; then
    add_elf "$B_NBDDRIVE" /usr/local/bin/nbddrive
    add_elf "$B_ALLOC_COUNTER" /usr/local/lib/librdmaswap-alloc-counter.so
fi
if [ "$need_rdmaswap" = 1 ]; then
    add_elf "$B_MEMSERVER" /usr/local/bin/rdmaswap-memserver
    add_elf "$B_CTL" /usr/local/bin/rdmaswapctl
    [ "$has_reconnect" = 0 ] || add_elf "$B_NBD" /usr/local/bin/rdmaswap-nbd
    add_elf "$B_PLUGIN" "$NBDKIT_PLUGINDIR/nbdkit-rdmaswap-plugin.so"
fi
if [ "$want_rdma_tests" = 1 ]; then
    if [ -x "$B_RDMA_TESTS" ]; then
        add_elf "$B_RDMA_TESTS" /usr/local/bin/rdmaswap-rdma-tests
    else
        note "note: $B_RDMA_TESTS not built; the VM will skip the RDMA transport tests"
    fi
fi

# busybox applet links where no real tool was copied
for a in $("$BUSYBOX" --list); do
    [ -e "$ROOT/usr/bin/$a" ] || [ -e "$ROOT/usr/sbin/$a" ] || [ -e "$ROOT/usr/local/bin/$a" ] \
        || ln -s busybox "$ROOT/usr/bin/$a"
done

# kernel modules, in `modprobe --show-depends` order, deduplicated.  Optional ones (a failed insmod
# is no error: aesni_intel needs AES-NI in the virtual CPU) go to a second list.
MODLIST=$ROOT/etc/rdmaswap-vm/modules
OPTLIST=$ROOT/etc/rdmaswap-vm/modules-optional
: > "$MODLIST"
: > "$OPTLIST"
declare -A MODSEEN=()
mods="crc32_generic nbd veth ib_uverbs rdma_ucm rdma_rxe"
[ "$MODE" != twohost ] || mods+=" virtio_pci virtio_net"
[ "$has_crypt" = 0 ] || mods+=" dm-crypt xts"
[ "$has_soak" = 0 ] || mods+=" bridge sch_netem nf_tables"
[ "$has_fence" = 0 ] || mods+=" sch_prio sch_netem cls_u32"
[ "$has_zram" = 0 ] || mods+=" zram"
[ "$has_disk" = 0 ] || mods+=" virtio_pci virtio_blk"
# app-nvme-*: the NVMe-oF target and host over TCP and RDMA (configfs comes with nvmet), and brd
# (one RAM disk of the swap size; the guest removes and loads it again between runs)
[ "$has_nvme" = 0 ] || mods+=" nvmet nvmet-tcp nvmet-rdma nvme-fabrics nvme-tcp nvme-rdma brd"
optmods=""
[ "$has_crypt" = 0 ] || optmods="aesni_intel"
for m in $mods $optmods; do
    list=$MODLIST
    case " $optmods " in *" $m "*) list=$OPTLIST ;; esac
    deps=$("$MODPROBE" -S "$KVER" --show-depends "$m" 2>&1) \
        || die "modprobe -S $KVER --show-depends $m failed: $deps"
    while read -r kind path _; do
        [ "$kind" = insmod ] || continue
        [ -z "${MODSEEN[$path]:-}" ] || continue
        MODSEEN[$path]=1
        dst=$path
        case "$path" in
            *.ko) add_file "$path" ;;
            *.ko.xz) dst=${path%.xz}; mkdir -p "$ROOT$(dirname "$dst")"; xz -dc "$path" > "$ROOT$dst" ;;
            *.ko.zst) dst=${path%.zst}; mkdir -p "$ROOT$(dirname "$dst")"; zstd -qdc "$path" > "$ROOT$dst" ;;
            *.ko.gz) dst=${path%.gz}; mkdir -p "$ROOT$(dirname "$dst")"; gzip -dc "$path" > "$ROOT$dst" ;;
            *) die "unexpected module file $path" ;;
        esac
        params=""
        [ "$m" = nbd ] && [ "${path##*/}" = nbd.ko ] && params="nbds_max=2 max_part=0"
        if [ "$m" = brd ] && [ "${path##*/}" = brd.ko ]; then
            case "$APP_SWAP" in
                *G) params="rd_nr=1 rd_size=$((${APP_SWAP%G} * 1024 * 1024))" ;;
                *M) params="rd_nr=1 rd_size=$((${APP_SWAP%M} * 1024))" ;;
            esac
        fi
        echo "$dst $params" >> "$list"
    done <<< "$deps"
done

# settings for the guest
SWAPLOAD_ARGS=$SWAPLOAD_EXTRA
[ "$REWRITE" = 0 ] || SWAPLOAD_ARGS="--rewrite${SWAPLOAD_ARGS:+ $SWAPLOAD_ARGS}"
PEER_WAIT=$((TIMEOUT - 60))
cat > "$ROOT/etc/rdmaswap-vm.conf" <<EOF
MODE=$MODE
RUNS="$RUNS"
ETCD=$ETCD
MIB=$MIB
CG_MAX=$CG_MAX
CAPACITY=$CAPACITY
PRESSURE_EXTRA=$PRESSURE_EXTRA
PEER_WAIT=$PEER_WAIT
PREFILL=$PREFILL
PLUGIN_ARGS="$PLUGIN_ARGS"
REALTIME=$REALTIME
PASSES=$PASSES
REP_REPLICAS=$REPLICAS
REA_LEASE=$REA_LEASE
REA_VOLUME2="$REA_VOLUME2"
REC_SKIP=$REC_SKIP
ALLOC_REQUESTS=$ALLOC_REQUESTS
SWAPLOAD_ARGS="$SWAPLOAD_ARGS"
MIN_PSWPOUT=$MIN_PSWPOUT
CONNS=$CONNS
KILL_TRANSPORT=$KILL_TRANSPORT
NBDKIT_STATS=$STATS
SOAK_SECONDS=$SOAK_SECONDS
SOAK_SEED=$SOAK_SEED
SOAK_PLUGIN_TIMEOUT=$SOAK_PLUGIN_TIMEOUT
SOAK_MIB=$SOAK_MIB
ACCT_SECONDS=$ACCT_SECONDS
${ACCT_ROWS:+ACCT_ROWS="$ACCT_ROWS"}
APP_KEYS=$APP_KEYS
APP_REQUESTS=$APP_REQUESTS
APP_CLIENTS=$APP_CLIENTS
APP_LEVELS="${APP_LEVELS//,/ }"
APP_SWAP=$APP_SWAP
EOF
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$ROOT/etc/passwd"
printf 'root:x:0:\n' > "$ROOT/etc/group"
install -m 0755 "$GUEST_INIT" "$ROOT/init"
mkdir -p "$ROOT/guest/scenarios"
install -m 0644 "$GUEST_DIR"/*.sh "$ROOT/guest/"
install -m 0644 "$GUEST_DIR"/scenarios/*.sh "$ROOT/guest/scenarios/"
# The cluster key (one initramfs, so both VMs of twohost share it), mode 0600 as demanded.
mkdir -p "$ROOT/etc/rdmaswap"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$ROOT/etc/rdmaswap/auth.key")
# The donors' CA and its (empty) revocation list, likewise shared: guest-init.sh issues each
# memserver's certificate with it, and gives the plugins donor-ca= and donor-crl=.
if [ "$need_rdmaswap" = 1 ]; then
    "$B_CTL" ca create "$ROOT/etc/rdmaswap/donor-ca.key" > /dev/null || die "rdmaswapctl ca create"
    "$B_CTL" crl create "ca-key=$ROOT/etc/rdmaswap/donor-ca.key" \
        "crl=$ROOT/etc/rdmaswap/donor-ca.crl" > /dev/null || die "rdmaswapctl crl create"
fi
mknod -m 0600 "$ROOT/dev/console" c 5 1 2> /dev/null || true

MODE_LABEL=$MODE   # for the messages
[ "$ETCD" = 0 ] || MODE_LABEL="$MODE --etcd"
INITRD=$WORK/initramfs.cpio
(cd "$ROOT" && find . -print0 | LC_ALL=C sort -z | "$CPIO" --null -o -H newc -R 0:0 --quiet) > "$INITRD"
note "kernel $KERNEL, initramfs $(du -m "$INITRD" | cut -f1) MiB, $(wc -l < "$MODLIST") modules," \
    "mode $MODE_LABEL${RUNS:+ ($RUNS)}, mib $MIB, ${MEM} MiB RAM, timeout ${TIMEOUT}s"
[ "$has_soak" = 0 ] || note "soak: $SOAK_SECONDS s, seed $SOAK_SEED (--soak-seed $SOAK_SEED replays the faults)"

# ----- boot ------------------------------------------------------------------------------------------
# free_port: a TCP port nobody on this machine uses now
free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$((20000 + RANDOM % 40000))
        if [ -z "$(ss -Htan "( sport = :$p or dport = :$p )" 2> /dev/null)" ]; then
            echo "$p"
            return 0
        fi
    done
    die "no free TCP port found"
}
# One VM, or (twohost) two: "server" (VM A, listens on the socket netdev) and "client" (VM B).
declare -A VM_LOG=() VM_RC=()
VM_NAMES=()
if [ "$MODE" = twohost ]; then
    VM_NAMES=(server client)
    case "$LOG" in
        *.log) VM_LOG[server]=${LOG%.log}-server.log ;;
        *) VM_LOG[server]=$LOG-server ;;
    esac
    VM_LOG[client]=$LOG
    [ -n "$PORT" ] || PORT=$(free_port)
    note "twohost: socket netdev on 127.0.0.1:$PORT; VM A (server) log ${VM_LOG[server]}, VM B (client) log ${VM_LOG[client]}"
else
    VM_NAMES=(vm)
    VM_LOG[vm]=$LOG
fi

# start_vm NAME EXTRA-KERNEL-ARGS QEMU-ARGS...: qemu under timeout, in the background
# A VM still running SYSRQ_BEFORE seconds before its time-out gets SysRq w, m, l and t through
# qemu's monitor (a TCP port on the loopback): blocked tasks, memory, CPUs and every task's stack
# land on the console, which tells a hang apart from slowness.
sysrq_dump() {
    local port=$1 k
    exec 3<> "/dev/tcp/127.0.0.1/$port" || return 0
    for k in w m l t; do
        echo "sendkey alt-sysrq-$k" >&3 || break
        sleep 5
    done
    exec 3>&-
}
# start_vm NAME EXTRA-KERNEL-ARGS QEMU-ARGS...: qemu under timeout, in the background
start_vm() {
    local name=$1 kargs=$2 mport
    shift 2
    : > "${VM_LOG[$name]}"
    mport=$(free_port) || die "no free TCP port for qemu's monitor"
    timeout -k 10 "$TIMEOUT" "$QEMU" -accel tcg -cpu max -smp "$SMP" -m "$MEM" \
        -nographic -nic none -no-reboot \
        -monitor "tcp:127.0.0.1:$mport,server=on,wait=off" \
        -kernel "$KERNEL" -initrd "$INITRD" \
        -append "console=ttyS0 panic=-1 oops=panic loglevel=5 mitigations=off$kargs" \
        "$@" < /dev/null > "${VM_LOG[$name]}" 2>&1 &
    QPIDS[$name]=$!
    if [ "$SYSRQ_BEFORE" -gt 0 ] && [ "$TIMEOUT" -gt $((SYSRQ_BEFORE + 10)) ]; then
        (
            # stop_watchers kills this sleep, then this subshell: without the exit it could
            # still print the note in between (seen after a VM that had finished in 62 s)
            sleep $((TIMEOUT - SYSRQ_BEFORE)) || exit 0
            note "VM $name still running $SYSRQ_BEFORE s before its time-out: SysRq w, m, l, t to its console"
            sysrq_dump "$mport"
        ) > /dev/null &
        WATCHERS+=($!)
    fi
}

START=$(date +%s.%N)
set +e
if [ "$MODE" = twohost ]; then
    start_vm server " rdmaswap.role=server" \
        -netdev "socket,id=n0,listen=127.0.0.1:$PORT" \
        -device virtio-net-pci,netdev=n0,mac=52:54:00:77:00:01
    # the client's qemu connects at start: wait (bounded) until the server's qemu listens
    listening=0
    for _ in $(seq 1 100); do
        if [ -n "$(ss -Htln "( sport = :$PORT )" 2> /dev/null)" ]; then listening=1; break; fi
        kill -0 "${QPIDS[server]}" 2> /dev/null || break
        sleep 0.2
    done
    if [ "$listening" = 1 ]; then
        start_vm client " rdmaswap.role=client" \
            -netdev "socket,id=n0,connect=127.0.0.1:$PORT" \
            -device virtio-net-pci,netdev=n0,mac=52:54:00:77:00:02
    else
        note "the server VM's qemu does not listen on 127.0.0.1:$PORT; not starting the client VM"
        VM_RC[client]=noboot
    fi
else
    # app-disk runs: a virtio disk on a sparse file in the temp dir, /dev/vda in the guest
    # (qemu's default cache=writeback: the host's page cache is in front of it)
    vm_extra=()
    if [ "$has_disk" = 1 ]; then
        truncate -s "$APP_SWAP" "$WORK/appdisk.img"
        vm_extra=(-drive "file=$WORK/appdisk.img,if=virtio,format=raw")
    fi
    start_vm vm "" "${vm_extra[@]}"
fi
if [ "$VERBOSE" = 1 ]; then
    # follow the last VM to finish (twohost: the server, which waits for the client)
    logs=()
    for n in "${VM_NAMES[@]}"; do logs+=("${VM_LOG[$n]}"); done
    tail -n +1 -f --pid="${QPIDS[${VM_NAMES[0]}]}" "${logs[@]}" &
    TAILPID=$!
fi
for n in "${VM_NAMES[@]}"; do
    [ -n "${QPIDS[$n]:-}" ] || continue
    wait "${QPIDS[$n]}"
    VM_RC[$n]=$?
    unset "QPIDS[$n]"
done
set -e
stop_watchers
if [ -n "$TAILPID" ]; then
    wait "$TAILPID" 2> /dev/null || true
    TAILPID=""
fi
SECS=$(awk -v a="$START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

# ----- verdict -----------------------------------------------------------------------------------------
# judge NAME: sets VERDICT (empty: pass) from the VM's console log and qemu's exit status
judge() {
    local name=$1 qrc=${VM_RC[$1]} txt=$WORK/console-$1.txt bad result
    VERDICT=""
    # the console may carry \r; kernel lines start with a printk timestamp
    tr -d '\r' < "${VM_LOG[$name]}" > "$txt"
    bad=$(grep -E '^\[ *[0-9]+\.[0-9]+\] .*(WARNING:|BUG:|blocked for more than|Oops|general protection fault|Kernel panic|Out of memory)' \
        "$txt" | head -n 3 || true)
    result=$(grep -ao 'RDMASWAP-VM-RESULT: .*' "$txt" | tail -n 1 || true)
    if [ "$qrc" = noboot ]; then
        VERDICT="not started"
    elif [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
        VERDICT="timeout: the VM did not finish within ${TIMEOUT}s"
    elif [ -z "$result" ]; then
        VERDICT="no result line from the guest (qemu exit $qrc)"
    elif [ "$result" != "RDMASWAP-VM-RESULT: PASS" ]; then
        VERDICT="guest: ${result#RDMASWAP-VM-RESULT: }"
    elif [ -n "$bad" ]; then
        VERDICT="kernel warning on the console: $bad"
    fi
    if [ -n "$VERDICT" ] && [ -n "$bad" ] && [[ "$VERDICT" != *"$bad"* ]]; then
        VERDICT="$VERDICT; kernel: $(head -n 1 <<< "$bad")"
    fi
}

failed=()
for n in "${VM_NAMES[@]}"; do
    judge "$n"
    label=""
    [ "$MODE" != twohost ] || label="[$n] "
    if [ -z "$VERDICT" ]; then
        if [ "$VERBOSE" != 1 ]; then
            [ "$MODE" != twohost ] || echo "===== VM $n (${VM_LOG[$n]}) ====="
            # the guest's own output (from its first line on)
            sed -n '/^vm: guest up/,$p' "$WORK/console-$n.txt"
        fi
        grep -a '^RDMASWAP-VM-BENCH:' "$WORK/console-$n.txt" | sed 's/^RDMASWAP-VM-BENCH: //' || true
        grep -a '^RDMASWAP-VM-SOAK:' "$WORK/console-$n.txt" | sed 's/^RDMASWAP-VM-SOAK: /soak: /' || true
        grep -a '^RDMASWAP-VM-ACCT:' "$WORK/console-$n.txt" | sed 's/^RDMASWAP-VM-ACCT: /acct: /' || true
        grep -a '^RDMASWAP-VM-APP:' "$WORK/console-$n.txt" | sed 's/^RDMASWAP-VM-APP: /app: /' || true
    else
        failed+=("$label$VERDICT")
        if [ "$VERBOSE" != 1 ]; then
            echo "----- last 120 lines of the VM console (${VM_LOG[$n]}) -----"
            tail -n 120 "$WORK/console-$n.txt"
            echo "----- end of console -----"
        fi
        grep -a '^RDMASWAP-VM-SOAK:' "$WORK/console-$n.txt" | sed 's/^RDMASWAP-VM-SOAK: /soak: /' || true
    fi
done
if [ ${#failed[@]} = 0 ]; then
    note "PASS: mode $MODE_LABEL${RUNS:+ ($RUNS)} in ${SECS}s (log: ${VM_LOG[*]})"
    exit 0
fi
note "FAIL: $(printf '%s; ' "${failed[@]}")(mode $MODE_LABEL, ${SECS}s, log: ${VM_LOG[*]})"
exit 1
