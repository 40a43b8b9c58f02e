// SPDX-License-Identifier: MIT
// Reconnect pacing for data paths: after a failure, wait 100 ms, then double up to 5 s.
#pragma once

#include <algorithm>
#include <chrono>

namespace rdmaswap {

class Backoff {
public:
	using clock = std::chrono::steady_clock;
	// May a reconnect be attempted now?
	bool may_try(clock::time_point now) const { return now >= next_; }
	void failed(clock::time_point now)
	{
		delay_ = std::min(kMax, std::max(kMin, delay_ * 2));
		next_ = now + delay_;
	}
	void succeeded() { delay_ = std::chrono::milliseconds{0}; }

private:
	static constexpr std::chrono::milliseconds kMin{100};
	static constexpr std::chrono::milliseconds kMax{5000};
	std::chrono::milliseconds delay_{0};
	clock::time_point next_{};
};

} // namespace rdmaswap
