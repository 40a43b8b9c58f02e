// SPDX-License-Identifier: MIT
// FUZZ_CHECK: a property a fuzz target asserts; on failure it names the property and aborts,
// which libFuzzer reports as a crash (with the input saved).
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                   \
	do {                                                                               \
		if (!(cond)) {                                                             \
			std::fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__,     \
				     __LINE__, #cond);                                     \
			std::abort();                                                      \
		}                                                                          \
	} while (0)
