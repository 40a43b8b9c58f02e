// SPDX-License-Identifier: MIT
// Timing helper shared by the unit tests that check how long a wait took.
#pragma once

#include <chrono>

namespace rdmaswap::test {

// Milliseconds since `t0` on the steady clock (the clock of every deadline, common/util/deadline.h).
inline double ms_since(std::chrono::steady_clock::time_point t0)
{
	return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
		.count();
}

} // namespace rdmaswap::test
