// SPDX-License-Identifier: MIT
// Retry pacing: after a failure, wait `min`, then double up to `max` (data paths: 100 ms to 5 s;
// the plugin's membership, reconnecting donors: 1 s to 60 s).
#pragma once

#include <algorithm>
#include <chrono>

namespace rdmaswap {

class Backoff {
public:
	using clock = std::chrono::steady_clock;
	Backoff() = default;
	Backoff(std::chrono::milliseconds min, std::chrono::milliseconds max) : min_(min), max_(max) {}
	// May a reconnect be attempted now?
	bool may_try(clock::time_point now) const { return now >= next_; }
	// The first moment may_try() is true.
	clock::time_point next() const { return next_; }
	void failed(clock::time_point now)
	{
		delay_ = std::min(max_, std::max(min_, delay_ * 2));
		next_ = now + delay_;
	}
	void succeeded() { delay_ = std::chrono::milliseconds{0}; }

private:
	std::chrono::milliseconds min_{100};
	std::chrono::milliseconds max_{5000};
	std::chrono::milliseconds delay_{0};
	clock::time_point next_{};
};

} // namespace rdmaswap
