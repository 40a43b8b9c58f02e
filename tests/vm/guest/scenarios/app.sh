# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# app-B (issue 15, the application table; bench/apptable.sh): redis-server (no persistence) in a
# cgroup, swapping to B: rdma or tcp (rdmaswap over Soft-RoCE or TCP on /dev/nbd0), proxy
# (nbdkit's nbd plugin on /dev/nbd0 forwarding over TCP to an nbdkit memory plugin on this VM's
# address: a remote RAM disk over NBD without rdmaswap), nvme-tcp or nvme-rdma (the kernel's
# NVMe-oF target, nvmet, exporting a brd RAM disk /dev/ram0 on this VM's address, and the
# kernel's NVMe-oF host connected to it over TCP or over the Soft-RoCE device: /dev/nvmeXn1),
# memory (nbdkit's memory plugin on /dev/nbd0), zram (/dev/zram0) or disk (/dev/vda, a virtio
# disk on a host file).  APP_KEYS keys of random base64 text are loaded with redis-cli --pipe;
# the cgroup's memory.current then is the working set W; for each level L of APP_LEVELS
# memory.max is set to L % of W and redis-benchmark measures GET throughput and latency
# (uniformly random keys).  The values of APP_SAMPLE keys read after the load and after the
# last level must agree, and pages must have been swapped out below 100 %.
# Lines "RDMASWAP-VM-APP: row B L LIMIT_KIB RPS AVG_MS P50_MS P99_MS MAX_MS PSWPIN PSWPOUT SECS"
# and "RDMASWAP-VM-APP: ws B RSS_KIB CURRENT_KIB KEYS".
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

APP_CG=/sys/fs/cgroup/apptable
APP_LOAD=/etc/rdmaswap-vm/app-load.resp
REDIS_PID=""
APP_BACK_PID=""        # proxy: the nbdkit memory plugin the front nbdkit's nbd plugin forwards to
APP_BACK_PIDFILE=/run/nbdkit-back.pid
APP_BACK_LOG=/run/nbdkit-back.log
APP_NVMET=/sys/kernel/config/nvmet
APP_NQN=nqn.2026-11.org.rdmaswap:apptable   # nvme-tcp/-rdma: the target's subsystem
APP_NVME_SVC=4420      # nvme-tcp/-rdma: the target port's trsvcid
APP_NVME_CTRL=""       # nvme-tcp/-rdma: the host's controller (/sys/class/nvme/nvmeX)

redis_up() { redis-cli -p 6379 ping 2>/dev/null | grep -q PONG; }
cg_value() { sed -n "s/^$2 //p" "$APP_CG/$1"; }   # cg_value FILE KEY
app_cg_gone() { rmdir "$APP_CG" 2>/dev/null || [ ! -d "$APP_CG" ]; }

# app_fail MESSAGE: fail, with the logs of the proxy's back end and of the NVMe-oF set-up first
app_fail() {
    file_tail "$APP_BACK_LOG" 30 "back-end nbdkit log (proxy)"
    file_tail /run/nvme-connect.log 10 "NVMe-oF connect"
    [ ! -d "$APP_NVMET" ] || { echo "----- $APP_NVMET -----"; find "$APP_NVMET" 2>/dev/null | head -n 40; }
    fail "$@"
}

# proxy: nbdkit's memory plugin as the "remote" side, on this VM's address and the memserver's
# port (where the tcp backend's memserver listens), with the memory backend's flags (--swap,
# allocator=malloc,mlock=true: allocated and locked at start, like the memserver's capacity).
# app_back_start [SIZE]: SIZE defaults to APP_SWAP
app_back_start() {
    _bsize=${1:-$APP_SWAP}
    rm -f "$APP_BACK_PIDFILE"
    : > "$APP_BACK_LOG"
    say "[$CUR] starting the back end: nbdkit --swap -f -i $ADDR -p $PORT memory $_bsize allocator=malloc,mlock=true"
    # shellcheck disable=SC3045  # busybox ash has ulimit -s
    (ulimit -s 1024; exec nbdkit --swap -f --log=stderr -P "$APP_BACK_PIDFILE" -i "$ADDR" -p "$PORT" \
        memory "$_bsize" allocator=malloc,mlock=true) >> "$APP_BACK_LOG" 2>&1 &
    APP_BACK_PID=$!
    echo -1000 > "/proc/$APP_BACK_PID/oom_score_adj" 2>/dev/null
    # nbdkit writes its pidfile once it listens
    # shellcheck disable=SC2016  # eval expands them
    wait_until 60 eval 'test -s "$APP_BACK_PIDFILE" || ! alive $APP_BACK_PID' \
        || app_fail "[$CUR] the back-end nbdkit wrote no pidfile within 60 s"
    alive "$APP_BACK_PID" || { wait "$APP_BACK_PID"; _rc=$?; APP_BACK_PID=""; app_fail "[$CUR] the back-end nbdkit failed to start (exit $_rc)"; }
    _lck=$(proc_status_kib "$APP_BACK_PID" VmLck)
    _rss=$(proc_status_kib "$APP_BACK_PID" VmRSS)
    say "[$CUR] back-end nbdkit pid $APP_BACK_PID on $ADDR:$PORT: VmLck ${_lck:-?} kB, VmRSS ${_rss:-?} kB"
    if [ -z "$_lck" ] || [ -z "$_rss" ] || [ $((_lck * 10)) -lt $((_rss * 9)) ]; then
        app_fail "[$CUR] the back-end nbdkit is not locked in memory: VmLck ${_lck:-?} kB, VmRSS ${_rss:-?} kB"
    fi
}

