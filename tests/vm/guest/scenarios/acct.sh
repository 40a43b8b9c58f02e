# SPDX-License-Identifier: MIT
# shellcheck shell=sh
# acct-T (issue 13, "RDMA path accounting"): memserver + nbdkit with the plugin over T (or, for
# T=proxy, the peer users would run instead: nbdkit's nbd plugin forwarding over TCP to an
# nbdkit memory plugin, the row's "donor", started as scenarios/app.sh does), the device filled
# once, then per row of ACCT_ROWS (RW:BS:QD) ACCT_SECONDS of fio (nbd engine on nbdkit's socket,
# one connection, random offsets); the plugin's status file (io_requests, data_batches, rdma_*)
# and nbdkit's CPU time are read before and after each row, and the differences printed per
# request as RDMASWAP-VM-ACCT lines (bench/rdma-accounting.sh), with the memserver's CPU per
# request beside nbdkit's (issue 28: over RDMA the donor's CPU does no work per request). The
# proxy has no status file: its requests are fio's (bytes / block size) and its counter columns
# are 0. Fails if a row saw an error, or (rdma) if the accounting is off: no request counted,
# more doorbells than requests (each request here is one batch), a completion count that is not
# one per doorbell, or a memserver that spent a tenth of nbdkit's CPU or more.
#
# Sourced by /init (tests/vm/guest-init.sh) after guest/lib.sh and guest/boot.sh.

acct_snapshot() {   # acct_snapshot FILE: the status file's counters, nbdkit's and the memserver's CPU seconds
    # the plugin rewrites the status every second: wait past the next write, so that nothing
    # the last fio row did is missing
    sleep 2
    { [ "$_t" = proxy ] || grep -E '^(io_|data_|rdma_)' "$STATUSFILE"
      echo "cpu_s=$(cpu_s "$NBDKIT_PID")"; echo "ms_cpu_s=$(cpu_s "$_donor_pid")"; } > "$1"
}

acct_value() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" /run/acct-raw; }   # acct_value KEY

