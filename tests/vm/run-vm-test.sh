#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Boot the Debian kernel in a qemu TCG VM with a generated busybox initramfs and test swap over NBD:
# nbd-client -swap -> nbdkit (rdmaswap plugin, or the memory plugin as baseline) -> memserver over
# TCP or Soft-RoCE, all inside the one VM.  The guest side is guest-init.sh (copied in as /init).
#
# Exit: 0 pass, 1 fail (guest FAIL line, time-out, kernel warning, missing binary), 77 skip (no qemu
# or no Debian kernel with modules).  See tests/vm/README.md.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: run-vm-test.sh [--mode rdma|tcp|memory|kill] [--bench] [--mib N] [--keep] [options]

  --mode M          rdma (default): rdmaswap over Soft-RoCE, plus rdmaswap-rdma-tests
                    tcp: rdmaswap over TCP;  memory: nbdkit memory plugin (harness baseline)
                    kill: kill -9 the memserver under a live /dev/nbd0, expect EIO, no hang
  --bench           one boot, the swap workload over rdma, tcp and memory; prints a table
  --bench-modes L   comma-separated subset/order for --bench (default rdma,tcp,memory)
  --mib N           swapload working set in MiB (default 256; cgroup memory.max is 64M)
  --passes P        swapload verify passes (default 2)
  --rewrite         swapload rewrites every page in each pass (more swap-out traffic)
  --swapload-args S extra swapload arguments (e.g. "--inject zero" to see a FAIL)
  --min-pswpout N   pages of pswpout required (default N*200, i.e. 200 MiB for 256 MiB)
  --conns N         nbd-client -C N (default 1)
  --kill-transport T  transport of --mode kill: rdma (default) or tcp
  --stats           put nbdkit's stats filter in front of the plugin and print its report
  --timeout S       wall-clock limit for the VM (default 600 s; --bench: 200 + 450 per mode)
  --mem MIB         VM memory (default 2048)
  --smp N           VM CPUs (default 2)
  --log FILE        serial console log (default $RDMASWAP_BUILD/vm-test-logs/<mode>.log)
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
MIB=256
PASSES=2
REWRITE=0
SWAPLOAD_EXTRA=""
MIN_PSWPOUT=""
CONNS=1
KILL_TRANSPORT=rdma
STATS=0
TIMEOUT=""
MEM=2048
SMP=2
LOG=""
KEEP=0
FORCE=0
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
        --mib) MIB=${2:?}; shift ;;
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

case "$MODE" in rdma|tcp|memory|kill) ;; *) die "--mode must be rdma, tcp, memory or kill" ;; esac
case "$KILL_TRANSPORT" in rdma|tcp) ;; *) die "--kill-transport must be rdma or tcp" ;; esac
if [ -z "$TIMEOUT" ]; then
    TIMEOUT=600
    if [ "$BENCH" = 1 ]; then
        n=$(wc -w <<< "${BENCH_MODES//,/ }")
        TIMEOUT=$((200 + 450 * n))
    fi
fi
for v in MIB PASSES CONNS TIMEOUT MEM SMP; do
    is_uint "${!v}" && [ "${!v}" -gt 0 ] || die "--${v,,} needs a positive integer"
done
[ "$MIB" -gt 80 ] || die "--mib must be above 80: the workload cgroup's memory.max is 64M"
[ -z "$MIN_PSWPOUT" ] || is_uint "$MIN_PSWPOUT" || die "--min-pswpout needs an integer"
[ -n "$MIN_PSWPOUT" ] || MIN_PSWPOUT=$((MIB * 200))
if [ "$BENCH" = 1 ]; then
    MODE=bench
    BENCH_MODES=${BENCH_MODES//,/ }
    for m in $BENCH_MODES; do
        case "$m" in rdma|tcp|memory) ;; *) die "--bench-modes: unknown mode '$m'" ;; esac
    done
fi
[ -n "$VERBOSE" ] || { if [ -t 1 ]; then VERBOSE=1; else VERBOSE=0; fi; }

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST_INIT=$SCRIPT_DIR/guest-init.sh
[ -r "$GUEST_INIT" ] || die "missing $GUEST_INIT"

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
need_cmd timeout coreutils > /dev/null
need_cmd ldd libc-bin > /dev/null

