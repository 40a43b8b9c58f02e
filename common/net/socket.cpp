// SPDX-License-Identifier: MIT
// Socket helpers: connect and exact transfers bounded by a deadline (or a stop request).
#include "common/net/socket.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdexcept>
#include <unistd.h>

namespace rdmaswap {

std::string SockAddr::str() const
{
	char host[INET6_ADDRSTRLEN] = "?";
	uint16_t port = 0;
	if (ss.ss_family == AF_INET) {
		auto *a = reinterpret_cast<const sockaddr_in *>(&ss);
		inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
		port = ntohs(a->sin_port);
		return std::string(host) + ":" + std::to_string(port);
	}
	if (ss.ss_family == AF_INET6) {
		auto *a = reinterpret_cast<const sockaddr_in6 *>(&ss);
		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
		port = ntohs(a->sin6_port);
		return "[" + std::string(host) + "]:" + std::to_string(port);
	}
	return "?";
}

SockAddr resolve(const Endpoint &ep)
{
	addrinfo hints{};
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	addrinfo *res = nullptr;
	const std::string port = std::to_string(ep.port);
	const int rc = getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res);
	if (rc != 0)
		throw std::runtime_error("cannot resolve " + ep.str() + ": " + gai_strerror(rc));
	SockAddr a;
	std::memcpy(&a.ss, res->ai_addr, res->ai_addrlen);
	a.len = res->ai_addrlen;
	freeaddrinfo(res);
	return a;
}

void set_io_timeout(int fd, std::chrono::milliseconds t)
{
	timeval tv{};
	tv.tv_sec = t.count() / 1000;
	tv.tv_usec = (t.count() % 1000) * 1000;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

Fd connect_tcp(const SockAddr &addr, Deadline deadline)
{
	Fd fd(::socket(addr.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
	if (!fd)
		return {};
	int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr *>(&addr.ss), addr.len);
	if (rc < 0 && errno != EINPROGRESS)
		return {};
	if (rc < 0) {
		if (int err = wait_ready(fd.get(), POLLOUT, deadline)) {
			errno = err;
			return {};
		}
		int err = 0;
		socklen_t len = sizeof err;
		if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			return {};
		if (err) {
			errno = err;
			return {};
		}
	}
	// Blocking again, for callers of the plain transfers; the *_until ones do not care.
	const int flags = fcntl(fd.get(), F_GETFL);
	fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
	const int one = 1;
	setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

int send_all(int fd, const void *buf, size_t len)
{
	iovec iov{const_cast<void *>(buf), len};
	return sendv_all(fd, &iov, 1);
}

int sendv_all(int fd, iovec *iov, int iovcnt)
{
	while (iovcnt > 0) {
		msghdr msg{};
		msg.msg_iov = iov;
		msg.msg_iovlen = size_t(iovcnt);
		ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EWOULDBLOCK ? EAGAIN : errno;
		}
		while (iovcnt > 0 && size_t(n) >= iov->iov_len) {
			n -= ssize_t(iov->iov_len);
			iov++;
			iovcnt--;
		}
		if (iovcnt > 0) {
			iov->iov_base = static_cast<char *>(iov->iov_base) + n;
			iov->iov_len -= size_t(n);
		}
	}
	return 0;
}

int recv_all(int fd, void *buf, size_t len)
{
	auto *p = static_cast<char *>(buf);
	while (len > 0) {
		ssize_t n = ::recv(fd, p, len, 0);
		if (n == 0)
			return ECONNRESET;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EWOULDBLOCK ? EAGAIN : errno;
		}
		p += n;
		len -= size_t(n);
	}
	return 0;
}

int recv_all_until(int fd, void *buf, size_t len, std::chrono::steady_clock::time_point deadline)
{
	auto *p = static_cast<char *>(buf);
	while (len > 0) {
		// Try first: the bytes are often there already (a reply's body after its header).
		const ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= size_t(n);
			continue;
		}
		if (n == 0)
			return ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return errno;
		if (int err = wait_ready(fd, POLLIN, deadline))
			return err;
	}
	return 0;
}

int set_recv_slice(int fd, std::chrono::milliseconds slice)
{
	timeval tv{};
	tv.tv_sec = slice.count() / 1000;
	tv.tv_usec = (slice.count() % 1000) * 1000;
	return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 ? 0 : errno;
}

int recv_some_until(int fd, iovec *iov, int iovcnt, std::chrono::steady_clock::time_point deadline,
		    bool wait_first, std::chrono::nanoseconds spin, size_t &got,
		    std::chrono::milliseconds slice)
{
	got = 0;
	// One recvmsg with `flags`: true when it ends the call (`r`: 0 with `got` set, or the
	// error), false when nothing came (EAGAIN: none yet, or its slice passed; EINTR).
	int r = 0;
	const auto ended = [&](int flags) {
		msghdr msg{};
		msg.msg_iov = iov;
		msg.msg_iovlen = size_t(iovcnt);
		const ssize_t n = ::recvmsg(fd, &msg, flags);
		if (n > 0)
			got = size_t(n);
		else if (n == 0)
			r = ECONNRESET;
		else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
			return false;
		else
			r = errno;
		return true;
	};
	const auto spin_until = spin.count() ? std::chrono::steady_clock::now() + spin
					     : std::chrono::steady_clock::time_point{};
	// `tried`: a non-blocking recvmsg came first (not when waiting first without a spin).
	for (bool tried = !wait_first || spin.count();; tried = true) {
		if (tried) {
			if (ended(MSG_DONTWAIT))
				return r;
			if (spin.count()) {
				// Busy-poll: try again at once while the spin lasts (and the
				// deadline, and no stop request).
				const auto now = std::chrono::steady_clock::now();
				if (now < spin_until && now < deadline && !stop_requested())
					continue;
				spin = std::chrono::nanoseconds{0};
			}
		}
		// Wait: blocking in recvmsg a slice at a time while a whole one is left (see the
		// header), then poll for the rest.
		while (slice.count() > 0 && !stop_requested() &&
		       deadline - std::chrono::steady_clock::now() >= slice)
			if (ended(0))
				return r;
		// Past the deadline wait_ready says ETIMEDOUT without looking: try the recvmsg once
		// anyway if it was not tried yet (the bytes may have come while the caller waited on
		// another peer).
		if (const int err = wait_ready(fd, POLLIN, deadline); err && (tried || err != ETIMEDOUT))
			return err;
	}
}

int sendv_all_until(int fd, iovec *iov, int iovcnt, std::chrono::steady_clock::time_point deadline)
{
	while (iovcnt > 0) {
		msghdr msg{};
		msg.msg_iov = iov;
		msg.msg_iovlen = size_t(iovcnt);
		const ssize_t n = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				return errno;
			if (int err = wait_ready(fd, POLLOUT, deadline))
				return err;
			continue;
		}
		size_t left = size_t(n);
		while (iovcnt > 0 && left >= iov->iov_len) {
			left -= iov->iov_len;
			iov++;
			iovcnt--;
		}
		if (iovcnt > 0) {
			iov->iov_base = static_cast<char *>(iov->iov_base) + left;
			iov->iov_len -= left;
		}
	}
	return 0;
}

int send_all_until(int fd, const void *buf, size_t len, std::chrono::steady_clock::time_point deadline)
{
	iovec iov{const_cast<void *>(buf), len};
	return sendv_all_until(fd, &iov, 1, deadline);
}

} // namespace rdmaswap
