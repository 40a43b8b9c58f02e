#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install dependencies (as root), build with warnings as errors, run every test: unit, host
# integration (real memserver + nbdkit + nbdsh/nbdcopy/fio) and the VM tests (real kernel nbd
# swap over Soft-RoCE). Ends with one line "N passed, N failed, N skipped".
# Usage: tools/run-tests.sh [BUILD_DIR] [-- extra meson test args, e.g. --suite unit]
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build-tests}
shift || true
[ "${1:-}" = "--" ] && shift
"$src/tools/install-deps.sh" || exit 1
if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" "$src" --werror || exit 1
else
	meson configure "$build" -Dwerror=true >/dev/null || exit 1
fi
ninja -C "$build" || { echo "0 passed, 1 failed"; exit 1; }
# nbdsh is a python script that needs Debian's python3 (with python3-libnbd) first on PATH.
PATH=/usr/bin:/usr/sbin:/bin:/sbin:$PATH meson test -C "$build" --print-errorlogs "$@"
rc=$?
python3 - "$build/meson-logs/testlog.json" <<'PY'
import json, sys
passed = failed = skipped = 0
try:
    lines = open(sys.argv[1]).read().splitlines()
except OSError:
    lines = []
for line in lines:
    if not line.strip():
        continue
    r = json.loads(line).get("result", "")
    if r in ("OK", "EXPECTEDFAIL"):
        passed += 1
    elif r == "SKIP":
        skipped += 1
    else:
        failed += 1
if not lines:
    failed = 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
exit $rc
