// SPDX-License-Identifier: MIT
// The owner of one anonymous memory mapping (buffers registered once and used by the data
// path): unmapped on destruction. Declare it before whatever points into it, so that those are
// destroyed first.
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <span>
#include <utility>

namespace rdmaswap {

class MappedRegion {
public:
	MappedRegion() = default;
	~MappedRegion() { reset(); }
	MappedRegion(MappedRegion &&o) noexcept
		: p_(std::exchange(o.p_, nullptr)), len_(std::exchange(o.len_, 0))
	{
	}
	MappedRegion &operator=(MappedRegion &&o) noexcept
	{
		if (this != &o) {
			reset();
			p_ = std::exchange(o.p_, nullptr);
			len_ = std::exchange(o.len_, 0);
		}
		return *this;
	}
	MappedRegion(const MappedRegion &) = delete;
	MappedRegion &operator=(const MappedRegion &) = delete;

	// Map `len` bytes of private anonymous memory, populated (MAP_POPULATE), in place of what
	// it held: 0, or mmap's errno (then it holds nothing).
	int map(size_t len)
	{
		reset();
		void *p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		if (p == MAP_FAILED)
			return errno;
		p_ = static_cast<std::byte *>(p);
		len_ = len;
		return 0;
	}
	// Lock it in memory: 0, or mlock's errno (it still works, unlocked: the caller warns).
	int lock() { return ::mlock(p_, len_) == 0 ? 0 : errno; }
	void reset()
	{
		if (p_)
			::munmap(p_, len_);
		p_ = nullptr;
		len_ = 0;
	}

	std::byte *data() const { return p_; }
	size_t size() const { return len_; }
	std::span<std::byte> bytes() const { return {p_, len_}; }

private:
	std::byte *p_ = nullptr;
	size_t len_ = 0;
};

} // namespace rdmaswap
