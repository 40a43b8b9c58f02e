// SPDX-License-Identifier: MIT
// Counters read by any thread and written by one: the data path's statistics (the client's
// paths and channels, the memserver's sessions).
#pragma once

#include <atomic>
#include <cstdint>

namespace rdmaswap {

// A counter with one writer at a time (the thread that holds the object it belongs to, handed on
// under a lock) and readers on any thread. A relaxed load and store, no read-modify-write: on
// x86-64 a plain load, add and store with no lock prefix, as cheap as a plain uint64_t, yet no
// data race for a reader. Two threads adding at once would lose counts: never share a writer.
class SoloCounter {
public:
	void add(uint64_t n = 1)
	{
		v_.store(v_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
	}
	uint64_t get() const { return v_.load(std::memory_order_relaxed); }

private:
	std::atomic<uint64_t> v_{0};
};

} // namespace rdmaswap
