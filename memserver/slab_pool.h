// SPDX-License-Identifier: MIT
// The memserver's memory: its whole capacity mapped, populated and locked at start, cut into
// slabs that are granted to sessions. Data-path checks are lock-free; grants take a mutex.
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
	// Take back a slab `owner` holds: waits for its in-flight accesses, zeroes it, frees it.
	// False if `owner` does not hold it.
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

	// Data path. On success returns a pointer to [off, off+len) of slab `id`, which `owner`
	// holds, and counts an in-flight access that end_access() must close. nullptr if the slab
	// is not owner's or the range is outside it. No lock, no allocation.
	std::byte *begin_access(uint32_t id, uint64_t owner, uint64_t off, uint64_t len);
	void end_access(uint32_t id) { slabs_[id].inflight.fetch_sub(1); }

private:
	struct Slab {
		std::atomic<uint64_t> owner{0}; // 0: free; kReleasing while being zeroed
		std::atomic<uint32_t> inflight{0};
		Tag tag; // guarded by mu_ (control path only)
	};
	static constexpr uint64_t kReleasing = ~uint64_t(0);
	void wipe(uint32_t id);

	uint64_t capacity_;
	uint64_t slab_size_;
	uint32_t nslabs_;
	std::byte *base_ = nullptr;
	std::unique_ptr<Slab[]> slabs_;
	mutable std::mutex mu_; // guards free_ and the tags
	std::vector<uint32_t> free_;
};

} // namespace rdmaswap
