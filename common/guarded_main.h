// SPDX-License-Identifier: MIT
// A program's exception boundary (docs/architecture.md, "Exception boundaries"), shared by the
// memserver's and the tools' main().
#pragma once

#include <cstdio>
#include <exception>

namespace rdmaswap {

// Runs `run(argc, argv)` and returns its status; whatever it throws is reported on stderr as
// "PROG: what" and the program exits with status 1, never through std::terminate.
inline int guarded_main(const char *prog, int (*run)(int, char **), int argc, char **argv) noexcept
{
	try {
		return run(argc, argv);
	} catch (const std::exception &e) {
		std::fprintf(stderr, "%s: %s\n", prog, e.what());
	} catch (...) {
		std::fprintf(stderr, "%s: unexpected failure\n", prog);
	}
	return 1;
}

} // namespace rdmaswap
