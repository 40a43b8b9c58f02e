// SPDX-License-Identifier: MIT
// The owner of one file descriptor. Header-only (rdmaswap-nbd, which links nothing of common/,
// uses it too).
#pragma once

#include <unistd.h>

namespace rdmaswap {

// Owns one file descriptor; closes it on destruction. Move-only.
class Fd {
public:
	Fd() = default;
	explicit Fd(int fd) : fd_(fd) {}
	~Fd() { reset(); }
	Fd(Fd &&o) noexcept : fd_(o.release()) {}
	Fd &operator=(Fd &&o) noexcept
	{
		if (this != &o) {
			reset();
			fd_ = o.release();
		}
		return *this;
	}
	Fd(const Fd &) = delete;
	Fd &operator=(const Fd &) = delete;
	int get() const { return fd_; }
	explicit operator bool() const { return fd_ >= 0; }
	int release()
	{
		const int f = fd_;
		fd_ = -1;
		return f;
	}
	// Close the one owned (if any) and own `fd`.
	void reset(int fd = -1)
	{
		if (fd_ >= 0)
			::close(fd_);
		fd_ = fd;
	}

private:
	int fd_ = -1;
};

} // namespace rdmaswap