app_back_stop() {
    [ -n "$APP_BACK_PID" ] || return 0
    term_within 30 "$APP_BACK_PID" || app_fail "[$CUR] the back-end nbdkit did not exit within 30 s of SIGTERM"
    wait "$APP_BACK_PID" 2>/dev/null
    APP_BACK_PID=""
    say "[$CUR] back-end nbdkit stopped"
}

# nvme-tcp/-rdma: the kernel's NVMe-oF target (nvmet) exports a brd RAM disk of APP_SWAP on this
# VM's address (veth0's, where rxe0 sits), and the kernel's NVMe-oF host connects to it over
# transport T (tcp or rdma); sets SWAPDEV to the namespace's block device and APP_NVME_CTRL.
app_brd_ready() { [ -b /dev/ram0 ]; }
app_brd_gone() { [ ! -e /sys/block/ram0 ]; }
app_nvme_ctrl_gone() { [ ! -e "$APP_NVME_CTRL" ]; }
# app_nvme_ns: the namespace's block device of our subsystem (the multipath head nvmeXnY;
# not the hidden path devices nvmeXcYnZ), printed as its name
app_nvme_ns() {
    for _d in /sys/block/nvme*n*; do
        [ -e "$_d" ] || continue
        case "${_d##*/}" in nvme*c*n*) continue ;; esac
        [ "$(cat "$_d/device/subsysnqn" 2>/dev/null)" = "$APP_NQN" ] || continue
        [ -b "/dev/${_d##*/}" ] || continue
        echo "${_d##*/}"
        return 0
    done
    return 1
}
app_nvme_on() {   # app_nvme_on tcp|rdma
    _kib=$(size_kib "$APP_SWAP")
    # brd: loaded at boot with rd_nr=1 rd_size=APP_SWAP in KiB (run-vm-test.sh's module list);
    # a previous NVMe-oF run removed it to free its pages: loaded again, with the same line
    if ! app_brd_ready; then
        _brd=$(grep '/brd\.ko' /etc/rdmaswap-vm/modules /etc/rdmaswap-vm/modules-optional 2>/dev/null | head -n 1 | cut -d: -f2-)
        [ -n "$_brd" ] || app_fail "[$CUR] brd.ko is not in the image's module list"
        # shellcheck disable=SC2086
        insmod $_brd || app_fail "[$CUR] insmod $_brd failed"
        wait_until 10 app_brd_ready || app_fail "[$CUR] no /dev/ram0 after insmod brd"
    fi
    [ "$(($(cat /sys/block/ram0/size) / 2))" = "$_kib" ] \
        || app_fail "[$CUR] /dev/ram0 has $(($(cat /sys/block/ram0/size) / 2)) KiB, expected $_kib (brd rd_size)"
    grep -q ' /sys/kernel/config configfs ' /proc/mounts \
        || mount -t configfs none /sys/kernel/config || app_fail "[$CUR] cannot mount configfs"
    [ -d "$APP_NVMET/subsystems" ] || app_fail "[$CUR] no $APP_NVMET/subsystems (module nvmet not loaded?)"
    [ -c /dev/nvme-fabrics ] || app_fail "[$CUR] no /dev/nvme-fabrics (module nvme-fabrics not loaded?)"
    _s=$APP_NVMET/subsystems/$APP_NQN
    _p=$APP_NVMET/ports/1
    say "[$CUR] nvmet: subsystem $APP_NQN (allow_any_host), namespace 1 on /dev/ram0," \
        "port 1 $1 ipv4 $ADDR:$APP_NVME_SVC"
    { mkdir "$_s" && echo 1 > "$_s/attr_allow_any_host" && mkdir "$_s/namespaces/1" \
        && echo /dev/ram0 > "$_s/namespaces/1/device_path" && echo 1 > "$_s/namespaces/1/enable"; } \
        || app_fail "[$CUR] cannot set up the nvmet subsystem $_s"
    { mkdir "$_p" && echo "$1" > "$_p/addr_trtype" && echo ipv4 > "$_p/addr_adrfam" \
        && echo "$ADDR" > "$_p/addr_traddr" && echo "$APP_NVME_SVC" > "$_p/addr_trsvcid" \
        && ln -s "$_s" "$_p/subsystems/$APP_NQN"; } \
        || app_fail "[$CUR] cannot set up the nvmet port $_p ($1)"
    # the host: what `nvme connect -t T -a ADDR -s 4420 -n NQN` writes (no nvme-cli in the VM)
    _t0=$(uptime_s)
    # shellcheck disable=SC2016
    run_bounded 60 /run/nvme-connect.log sh -c 'echo "$1" > /dev/nvme-fabrics' sh \
        "transport=$1,traddr=$ADDR,trsvcid=$APP_NVME_SVC,nqn=$APP_NQN" \
        || app_fail "[$CUR] NVMe-oF connect over $1 to $ADDR:$APP_NVME_SVC failed: $(cat /run/nvme-connect.log)"
    APP_NVME_CTRL=""
    for _c in /sys/class/nvme/nvme*; do
        [ "$(cat "$_c/subsysnqn" 2>/dev/null)" = "$APP_NQN" ] && APP_NVME_CTRL=$_c
    done
    [ -n "$APP_NVME_CTRL" ] || app_fail "[$CUR] no controller in /sys/class/nvme for $APP_NQN after connect"
    [ "$(cat "$APP_NVME_CTRL/transport")" = "$1" ] \
        || app_fail "[$CUR] ${APP_NVME_CTRL##*/}: transport $(cat "$APP_NVME_CTRL/transport"), expected $1"
    wait_until 30 app_nvme_ns > /dev/null \
        || { ls /sys/block /sys/class/nvme/* 2>&1; app_fail "[$CUR] no namespace block device of $APP_NQN within 30 s"; }
    SWAPDEV=/dev/$(app_nvme_ns)
    _nk=$(($(cat "/sys/block/${SWAPDEV#/dev/}/size") / 2))
    say "[$CUR] ${APP_NVME_CTRL##*/} connected in $(elapsed "$_t0" "$(uptime_s)") s:" \
        "$(cat "$APP_NVME_CTRL/transport") $(tr '\n' ' ' < "$APP_NVME_CTRL/address")state $(cat "$APP_NVME_CTRL/state");" \
        "$SWAPDEV $_nk KiB"
    [ "$_nk" = "$_kib" ] || app_fail "[$CUR] $SWAPDEV has $_nk KiB, expected $_kib"
}
# app_nvme_off: after swapoff: the host's controller deleted, then the target's configfs entries
# in the reverse order of their creation, and brd removed (its pages freed)
app_nvme_off() {
    echo 1 > "$APP_NVME_CTRL/delete_controller" || app_fail "[$CUR] cannot delete ${APP_NVME_CTRL##*/}"
    wait_until 30 app_nvme_ctrl_gone || app_fail "[$CUR] ${APP_NVME_CTRL##*/} still there 30 s after delete_controller"
    APP_NVME_CTRL=""
    _s=$APP_NVMET/subsystems/$APP_NQN
    _p=$APP_NVMET/ports/1
    { rm "$_p/subsystems/$APP_NQN" && rmdir "$_p" && echo 0 > "$_s/namespaces/1/enable" \
        && rmdir "$_s/namespaces/1" && rmdir "$_s"; } || app_fail "[$CUR] cannot remove the nvmet configuration"
    rmmod brd || app_fail "[$CUR] rmmod brd failed"
    wait_until 10 app_brd_gone || app_fail "[$CUR] /dev/ram0 still there after rmmod brd"
    say "[$CUR] NVMe-oF disconnected, nvmet configuration removed, brd unloaded"
}

