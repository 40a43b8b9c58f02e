// SPDX-License-Identifier: MIT
// The epoch floors of one session (chunk -> epoch floor), in memory mapped for them alone:
// when a session with many floors ends or expires, all of it goes back to the system at once
// (munmap). The memserver's heap is locked (mlockall MCL_FUTURE, so that serving never waits
// on reclaim), and glibc's malloc_trim cannot hand locked pages back: with the floors on the
// heap, 3 sessions x 1 M floors kept 125 MB resident after they expired.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory_resource>

namespace rdmaswap {

// Whole pages from mmap, each allocation returned by munmap. Throws std::bad_alloc when mmap
// fails. Stateless: one instance serves every FloorMap.
class MmapResource final : public std::pmr::memory_resource {
public:
	static MmapResource &instance();

private:
	void *do_allocate(size_t bytes, size_t align) override;
	void do_deallocate(void *p, size_t bytes, size_t align) override;
	bool do_is_equal(const std::pmr::memory_resource &o) const noexcept override
	{
		return this == &o;
	}
};

// A session's floors: a map whose nodes come from a pool of its own, fed by MmapResource.
// Destroying it unmaps every page it used. Not thread-safe (SessionTable's lock guards it).
struct FloorMap {
	FloorMap();
	FloorMap(const FloorMap &) = delete;
	FloorMap &operator=(const FloorMap &) = delete;
	std::pmr::unsynchronized_pool_resource pool; // before `map`: outlives its nodes
	std::pmr::map<uint64_t, uint64_t> map;
};

} // namespace rdmaswap
