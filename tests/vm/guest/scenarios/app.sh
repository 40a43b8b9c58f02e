# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# app-B (issue 15, the application table; bench/apptable.sh): redis-server (no persistence) in a
# cgroup, swapping to B: rdma or tcp (rdmaswap over Soft-RoCE or TCP on /dev/nbd0), memory
# (nbdkit's memory plugin on /dev/nbd0), zram (/dev/zram0) or disk (/dev/vda, a virtio disk on a
# host file).  APP_KEYS keys of random base64 text are loaded with redis-cli --pipe; the cgroup's
# memory.current then is the working set W; for each level L of APP_LEVELS memory.max is set to
# L % of W and redis-benchmark measures GET throughput and latency (uniformly random keys).  The
# values of APP_SAMPLE keys read after the load and after the last level must agree.
# Lines "RDMASWAP-VM-APP: row B L LIMIT_KIB RPS AVG_MS P50_MS P99_MS MAX_MS PSWPIN PSWPOUT SECS"
# and "RDMASWAP-VM-APP: ws B RSS_KIB CURRENT_KIB KEYS".
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

APP_CG=/sys/fs/cgroup/apptable
APP_LOAD=/etc/rdmaswap-vm/app-load.resp
REDIS_PID=""

redis_up() { redis-cli -p 6379 ping 2>/dev/null | grep -q PONG; }
cg_value() { sed -n "s/^$2 //p" "$APP_CG/$1"; }   # cg_value FILE KEY
app_cg_gone() { rmdir "$APP_CG" 2>/dev/null || [ ! -d "$APP_CG" ]; }

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
        *) fail "unknown app run backend '$1' (want rdma, tcp, memory, zram or disk)" ;;
    esac
    case "$1" in
        zram|disk)
            mkswap "$SWAPDEV" > /run/mkswap.log 2>&1 || { cat /run/mkswap.log; fail "mkswap $SWAPDEV failed"; }
            swapon "$SWAPDEV" || fail "swapon $SWAPDEV failed"
            [ -n "$(swap_used_kib)" ] || { cat /proc/swaps; fail "$SWAPDEV not in /proc/swaps after swapon"; }
            ;;
    esac
    say "[$CUR] swap: $(awk -v d="$SWAPDEV" '$1 == d { print $1, $3, "KiB" }' /proc/swaps)"
}

app_swap_off() {   # app_swap_off BACKEND
    case "$1" in
        rdma|tcp|memory)
            swap_off
            teardown_backend
            ;;
        *)
            run_bounded 180 /run/swapoff.log swapoff "$SWAPDEV" \
                || { cat /run/swapoff.log; fail "swapoff $SWAPDEV failed or hung"; }
            [ "$1" != zram ] || echo 1 > /sys/block/zram0/reset
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

app_run() {   # app_run rdma|tcp|memory|zram|disk
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
    done
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