app_swap_on() {   # app_swap_on BACKEND: the swap device, SWAPDEV
    case "$1" in
        rdma|tcp)
            _acap=$CAPACITY
            CAPACITY=$APP_SWAP
            start_memserver "$1"
            CAPACITY=$_acap
            # shellcheck disable=SC2086
            start_nbdkit rdmaswap "server=$ADDR:$PORT" "size=$APP_SWAP" "transport=$1" \
                "auth-key=$AUTH_KEY" $PLUGIN_ARGS
            swap_on plain
            ;;
        proxy)
            app_back_start
            start_nbdkit nbd "hostname=$ADDR" "port=$PORT"
            swap_on plain
            ;;
        nvme-tcp|nvme-rdma)
            app_nvme_on "${1#nvme-}"
            ;;
        memory)
            start_nbdkit memory "$APP_SWAP" allocator=malloc,mlock=true
            swap_on plain
            ;;
        zram)
            [ -w /sys/block/zram0/disksize ] || fail "[$CUR] no /dev/zram0 (zram module not loaded?)"
            echo "$APP_SWAP" > /sys/block/zram0/disksize || fail "[$CUR] cannot set zram0's disksize"
            SWAPDEV=/dev/zram0
            ;;
        disk)
            [ -b /dev/vda ] || fail "[$CUR] no /dev/vda (virtio disk)"
            SWAPDEV=/dev/vda
            ;;
        *) fail "unknown app run backend '$1' (want rdma, tcp, proxy, nvme-tcp, nvme-rdma, memory, zram or disk)" ;;
    esac
    case "$1" in
        zram|disk|nvme-*)
            mkswap "$SWAPDEV" > /run/mkswap.log 2>&1 || { cat /run/mkswap.log; fail "mkswap $SWAPDEV failed"; }
            swapon "$SWAPDEV" || fail "swapon $SWAPDEV failed"
            [ -n "$(swap_used_kib)" ] || { cat /proc/swaps; fail "$SWAPDEV not in /proc/swaps after swapon"; }
            ;;
    esac
    say "[$CUR] swap: $(awk -v d="$SWAPDEV" '$1 == d { print $1, $3, "KiB" }' /proc/swaps)"
}

