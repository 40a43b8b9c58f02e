// SPDX-License-Identifier: MIT
// Small RAII and I/O helpers over TCP sockets; client transfers are bounded by a deadline per
// operation (common/util/deadline.h), never by a per-syscall timeout.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "common/util/config.h"
#include "common/util/deadline.h"
#include "common/util/fd.h"

namespace rdmaswap {

// A resolved address, kept so that reconnecting needs no name lookup (no allocation).
struct SockAddr {
	sockaddr_storage ss{};
	socklen_t len = 0;
	std::string str() const;
};

// Resolve host:port (numeric or by name). Throws std::runtime_error naming the endpoint.
SockAddr resolve(const Endpoint &ep);

// Connect by `deadline` (or until a stop is requested); sets TCP_NODELAY, and no socket
// timeouts: every later wait on it is bounded by its own deadline (the *_until calls below;
// a caller may add receive slices within it: set_recv_slice).
// Returns the socket, or an invalid Fd with errno set (ETIMEDOUT, ECANCELED, a connect errno).
Fd connect_tcp(const SockAddr &addr, Deadline deadline);

// Blocking exact transfers, bounded per syscall by SO_RCVTIMEO/SO_SNDTIMEO if the socket has
// them (the memserver's). Return 0, or an errno: EPIPE/ECONNRESET for a closed peer (recv of 0
// bytes is ECONNRESET), EAGAIN when a socket timeout fired, EINTR never escapes.
int send_all(int fd, const void *buf, size_t len);
int sendv_all(int fd, iovec *iov, int iovcnt); // modifies iov
int recv_all(int fd, void *buf, size_t len);

// Exact transfers that give up at `deadline` however slowly the peer takes or gives the bytes
// (1 byte every second still ends at the deadline): they poll for POLLOUT/POLLIN until the
// deadline and transfer with MSG_DONTWAIT (MSG_NOSIGNAL for sends), whether or not the socket
// is non-blocking. Return 0; ETIMEDOUT at the deadline; ECANCELED at once when a stop is
// requested (request_stop()) while they wait; ECONNRESET when the peer closed (recv of 0
// bytes); or the socket's errno. A failed transfer leaves the stream out of step: the caller
// drops the connection. No allocation. sendv_all_until modifies iov.
int sendv_all_until(int fd, iovec *iov, int iovcnt, std::chrono::steady_clock::time_point deadline);
int send_all_until(int fd, const void *buf, size_t len, std::chrono::steady_clock::time_point deadline);
int recv_all_until(int fd, void *buf, size_t len, std::chrono::steady_clock::time_point deadline);

// Receive what is there, at least one byte, into `iov` (filled in order, as recvmsg does):
// one recvmsg with MSG_DONTWAIT, and when nothing is there yet, wait for it until `deadline`:
// first by spinning for `spin` (busy-polling: non-blocking recvmsg again and again, no sleep),
// then with poll. `wait_first`: wait before the first try (when the bytes cannot be there
// yet, e.g. right after the request went out; a try would only cost a syscall); once the
// deadline has passed it still tries once (the bytes may be there). With `slice` > 0 a wait
// is a blocking recvmsg, one system call instead of poll + recvmsg: the socket must be
// blocking with SO_RCVTIMEO = `slice` (set_recv_slice); it blocks a slice at a time while a
// whole slice is left before `deadline` (and no stop was requested: a stop ends the wait
// within one slice, not at once), then polls for the rest. On 0, `got` is the number
// of bytes received (> 0). Errors as recv_all_until: ETIMEDOUT, ECANCELED, ECONNRESET, or the
// socket's errno. No allocation.
int recv_some_until(int fd, iovec *iov, int iovcnt, std::chrono::steady_clock::time_point deadline,
		    bool wait_first, std::chrono::nanoseconds spin, size_t &got,
		    std::chrono::milliseconds slice = std::chrono::milliseconds{0});
// SO_RCVTIMEO = `slice` (> 0), for recv_some_until's blocking waits. 0 or errno.
int set_recv_slice(int fd, std::chrono::milliseconds slice);

// Per-syscall SO_RCVTIMEO/SO_SNDTIMEO (the memserver's sockets; clients use deadlines, the TCP
// data path's receive slices within them: set_recv_slice).
void set_io_timeout(int fd, std::chrono::milliseconds t);

} // namespace rdmaswap
