#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install dependencies (as root), build with warnings as errors, run every test: unit, host
# integration (real memserver + nbdkit + nbdsh/nbdcopy/fio) and the VM tests (real kernel nbd
# swap over Soft-RoCE). Then three more phases, each in its own build dir next to BUILD_DIR:
#   BUILD_DIR-asan  gcc with ASan+UBSan (-fno-sanitize-recover=all): the unit and host
#                   integration tests again (functions.sh preloads libasan into nbdkit only);
#   BUILD_DIR-fuzz  clang -Dfuzzing=enabled: every libFuzzer target in tests/fuzz for
#                   RDMASWAP_FUZZ_SECONDS (default 30) each, from a scratch copy of its corpus;
#   BUILD_DIR-tsan  gcc with ThreadSanitizer: the unit and host integration tests again
#                   (functions.sh preloads libtsan into nbdkit only and drops its --swap); any
#                   TSan report fails the test.
# To save wall time the extra build dirs are compiled at idle priority, one after the other, while
# the main tests run; each phase's tests start once the main tests are done and its own build is
# (the later builds go on beside them, still at idle priority). The ASan and TSan tests run side by
# side (each one test at a time); the fuzzers (side by side) after them. As root in CI (or with
# RDMASWAP_TEST_DEB_INSTALL=1) the Debian packages are built there too (tools/build-debs.sh,
# into BUILD_DIR-deb), and test-deb (suite deb) runs with them after the main tests.
# Ends with one line "N passed, N failed, N skipped" summing every phase that ran. A phase
# that cannot be set up or built counts as a failure.
# Usage: tools/run-tests.sh [BUILD_DIR] [-- extra meson test args, e.g. --suite unit]
# The extra meson test args apply to the main build only. RDMASWAP_EXTRA_PHASES=0 skips the
# sanitizer and fuzz phases (quick local runs); they run by default.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build-tests}
shift || true
[ "${1:-}" = "--" ] && shift
build=$(mkdir -p "$build" && cd "$build" && pwd)
asan="$build-asan"
fuzz="$build-fuzz"
tsan="$build-tsan"
debdir="$build-deb"
extra=${RDMASWAP_EXTRA_PHASES:-1}
"$src/tools/install-deps.sh" || exit 1
# nbdsh is a python script that needs Debian's python3 (with python3-libnbd) first on PATH.
export PATH=/usr/bin:/usr/sbin:/bin:/sbin:$PATH

# The sanitizer build: UBSan findings abort (no recover), ASan's always do, LeakSanitizer's fail
# at exit. -O1 as ASan recommends. GCC warns about std::regex (in Catch2) being "maybe
# uninitialized" only under -fsanitize=address, a known false positive, so that one is off.
asan_setup=(-Db_sanitize=address,undefined -Doptimization=1
	"-Dcpp_args=-fno-sanitize-recover=all -Wno-maybe-uninitialized"
	-Dcpp_link_args=-fno-sanitize-recover=all)
fuzz_setup=(-Dfuzzing=enabled -Dtests=disabled)
# ThreadSanitizer, at the default -O2 -g (TSan slows the code down 5-15 times).
tsan_setup=(-Db_sanitize=thread)
# A TSan report makes a process exit with status 66 when it ends (the unit tests; the
# integration tests also collect every process's reports, functions.sh). Both stacks of a race
# and of a lock-order inversion in full.
tsan_options="exitcode=66:second_deadlock_stack=1:history_size=4:suppressions=$src/tests/tsan.supp"

# setup_build NAME DIR NINJA_TARGET [MESON SETUP OPTIONS...]: set up (or reconfigure) DIR with
# --werror and build NINJA_TARGET in it ("" for everything); then mark it built
# (DIR/.rdmaswap-built). DIR/.rdmaswap-tried marks the end of the attempt, built or not.
setup_build() {
	local name=$1 dir=$2 target=$3 start=$SECONDS
	shift 3
	echo "==== $name: building $dir"
	rm -f "$dir/.rdmaswap-built" "$dir/.rdmaswap-tried"
	if [ ! -f "$dir/build.ninja" ]; then
		meson setup "$dir" "$src" --werror "$@"
	else
		meson configure "$dir" -Dwerror=true "$@" >/dev/null
	fi || { echo "==== $name: meson setup failed"; mkdir -p "$dir"; touch "$dir/.rdmaswap-tried"; return 1; }
	ninja -C "$dir" $target || { echo "==== $name: build failed"; touch "$dir/.rdmaswap-tried"; return 1; }
	touch "$dir/.rdmaswap-built" "$dir/.rdmaswap-tried"
	echo "==== $name: built in $((SECONDS - start)) s"
}