acct_run() {   # acct_run tcp|rdma|proxy
    _t=$1
    CUR=acct-$_t
    _r0=$(uptime_s)
    say "===== $CUR: data path accounting over $_t (fio nbd engine, $ACCT_SECONDS s per row) ====="
    command -v fio > /dev/null || fail "[$CUR] fio is not in the image"
    _cap=$CAPACITY
    CAPACITY=$ACCT_SIZE
    : > /run/nbdkit.log
    rm -f "$STATUSFILE"
    if [ "$_t" = proxy ]; then
        app_back_start "$ACCT_SIZE"
        _donor_pid=$APP_BACK_PID
        start_nbdkit nbd "hostname=$ADDR" "port=$PORT"
    else
        start_memserver "$_t"
        _donor_pid=$MS_PID
        # shellcheck disable=SC2086
        start_nbdkit rdmaswap "server=$ADDR:$PORT" "size=$ACCT_SIZE" "transport=$_t" \
            "auth-key=$AUTH_KEY" "statusfile=$STATUSFILE" $PLUGIN_ARGS
        wait_until 10 test -s "$STATUSFILE" || fail "[$CUR] the plugin wrote no $STATUSFILE within 10 s"
    fi
    CAPACITY=$_cap
    _uri="nbd+unix:///?socket=$SOCK"
    # every slab granted and written first: reads hit the donor, writes allocate nothing
    _t0=$(uptime_s)
    run_bounded 300 /run/fio-fill.out fio --name=fill --thread --ioengine=nbd --uri="$_uri" \
        --rw=write --bs=1M --iodepth=4 --output-format=terse \
        || { cat /run/fio-fill.out; fail "[$CUR] fio could not fill the device"; }
    say "[$CUR] $ACCT_SIZE filled in $(elapsed "$_t0" "$(uptime_s)") s"
    : > /run/acct.txt
    for _row in $ACCT_ROWS; do
        _rw=${_row%%:*}
        _bs=${_row#*:}
        _bs=${_bs%%:*}
        _qd=${_row##*:}
        acct_snapshot /run/acct-before
        run_bounded $((ACCT_SECONDS + 120)) /run/fio-row.out fio --name="$_row" --thread \
            --ioengine=nbd --uri="$_uri" --rw="$_rw" --bs="$_bs" --iodepth="$_qd" \
            --runtime="$ACCT_SECONDS" --time_based --norandommap --randrepeat=0 \
            --output-format=terse
        _rc=$?
        [ "$_rc" = 0 ] || { cat /run/fio-row.out; fail "[$CUR] fio $_row failed (exit $_rc)"; }
        acct_snapshot /run/acct-after
        # terse v3: field 5 the error, 6 and 47 KiB read and written, 8 read IOPS, 49 write IOPS
        _iops=$(awk -F';' '/^3;/ { if ($5 != 0) print "error"; else print $8 + $49 }' /run/fio-row.out)
        case "$_iops" in ""|error) cat /run/fio-row.out; fail "[$CUR] fio $_row reported an error" ;; esac
        _fio_req=$(awk -F';' -v bs="$(size_kib "$_bs")" '/^3;/ { printf "%d", ($6 + $47) / bs }' /run/fio-row.out)
        # /run/acct.txt: ROW REQUESTS IOPS, then per request: POSTS DOORBELLS POLLS EMPTY
        # COMPLETIONS ARMS SLEEPS BATCHES CPU-US DONOR-CPU-US; /run/acct-raw: the row's raw
        # differences
        awk -F= -v row="$_row" -v iops="$_iops" -v fio_req="$_fio_req" -v t="$_t" '
            FILENAME == "/run/acct-before" { a[$1] = $2; next }
            { d[$1] = $2 - a[$1] }
            END {
                r = t == "proxy" ? fio_req : d["io_requests"]
                printf "raw %s requests=%d batches=%d posts=%d doorbells=%d polls=%d empty=%d completions=%d arms=%d sleeps=%d cpu_s=%.2f ms_cpu_cs=%d nbdkit_cpu_cs=%d\n",
                    row, r, d["data_batches"], d["rdma_posts"], d["rdma_doorbells"], d["rdma_polls"],
                    d["rdma_polls_empty"], d["rdma_completions"], d["rdma_arms"], d["rdma_sleeps"],
                    d["cpu_s"], d["ms_cpu_s"] * 100, d["cpu_s"] * 100 > "/run/acct-raw"
                if (r <= 0)
                    exit
                printf "%s %d %.0f %.2f %.2f %.2f %.2f %.2f %.2f %.2f %.2f %.0f %.0f\n", row, r, iops,
                    d["rdma_posts"] / r, d["rdma_doorbells"] / r, d["rdma_polls"] / r,
                    d["rdma_polls_empty"] / r, d["rdma_completions"] / r, d["rdma_arms"] / r,
                    d["rdma_sleeps"] / r, d["data_batches"] / r, d["cpu_s"] * 1e6 / r,
                    d["ms_cpu_s"] * 1e6 / r
            }' /run/acct-before /run/acct-after >> /run/acct.txt
        say "[$CUR] $_row: fio $_iops IOPS; $(cat /run/acct-raw)"
        _req=$(acct_value requests)
        [ "${_req:-0}" -gt 0 ] || fail "[$CUR] $_row: the status counted no request (io_requests did not grow)"
        if [ "$_t" = rdma ]; then
            _posts=$(acct_value posts) _bells=$(acct_value doorbells) _compl=$(acct_value completions)
            [ "$_posts" -ge "$_req" ] || fail "[$CUR] $_row: $_posts WRs posted for $_req requests (fewer than one each)"
            [ "$_bells" -le "$_req" ] || fail "[$CUR] $_row: $_bells doorbells for $_req requests (each is one batch here: one doorbell at most)"
            [ "$_compl" = "$_bells" ] || fail "[$CUR] $_row: $_compl completions for $_bells doorbells (one signaled WR per batch)"
            # one-sided: the donor's CPU serves no request (its background threads tick on)
            _ms=$(acct_value ms_cpu_cs) _nk=$(acct_value nbdkit_cpu_cs)
            [ $((_ms * 10)) -lt "$_nk" ] || fail "[$CUR] $_row: the memserver used $_ms cs of CPU against nbdkit's $_nk cs: over RDMA it should do no work per request"
        fi
    done
    {
        echo "transport=$_t seconds_per_row=$ACCT_SECONDS size=$ACCT_SIZE; fio nbd engine, one connection; from posts on: per request"
        printf '%-16s %8s %6s %6s %6s %7s %7s %6s %6s %6s %7s %7s %9s\n' row requests iops \
            posts bells polls empty compl arms sleeps batches cpu_us donor_us
        awk '{ printf "%-16s %8d %6d %6s %6s %7s %7s %6s %6s %6s %7s %7d %9d\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 }' /run/acct.txt
    } | sed 's/^/RDMASWAP-VM-ACCT: /'
    stop_nbdkit
    if [ "$_t" = proxy ]; then app_back_stop; else stop_memserver; fi
    check_dmesg
    say "[$CUR] PASS: accounting of $(wc -l < /run/acct.txt) rows; whole run $(elapsed "$_r0" "$(uptime_s)") s"
}
