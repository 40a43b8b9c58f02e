// SPDX-License-Identifier: MIT
// The memserver's memory: its whole capacity mapped, populated and locked at start, cut into
// slabs that are granted to sessions. Data-path checks are lock-free; grants take a mutex.
// Slabs can be withdrawn (given back to the host's kernel) and restored later.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace rdmaswap {

class SlabPool {
public:
	// Maps `capacity` bytes (a multiple of `slab_size`, a power of two >= 64 KiB), populates
	// and mlocks them. With lock=false the memory is not locked (unit tests only). Throws
	// std::runtime_error; if locking fails because of RLIMIT_MEMLOCK the message says how to
	// raise it.
	SlabPool(uint64_t capacity, uint64_t slab_size, bool lock = true);
	~SlabPool();
	SlabPool(const SlabPool &) = delete;
	SlabPool &operator=(const SlabPool &) = delete;

	uint64_t capacity() const { return capacity_; }
	uint64_t slab_size() const { return slab_size_; }
	uint32_t slabs_total() const { return nslabs_; }
	uint32_t slabs_free() const;
	std::byte *slab_base(uint32_t id) const { return base_ + uint64_t(id) * slab_size_; }
	std::byte *base() const { return base_; }

	// Grant a zeroed slab to `owner` (non-zero). nullopt when none is free.
	std::optional<uint32_t> allocate(uint64_t owner);
	// Take back a slab `owner` holds: waits for its in-flight accesses (asleep, woken by the
	// last end_access(); a TCP access lasts at most the memserver's message deadline), zeroes
	// it, frees it. False if `owner` does not hold it.
	bool release(uint32_t id, uint64_t owner);
	// Release every slab `owner` holds; returns how many.
	uint32_t release_all(uint64_t owner);
	bool owns(uint32_t id, uint64_t owner) const;
	// The slabs `owner` holds (control path).
	std::vector<uint32_t> owned_by(uint64_t owner) const;

	// Reattach (control path). A slab's tag says which chunk of its client's volume it holds
	// and the chunk's epoch; a fresh slab has tag {0, 0}, and release() clears it.
	struct Tag {
		uint64_t chunk = 0;
		uint64_t epoch = 0;
	};
	// Set the tag of a slab `owner` holds; false if it does not hold it.
	bool set_tag(uint32_t id, uint64_t owner, const Tag &tag);
	Tag tag(uint32_t id) const;
	// Hand every slab `from` holds to `to` (a session taking over a detached one); their
	// content and tags are kept. Returns how many.
	uint32_t reassign(uint64_t from, uint64_t to);
	// Give-back (control path). Withdraw up to `n` more slabs from the pool: free slabs
	// first, at once (their pages are unlocked and released to the kernel, and they are
	// never granted again); then granted slabs are marked *wanted back*: each is withdrawn
	// when its owner releases it. The caller must have deregistered a wanted slab's RDMA MR
	// before it is released (as for any release).
	struct Withdrawal {
		uint32_t now = 0;    // free slabs withdrawn by this call
		uint32_t wanted = 0; // granted slabs newly marked wanted back
	};
	Withdrawal withdraw(uint32_t n);
	// Un-mark up to `n` granted slabs that are wanted back (their owners keep them; a move
	// already under way just frees the slab). Returns how many.
	uint32_t cancel_wanted(uint32_t n);
	// Put back up to `n` withdrawn slabs (populated and locked again), free for grants.
	// Returns how many. Slow (faults in the pages): never on the data path.
	uint32_t restore(uint32_t n);
	// The slabs of `owner` that are wanted back (control path).
	std::vector<uint32_t> wanted_by(uint64_t owner) const;
	uint32_t slabs_withdrawn() const;
	uint32_t slabs_wanted() const;
	// The counts above without a lock (for the metrics endpoint): each is exact when it was
	// published, under the pool's mutex, but they may come from different moments.
	struct Counts {
		uint32_t total = 0, free = 0, withdrawn = 0, wanted = 0;
	};
	Counts counts() const;

	// Data path. On success returns a pointer to [off, off+len) of slab `id`, which `owner`
	// holds, and counts an in-flight access that end_access() must close. nullptr if the slab
	// is not owner's or the range is outside it. No lock, no allocation.
	std::byte *begin_access(uint32_t id, uint64_t owner, uint64_t off, uint64_t len);
	// Close an access. The last one out wakes a release() waiting for it; with no release
	// waiting it is one atomic decrement (no lock, no allocation, no system call).
	void end_access(uint32_t id)
	{
		if (slabs_[id].inflight.fetch_sub(1) == (kReleaseWaits | 1))
			slabs_[id].inflight.notify_all();
	}

private:
	struct Slab {
		std::atomic<uint64_t> owner{0}; // 0: free; kReleasing while being zeroed
		// In-flight accesses, plus kReleaseWaits while a release() waits for them to end.
		std::atomic<uint32_t> inflight{0};
		Tag tag; // guarded by mu_ (control path only)
	};
	static constexpr uint64_t kReleasing = ~uint64_t(0);
	static constexpr uint32_t kReleaseWaits = uint32_t(1) << 31;
	// Give-back state of a slab (flags_, under mu_).
	static constexpr uint8_t kWanted = 1;    // granted, to be withdrawn at its release
	static constexpr uint8_t kWithdrawn = 2; // out of the pool, pages released
	static constexpr uint8_t kTransit = 4;   // out of the pool, being withdrawn or restored
	void wipe(uint32_t id);
	// Unlock slab `id`'s pages and give them back to the kernel (they read as zeros after).
	void drop_pages(uint32_t id);

	uint64_t capacity_;
	uint64_t slab_size_;
	uint32_t nslabs_;
	std::byte *base_ = nullptr;
	std::unique_ptr<Slab[]> slabs_;
	bool lock_;
	mutable std::mutex mu_; // guards free_, the tags, flags_ and the counts below
	std::vector<uint32_t> free_;
	std::vector<uint8_t> flags_;
	uint32_t withdrawn_ = 0, wanted_ = 0;
	// Copies of free_.size(), withdrawn_ and wanted_ for counts(), stored by publish()
	// (called under mu_ after each change).
	std::atomic<uint32_t> free_n_{0}, withdrawn_n_{0}, wanted_n_{0};
	void publish();
	std::mutex resize_mu_; // serialises withdraw() and restore()
};

} // namespace rdmaswap
