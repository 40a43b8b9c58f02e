// SPDX-License-Identifier: MIT
// Unit tests for LogLimiter: a burst per period gets through, the rest is counted.
#include <catch2/catch.hpp>

#include <thread>

#include "common/log.h"

using rdmaswap::LogLimiter;

TEST_CASE("log limiter: a burst per period, then a count of what was dropped", "[log]")
{
	LogLimiter lim(3, std::chrono::seconds(1));
	uint64_t suppressed = 99;
	for (int i = 0; i < 3; i++) {
		REQUIRE(lim.allow(suppressed));
		CHECK(suppressed == 0);
	}
	for (int i = 0; i < 50; i++)
		CHECK_FALSE(lim.allow(suppressed));
	std::this_thread::sleep_for(std::chrono::milliseconds(1100));
	REQUIRE(lim.allow(suppressed));
	CHECK(suppressed == 50); // said once, with the first message of the next period
	REQUIRE(lim.allow(suppressed));
	CHECK(suppressed == 0);
}
