#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Static analysis: clang-tidy (Debian 12's, 14 or later) with the checked-in .clang-tidy over
# every product source file (common/, memserver/, nbdkit-plugin/, tools/; not the tests and
# benches), using BUILD_DIR's compile_commands.json. Every warning is an error: prints them and
# exits 1; exits 0 when there is none. Run by meson as the test `clang-tidy` (suite lint).
# Usage: tools/clang-tidy.sh BUILD_DIR
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
tidy=$(command -v clang-tidy || ls /usr/bin/clang-tidy-* 2>/dev/null | sort -V | tail -n 1)
[[ -n $tidy ]] || { echo "clang-tidy not installed"; exit 77; }
[[ -f $build/compile_commands.json ]] || { echo "no $build/compile_commands.json"; exit 1; }
cd "$src" || exit 1
mapfile -t files < <(git ls-files 'common/*.cpp' 'memserver/*.cpp' 'nbdkit-plugin/*.cpp' \
	'tools/*.cpp' 2>/dev/null || find common memserver nbdkit-plugin tools -name '*.cpp')
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$SECONDS
# Two warnings clang raises inside system headers' macros (libibverbs' ibv_reg_mr, glibc's
# NLMSG_OK), which gcc, the build's compiler, does not: not ours to fix.
printf '%s\0' "${files[@]}" |
	xargs -0 -P "$(nproc)" -n 4 "$tidy" -p "$build" --quiet \
		--extra-arg=-Wno-deprecated-enum-enum-conversion --extra-arg=-Wno-sign-compare \
		>"$out" 2>/dev/null
n=$(grep -c ': \(warning\|error\): ' "$out")
echo "clang-tidy ($("$tidy" --version | grep -o 'version [0-9.]*')): ${#files[@]} files," \
	"$n findings, $((SECONDS - start)) s"
if ((n > 0)); then
	grep -A3 ': \(warning\|error\): ' "$out"
	exit 1
fi
exit 0