# run_tests NAME DIR [meson test args...]: run DIR's tests (already built).
run_tests() {
	local name=$1 dir=$2 start=$SECONDS rc=0
	shift 2
	echo "==== $name: testing $dir"
	rm -f "$dir/meson-logs/testlog.json"
	meson test -C "$dir" --no-rebuild --print-errorlogs "$@" || rc=1
	echo "==== $name: tests took $((SECONDS - start)) s"
	return $rc
}

rc=0
logs=()          # testlog.json of every test run
build_failures=0 # build dirs that could not be set up or built

if setup_build main "$build" ""; then
	main_built=1
else
	main_built=0
	build_failures=$((build_failures + 1))
	rc=1
fi
# test-deb's packages are built in the background phase when test-deb would install them.
debs_bg=0
if [ "$extra" != 0 ] && [ "$(id -u)" = 0 ] && [ -n "${CI:-}${RDMASWAP_TEST_DEB_INSTALL:-}" ]; then
	debs_bg=1
fi
if [ "$extra" != 0 ]; then
	# The extra build dirs, one after the other, in the background, as SCHED_IDLE (they run
	# only on a CPU nothing else wants, and never preempt the tests; a VM test beside a build
	# at nice 19 took 306 s, beside the same build as SCHED_IDLE 183 s, 93 s alone: qemu's
	# vCPUs stall each other when one is preempted). nice 19 if SCHED_IDLE cannot be set.
	mkdir -p "$build/meson-logs"
	extra_log="$build/meson-logs/extra-builds.log"
	for d in "$asan" "$fuzz" "$tsan" "$debdir"; do
		rm -f "$d/.rdmaswap-built" "$d/.rdmaswap-tried"
	done
	(
		renice -n 19 -p "$BASHPID" >/dev/null
		chrt --idle -p 0 "$BASHPID" >/dev/null 2>&1 || echo "==== (SCHED_IDLE not set: nice 19)"
		setup_build asan "$asan" "" "${asan_setup[@]}"
		setup_build tsan "$tsan" "" "${tsan_setup[@]}"
		CXX=clang++ setup_build fuzz "$fuzz" fuzzers "${fuzz_setup[@]}"
		# The Debian packages for test-deb (which installs them only in CI or when asked,
		# as root): built here, beside the rest, rather than by the test in the main phase.
		if [ "$debs_bg" = 1 ]; then
			echo "==== deb: building the packages in $debdir"
			rm -rf "$debdir"
			d0=$SECONDS
			if "$src/tools/build-debs.sh" "$debdir"; then
				touch "$debdir/.rdmaswap-built"
				echo "==== deb: built in $((SECONDS - d0)) s"
			else
				echo "==== deb: build failed"
			fi
			mkdir -p "$debdir"
			touch "$debdir/.rdmaswap-tried"
		fi
	) >"$extra_log" 2>&1 &
	extra_pid=$!
fi
if [ $main_built = 1 ]; then
	# meson runs as many tests at a time as there are cores (two on CI's 2): the host tests two
	# at a time; those marked is_parallel: false (the VM tests, clang-tidy, test-deb and the
	# host tests that time themselves against the whole machine) alone.
	if [ "$debs_bg" = 1 ]; then
		run_tests main "$build" "$@" --no-suite deb || rc=1
	else
		run_tests main "$build" "$@" || rc=1
	fi
	# (a copy: the deb run below writes the same build dir's testlog.json)
	cp "$build/meson-logs/testlog.json" "$build/meson-logs/testlog-main.json" 2>/dev/null
	logs+=("$build/meson-logs/testlog-main.json")