app_swap_off() {   # app_swap_off BACKEND
    case "$1" in
        rdma|tcp|memory|proxy)
            swap_off
            teardown_backend
            app_back_stop
            ;;
        *)
            run_bounded 180 /run/swapoff.log swapoff "$SWAPDEV" \
                || { cat /run/swapoff.log; fail "swapoff $SWAPDEV failed or hung"; }
            [ "$1" != zram ] || echo 1 > /sys/block/zram0/reset
            case "$1" in nvme-*) app_nvme_off ;; esac
            SWAPDEV=/dev/nbd0
            ;;
    esac
}

# app_sample FILE: the values of APP_SAMPLE keys spread over the key space (a whole-set DEBUG
# DIGEST at 50 % swaps the whole set in, which took minutes under TCG)
app_sample() {
    awk -v k="$APP_KEYS" -v n="$APP_SAMPLE" 'BEGIN { for (i = 0; i < n; i++) printf "GET key:%012d\n", int(i * k / n) }' \
        > /run/redis-sample.in
    run_bounded "$APP_WAIT" "$1" sh -c 'redis-cli -p 6379 < /run/redis-sample.in' \
        && [ "$(grep -c . "$1")" = "$APP_SAMPLE" ]
}

app_run() {   # app_run rdma|tcp|proxy|nvme-tcp|nvme-rdma|memory|zram|disk
    _ab=$1
    CUR=app-$_ab
    _ar0=$(uptime_s)
    say "===== $CUR: redis-server swapping to $_ab, memory.max at $APP_LEVELS % of its working set ====="
    command -v redis-server > /dev/null && command -v redis-benchmark > /dev/null \
        || fail "[$CUR] redis-server/redis-benchmark not in the image"
    [ -s "$APP_LOAD" ] || fail "[$CUR] no $APP_LOAD in the image"
    : > /run/nbdkit.log
    app_swap_on "$_ab"
    echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    [ -d "$APP_CG" ] || mkdir "$APP_CG" || fail "[$CUR] cannot create cgroup $APP_CG"
    echo max > "$APP_CG/memory.max" || fail "[$CUR] cannot set $APP_CG/memory.max"
    # shellcheck disable=SC2016
    sh -c 'echo $$ > "$1/cgroup.procs" || exit 3; exec redis-server --bind 127.0.0.1 --port 6379 \
        --save "" --appendonly no --protected-mode no --daemonize no \
        --loglevel warning --logfile /run/redis.log' sh "$APP_CG" > /run/redis.out 2>&1 &
    REDIS_PID=$!
    wait_until 60 redis_up || { cat /run/redis.out /run/redis.log 2>/dev/null; fail "[$CUR] redis-server did not answer PING within 60 s"; }
    _at0=$(uptime_s)
    run_bounded "$APP_WAIT" /run/redis-load.out sh -c 'redis-cli -p 6379 --pipe < "$1"' sh "$APP_LOAD" \
        || { cat /run/redis-load.out; fail "[$CUR] loading $APP_LOAD with redis-cli --pipe failed"; }
    grep -q 'errors: 0,' /run/redis-load.out || { cat /run/redis-load.out; fail "[$CUR] redis-cli --pipe reported errors"; }
    _akeys=$(redis-cli -p 6379 dbsize)
    say "[$CUR] loaded $_akeys keys in $(elapsed "$_at0" "$(uptime_s)") s: $(tail -n 1 /run/redis-load.out)"
    [ "$_akeys" = "$APP_KEYS" ] || fail "[$CUR] DBSIZE $_akeys after the load, expected $APP_KEYS"
    app_sample /run/redis-sample0 || fail "[$CUR] reading $APP_SAMPLE sample keys after the load failed"
    _arss=$(proc_status_kib "$REDIS_PID" VmRSS)
    _aw=$(($(cat "$APP_CG/memory.current") / 1024))
    say "[$CUR] working set: memory.current $_aw KiB (redis VmRSS $_arss KiB, used_memory $(redis-cli -p 6379 info memory | sed -n 's/^used_memory_human://p' | tr -d '\r'))"
    echo "RDMASWAP-VM-APP: ws $_ab $_arss $_aw $_akeys"
    _aout=0   # pages swapped out at the levels below 100 %
    _alow=0   # levels below 100 %
    for _alv in $APP_LEVELS; do
        _alim=$((_aw * _alv / 100))
        _ain0=$(vmstat pswpin)
        _aout0=$(vmstat pswpout)
        echo "$((_alim * 1024))" > "$APP_CG/memory.max" || fail "[$CUR] cannot set memory.max to $_alim KiB"
        _at0=$(uptime_s)
        run_bounded "$APP_WAIT" /run/redis-bench.out redis-benchmark -p 6379 -t get -r "$APP_KEYS" \
            -n "$APP_REQUESTS" -c "$APP_CLIENTS" --csv
        _arc=$?
        _asecs=$(elapsed "$_at0" "$(uptime_s)")
        _din=$(($(vmstat pswpin) - _ain0))
        _dout=$(($(vmstat pswpout) - _aout0))
        [ "$_arc" = 0 ] || { cat /run/redis-bench.out; fail "[$CUR] redis-benchmark at $_alv % failed (exit $_arc)"; }
        # "GET","rps","avg","min","p50","p95","p99","max" (ms)
        _row=$(tr -d '"\r' < /run/redis-bench.out | awk -F, '$1 == "GET" { print $2, $3, $5, $7, $8 }')
        [ -n "$_row" ] || { cat /run/redis-bench.out; fail "[$CUR] no GET line from redis-benchmark --csv"; }
        alive "$REDIS_PID" || fail "[$CUR] redis-server died at $_alv %"
        say "[$CUR] $_alv % ($_alim KiB): rps avg p50 p99 max = $_row; pswpin +$_din pswpout +$_dout;" \
            "$_asecs s; memory.current $(($(cat "$APP_CG/memory.current") / 1024)) KiB, swap $(swap_used_kib) KiB"
        echo "RDMASWAP-VM-APP: row $_ab $_alv $_alim $_row $_din $_dout $_asecs"
        [ "$_alv" -ge 100 ] || { _alow=$((_alow + 1)); _aout=$((_aout + _dout)); }
    done
    # the swap device was really used: redis' pages went out to it below 100 % (one swap device
    # at a time, so every page swapped out went there)
    [ "$_alow" = 0 ] || [ "$_aout" -gt 0 ] || fail "[$CUR] nothing was swapped out to $SWAPDEV below 100 %"
    _at0=$(uptime_s)
    app_sample /run/redis-sample1 || fail "[$CUR] reading $APP_SAMPLE sample keys after the last level failed"
    cmp -s /run/redis-sample0 /run/redis-sample1 \
        || fail "[$CUR] $APP_SAMPLE sample values read after the last level differ from those after the load"
    say "[$CUR] $APP_SAMPLE sample values unchanged ($(elapsed "$_at0" "$(uptime_s)") s);" \
        "memory.events: $(tr '\n' ' ' < "$APP_CG/memory.events")"
    [ "$(cg_value memory.events oom_kill)" = 0 ] || fail "[$CUR] OOM kill in redis' cgroup"
    kill -9 "$REDIS_PID"
    wait "$REDIS_PID" 2>/dev/null
    REDIS_PID=""
    wait_until 30 app_cg_gone || fail "[$CUR] cannot remove $APP_CG"
    app_swap_off "$_ab"
    check_dmesg
    say "[$CUR] PASS: whole run $(elapsed "$_ar0" "$(uptime_s)") s"
}
