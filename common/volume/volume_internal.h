// SPDX-License-Identifier: MIT
// Constants and small helpers shared by the files that implement Volume
// (common/volume/volume*.cpp).
#pragma once

#include <chrono>
#include <cstdint>

#include "common/transport/transport.h"

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
// copied; after kMaxCopyPasses passes over a slab that keeps being rewritten it tries the
// switch-over anyway, copying what is left outside the exclusive section kSwitchTries times
// and then inside it only if that is at most kSwitchDirtyBlocks blocks (else it gives up
// after kMaxCopyPasses more tries, and starts over later).
inline constexpr uint64_t kSwitchDirtyBlocks = 4;
inline constexpr unsigned kMaxCopyPasses = 8;
inline constexpr unsigned kSwitchTries = 3;

// The donors one chunk's round posted to, and which of them failed: at most one per replica
// of each piece. A linear scan over a few entries, so a request costs the same whatever the
// number of donors (no bit per donor), and nothing is allocated.
class ChunkDonors {
public:
	static constexpr unsigned kCapacity = kMaxPieces * 3; // kMaxPieces x Volume::kMaxReplicas
	void clear() { n_ = 0; }
	bool empty() const { return n_ == 0; }
	unsigned size() const { return n_; }
	uint16_t id(unsigned k) const { return ids_[k]; }
	// Add `server` (once), as failed if `failed`; a failure sticks.
	void add(uint16_t server, bool failed = false)
	{
		for (unsigned k = 0; k < n_; k++)
			if (ids_[k] == server) {
				failed_[k] = failed_[k] || failed;
				return;
			}
		ids_[n_] = server;
		failed_[n_++] = failed;
	}
	void set_failed(unsigned k) { failed_[k] = true; }
	bool failed(uint16_t server) const
	{
		for (unsigned k = 0; k < n_; k++)
			if (ids_[k] == server)
				return failed_[k];
		return false;
	}
	bool any_failed() const
	{
		for (unsigned k = 0; k < n_; k++)
			if (failed_[k])
				return true;
		return false;
	}

private:
	uint16_t ids_[kCapacity];
	bool failed_[kCapacity];
	unsigned n_ = 0;
};

// A request's waits end by its start + this many timeouts (Volume::RequestScope): as long
// as one wait of it could take before (the lock and path bound, kMaxReplicas + 2), now for all.
inline constexpr unsigned kRequestWaits = 5;

inline int64_t now_ns()
{
	return std::chrono::duration_cast<std::chrono::nanoseconds>(
		       std::chrono::steady_clock::now().time_since_epoch())
		.count();
}

} // namespace rdmaswap