[ -n "${RDMASWAP_BUILD:-}" ] || die "RDMASWAP_BUILD (the meson build directory) is not set"
[ -d "$RDMASWAP_BUILD" ] || die "RDMASWAP_BUILD=$RDMASWAP_BUILD is not a directory"
RDMASWAP_BUILD=$(cd "$RDMASWAP_BUILD" && pwd)

B_SWAPLOAD=$RDMASWAP_BUILD/tests/vm/swapload
B_MEMSERVER=$RDMASWAP_BUILD/memserver/rdmaswap-memserver
B_PLUGIN=$RDMASWAP_BUILD/nbdkit-plugin/nbdkit-rdmaswap-plugin.so
B_CTL=$RDMASWAP_BUILD/tools/rdmaswapctl
B_RDMA_TESTS=$RDMASWAP_BUILD/tests/rdma/rdmaswap-rdma-tests

# What the chosen mode needs.
need_swapload=0 need_rdmaswap=0 need_rdma=0 want_rdma_tests=0
case "$MODE" in
    memory) need_swapload=1 ;;
    tcp) need_swapload=1; need_rdmaswap=1 ;;
    rdma) need_swapload=1; need_rdmaswap=1; need_rdma=1; want_rdma_tests=1 ;;
    kill) need_rdmaswap=1; [ "$KILL_TRANSPORT" = tcp ] || need_rdma=1 ;;
    bench)
        need_swapload=1
        for m in $BENCH_MODES; do
            case "$m" in
                tcp) need_rdmaswap=1 ;;
                rdma) need_rdmaswap=1; need_rdma=1 ;;
            esac
        done
        ;;
esac
missing=()
[ "$need_swapload" = 0 ] || [ -x "$B_SWAPLOAD" ] || missing+=("$B_SWAPLOAD")
if [ "$need_rdmaswap" = 1 ]; then
    [ -x "$B_MEMSERVER" ] || missing+=("$B_MEMSERVER")
    [ -f "$B_PLUGIN" ] || missing+=("$B_PLUGIN")
    [ -x "$B_CTL" ] || missing+=("$B_CTL")
fi
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
QPID=""
TAILPID=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$TAILPID" ]; then kill "$TAILPID" 2> /dev/null || true; fi
    if [ -n "$QPID" ] && kill -0 "$QPID" 2> /dev/null; then
        # $QPID is timeout(1); its child is qemu.  TERM is passed on, KILL would not be.
        local kids
        kids=$(pgrep -P "$QPID" 2> /dev/null || true)
        kill -TERM "$QPID" 2> /dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$QPID" 2> /dev/null || break
            sleep 0.5
        done
        # shellcheck disable=SC2086
        kill -KILL $kids "$QPID" 2> /dev/null || true
    fi
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
LIBGCC=$(ldconfig -p 2> /dev/null | awk '/libgcc_s\.so\.1 .*x86-64/ { print $NF; exit }')
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

# the project's binaries
[ -x "$B_SWAPLOAD" ] && add_elf "$B_SWAPLOAD" /usr/local/bin/swapload
if [ "$need_rdmaswap" = 1 ]; then
    add_elf "$B_MEMSERVER" /usr/local/bin/rdmaswap-memserver
    add_elf "$B_CTL" /usr/local/bin/rdmaswapctl
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

# kernel modules, in `modprobe --show-depends` order, deduplicated
MODLIST=$ROOT/etc/rdmaswap-vm/modules
: > "$MODLIST"
declare -A MODSEEN=()
for m in crc32_generic nbd veth ib_uverbs rdma_ucm rdma_rxe; do
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
        echo "$dst $params" >> "$MODLIST"
    done <<< "$deps"
done