fi
if [ "$extra" != 0 ]; then
	start=$SECONDS
	# built NAME DIR: wait until DIR's build was tried (or the background builds ended); true
	# if DIR was built, else count a failure and say why.
	built() {
		local t0=$SECONDS
		while [ ! -f "$2/.rdmaswap-tried" ] && kill -0 "$extra_pid" 2>/dev/null; do
			sleep 2
		done
		echo "==== $1: build ready $((SECONDS - start)) s after the main tests" \
			"(waited $((SECONDS - t0)) s)"
		[ -f "$2/.rdmaswap-built" ] && return 0
		echo "==== $1: could not be built (see $extra_log)"
		grep -E '^==== |FAILED|error' "$extra_log" | head -n 40
		tail -n 30 "$extra_log"
		build_failures=$((build_failures + 1))
		rc=1
		return 1
	}
	# The ASan and the TSan tests side by side, each phase one test at a time (--num-processes
	# 1: the host tests may run two at a time, as in the main phase, but two sanitizer runs of
	# two each would be four on the 2 cores): the tests spend most of their time waiting (a
	# TSan integration run keeps 0.84 of a core busy on average), so two at once share the 2
	# cores and halve this part. Each starts as soon as its build is ready, the later builds
	# going on at idle priority. Their output is printed when both ended.
	san_pids=()
	san_outs=()
	if built asan "$asan"; then
		run_tests asan "$asan" --suite unit --suite integration --timeout-multiplier 2 \
			--num-processes 1 >"$asan/phase.out" 2>&1 &
		san_pids+=($!)
		san_outs+=("$asan/phase.out")
		logs+=("$asan/meson-logs/testlog.json")
	fi
	if built tsan "$tsan"; then
		TSAN_OPTIONS=$tsan_options run_tests tsan "$tsan" --suite unit --suite integration \
			--timeout-multiplier 3 --num-processes 1 >"$tsan/phase.out" 2>&1 &
		san_pids+=($!)
		san_outs+=("$tsan/phase.out")
		logs+=("$tsan/meson-logs/testlog.json")
	fi
	for p in ${san_pids[@]+"${san_pids[@]}"}; do
		wait "$p" || rc=1
	done
	for f in ${san_outs[@]+"${san_outs[@]}"}; do
		cat "$f"
	done
	# The fuzzers (concurrently, one core each) after the sanitizer builds' tests, not beside
	# them.
	if built fuzz "$fuzz"; then
		run_tests fuzz "$fuzz" --suite fuzz || rc=1
		logs+=("$fuzz/meson-logs/testlog.json")
		# What each fuzzer did: inputs run and coverage (libFuzzer's last status line).
		for f in "$fuzz"/tests/fuzz/fuzz-*.log; do
			[ -f "$f" ] && echo "$(basename "$f" .log): $(grep -E '^#[0-9]+[[:space:]]+DONE' "$f" | tail -n 1)"
		done
	fi
	# The packages are built last.
	if [ "$debs_bg" = 1 ] && [ $main_built = 1 ] && built deb "$debdir"; then
		RDMASWAP_DEB_DIR=$debdir run_tests deb "$build" --suite deb || rc=1
		cp "$build/meson-logs/testlog.json" "$build/meson-logs/testlog-deb.json"
		logs+=("$build/meson-logs/testlog-deb.json")
	fi
	wait "$extra_pid"
	echo "==== extra builds:"
	grep -E '^==== ' "$extra_log" | head -n 40
	echo "==== extra phases took $((SECONDS - start)) s after the main tests"
fi

python3 - "$build_failures" "${logs[@]}" <<'PY'
import json, sys
passed = skipped = 0
failed = int(sys.argv[1])
failures = []  # named just above the summary, so that a log's tail says which
for path in sys.argv[2:]:
    try:
        lines = [l for l in open(path).read().splitlines() if l.strip()]
    except OSError:
        lines = []
    if not lines:
        failed += 1  # a test run that recorded nothing
        failures.append(f"{path}: no test recorded")
    for line in lines:
        t = json.loads(line)
        r = t.get("result", "")
        if r in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
            failures.append(f"{path}: {t.get('name', '?')} {r} after {t.get('duration', 0):.0f} s")
for f in failures:
    print(f"FAILED {f}")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
exit $rc
