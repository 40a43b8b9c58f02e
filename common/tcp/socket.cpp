// SPDX-License-Identifier: MIT
// Blocking socket helpers with timeouts.
#include "common/tcp/socket.h"

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

void Fd::reset(int fd)
{
	if (fd_ >= 0)
		::close(fd_);
	fd_ = fd;
}

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

Fd connect_tcp(const SockAddr &addr, std::chrono::milliseconds connect_timeout,
	       std::chrono::milliseconds io_timeout)
{
	Fd fd(::socket(addr.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
	if (!fd)
		return {};
	int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr *>(&addr.ss), addr.len);
	if (rc < 0 && errno != EINPROGRESS)
		return {};
	if (rc < 0) {
		pollfd p{fd.get(), POLLOUT, 0};
		do
			rc = ::poll(&p, 1, int(connect_timeout.count()));
		while (rc < 0 && errno == EINTR);
		if (rc == 0) {
			errno = ETIMEDOUT;
			return {};
		}
		int err = 0;
		socklen_t len = sizeof err;
		if (rc < 0 || getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			return {};
		if (err) {
			errno = err;
			return {};
		}
	}
	const int flags = fcntl(fd.get(), F_GETFL);
	fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
	const int one = 1;
	setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (io_timeout.count() > 0)
		set_io_timeout(fd.get(), io_timeout);
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
		const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
			deadline - std::chrono::steady_clock::now());
		if (left.count() <= 0)
			return ETIMEDOUT;
		pollfd pf{fd, POLLIN, 0};
		const int rc = ::poll(&pf, 1, int(std::min<long long>(left.count() + 1, 1 << 30)));
		if (rc < 0 && errno != EINTR)
			return errno;
		if (rc <= 0)
			continue;
		const ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
		if (n == 0)
			return ECONNRESET;
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
				continue;
			return errno;
		}
		p += n;
		len -= size_t(n);
	}
	return 0;
}

} // namespace rdmaswap