# settings for the guest
SWAPLOAD_ARGS=$SWAPLOAD_EXTRA
[ "$REWRITE" = 0 ] || SWAPLOAD_ARGS="--rewrite${SWAPLOAD_ARGS:+ $SWAPLOAD_ARGS}"
cat > "$ROOT/etc/rdmaswap-vm.conf" <<EOF
MODE=$MODE
BENCH_MODES="$BENCH_MODES"
MIB=$MIB
PASSES=$PASSES
SWAPLOAD_ARGS="$SWAPLOAD_ARGS"
MIN_PSWPOUT=$MIN_PSWPOUT
CONNS=$CONNS
KILL_TRANSPORT=$KILL_TRANSPORT
NBDKIT_STATS=$STATS
EOF
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$ROOT/etc/passwd"
printf 'root:x:0:\n' > "$ROOT/etc/group"
install -m 0755 "$GUEST_INIT" "$ROOT/init"
mknod -m 0600 "$ROOT/dev/console" c 5 1 2> /dev/null || true

INITRD=$WORK/initramfs.cpio
(cd "$ROOT" && find . -print0 | LC_ALL=C sort -z | "$CPIO" --null -o -H newc -R 0:0 --quiet) > "$INITRD"
note "kernel $KERNEL, initramfs $(du -m "$INITRD" | cut -f1) MiB, $(wc -l < "$MODLIST") modules," \
    "mode $MODE$([ "$MODE" = bench ] && echo " ($BENCH_MODES)"), mib $MIB, timeout ${TIMEOUT}s"

# ----- boot ------------------------------------------------------------------------------------------
: > "$LOG"
START=$(date +%s.%N)
set +e
timeout -k 10 "$TIMEOUT" "$QEMU" -accel tcg -cpu max -smp "$SMP" -m "$MEM" \
    -nographic -nic none -no-reboot \
    -kernel "$KERNEL" -initrd "$INITRD" \
    -append "console=ttyS0 panic=-1 oops=panic loglevel=5 mitigations=off" \
    < /dev/null > "$LOG" 2>&1 &
QPID=$!
if [ "$VERBOSE" = 1 ]; then
    tail -n +1 -f --pid="$QPID" "$LOG" &
    TAILPID=$!
fi
wait "$QPID"
QRC=$?
QPID=""
set -e
if [ -n "$TAILPID" ]; then
    wait "$TAILPID" 2> /dev/null || true
    TAILPID=""
fi
SECS=$(awk -v a="$START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

# ----- verdict -----------------------------------------------------------------------------------------
# the console may carry \r; kernel lines start with a printk timestamp
tr -d '\r' < "$LOG" > "$WORK/console.txt"
BAD_KERNEL=$(grep -E '^\[ *[0-9]+\.[0-9]+\] .*(WARNING:|BUG:|blocked for more than|Oops|general protection fault|Kernel panic)' \
    "$WORK/console.txt" | head -n 3 || true)
RESULT=$(grep -ao 'RDMASWAP-VM-RESULT: .*' "$WORK/console.txt" | tail -n 1 || true)

verdict=""
if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    verdict="timeout: the VM did not finish within ${TIMEOUT}s"
elif [ -z "$RESULT" ]; then
    verdict="no result line from the guest (qemu exit $QRC)"
elif [ "$RESULT" != "RDMASWAP-VM-RESULT: PASS" ]; then
    verdict="guest: ${RESULT#RDMASWAP-VM-RESULT: }"
elif [ -n "$BAD_KERNEL" ]; then
    verdict="kernel warning on the console: $BAD_KERNEL"
fi

if [ -z "$verdict" ]; then
    if [ "$VERBOSE" != 1 ]; then
        # the guest's own output (from its first line on)
        sed -n '/^vm: guest up/,$p' "$WORK/console.txt"
    fi
    grep -a '^RDMASWAP-VM-BENCH:' "$WORK/console.txt" | sed 's/^RDMASWAP-VM-BENCH: //' || true
    note "PASS: mode $MODE in ${SECS}s (log: $LOG)"
    exit 0
fi
if [ "$VERBOSE" != 1 ]; then
    echo "----- last 120 lines of the VM console ($LOG) -----"
    tail -n 120 "$WORK/console.txt"
    echo "----- end of console -----"
fi
note "FAIL: $verdict (mode $MODE, ${SECS}s, log: $LOG)"
exit 1
