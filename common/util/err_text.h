// SPDX-License-Identifier: MIT
// errno descriptions without strerror()'s static buffer: every part of rdmaswap is
// multi-threaded (clang-tidy's concurrency-mt-unsafe).
#pragma once

#include <cstring>

namespace rdmaswap {

// The description of errno value `err` ("Connection refused"), or "unknown error": a static
// string (glibc's strerrordesc_np), so thread-safe and allocation-free.
inline const char *err_text(int err)
{
	const char *d = ::strerrordesc_np(err);
	return d ? d : "unknown error";
}

} // namespace rdmaswap
