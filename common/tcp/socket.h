// SPDX-License-Identifier: MIT
// Small RAII and blocking-I/O helpers over TCP sockets, with bounded waits.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "common/config.h"

namespace rdmaswap {

// Owns one file descriptor; closes it on destruction. Move-only.
class Fd {
public:
	Fd() = default;
	explicit Fd(int fd) : fd_(fd) {}
	~Fd() { reset(); }
	Fd(Fd &&o) noexcept : fd_(o.release()) {}
	Fd &operator=(Fd &&o) noexcept { if (this != &o) { reset(); fd_ = o.release(); } return *this; }
	Fd(const Fd &) = delete;
	Fd &operator=(const Fd &) = delete;
	int get() const { return fd_; }
	explicit operator bool() const { return fd_ >= 0; }
	int release() { int f = fd_; fd_ = -1; return f; }
	void reset(int fd = -1);
private:
	int fd_ = -1;
};

// A resolved address, kept so that reconnecting needs no name lookup (no allocation).
struct SockAddr {
	sockaddr_storage ss{};
	socklen_t len = 0;
	std::string str() const;
};

// Resolve host:port (numeric or by name). Throws std::runtime_error naming the endpoint.
SockAddr resolve(const Endpoint &ep);

// Connect with a timeout; sets TCP_NODELAY and send/receive timeouts of `io_timeout` (0: none).
// Returns the socket, or an invalid Fd with errno set.
Fd connect_tcp(const SockAddr &addr, std::chrono::milliseconds connect_timeout,
	       std::chrono::milliseconds io_timeout);

// Blocking exact transfers. Return 0, or an errno: EPIPE/ECONNRESET for a closed peer
// (recv of 0 bytes is ECONNRESET), EAGAIN when a socket timeout fired, EINTR never escapes.
int send_all(int fd, const void *buf, size_t len);
int sendv_all(int fd, iovec *iov, int iovcnt); // modifies iov
int recv_all(int fd, void *buf, size_t len);
// recv_all that gives up (ETIMEDOUT) at `deadline` however the bytes trickle in: bounds what
// a slow sender can hold.
int recv_all_until(int fd, void *buf, size_t len, std::chrono::steady_clock::time_point deadline);

void set_io_timeout(int fd, std::chrono::milliseconds t);

} // namespace rdmaswap
