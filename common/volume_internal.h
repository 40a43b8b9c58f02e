// SPDX-License-Identifier: MIT
// Constants and small helpers shared by the files that implement Volume (common/volume*.cpp).
#pragma once

#include <chrono>
#include <cstdint>

#include "common/transport.h"

namespace rdmaswap {

// At most this many slabs are touched by one chunk, so one chunk never posts more than
// kMaxBatch operations to one data path (each piece posts at most once per server).
inline constexpr unsigned kMaxPieces = 8;
static_assert(kMaxPieces <= kMaxBatch);

// A copy (repair, give-back move) moves a slab in blocks of this size (smaller for smaller
// slabs or channel buffers) and tracks writes per block; a window of at most kCopyWindow
// bytes (and kMaxBatch blocks) is in flight from the source while the previous one goes to
// the destination. 256 KiB blocks copied twice as fast as 64 KiB ones over TCP loopback.
inline constexpr uint64_t kCloneBlock = 256 * 1024;
inline constexpr uint64_t kCopyWindow = 2 * 1024 * 1024;
// A copy switches over once at most this many blocks were written again since they were
// copied; it gives up after this many passes over a slab that keeps being rewritten, and
// then copies what is left inside the switch-over section.
inline constexpr uint64_t kSwitchDirtyBlocks = 4;
inline constexpr unsigned kMaxCopyPasses = 8;
inline constexpr unsigned kSwitchTries = 3;

inline int64_t now_ns()
{
	return std::chrono::duration_cast<std::chrono::nanoseconds>(
		       std::chrono::steady_clock::now().time_since_epoch())
		.count();
}

} // namespace rdmaswap
