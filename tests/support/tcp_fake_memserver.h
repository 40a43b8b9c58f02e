// SPDX-License-Identifier: MIT
// A scripted memserver for the TcpDataPath unit tests (test_tcp_data_path.cpp, test_tcp_shared.cpp):
// it accepts connections on 127.0.0.1 and answers their HELLO; a test then reads requests and
// answers them as its script says. And the real TcpDataPath joined to it (Harness).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>
#include "common/net/socket.h"
#include "common/obs/log.h"
#include "common/transport/data_path_base.h"
#include "common/transport/tcp/data_path.h"
#include "common/util/deadline.h"
#include "common/wire/protocol.h"
#include "tests/support/loopback.h"
#include "tests/support/test_clock.h"
#include <catch2/catch.hpp>

namespace rdmaswap::test {

using namespace std::chrono_literals;

inline constexpr uint64_t kSession = 42;
inline constexpr uint64_t kToken = 7;
inline constexpr uint64_t kSlabLen = 4 << 20;


inline std::byte pattern(uint64_t off)
{
	return std::byte(uint8_t((off * 131) ^ (off >> 9)));
}

struct Request {
	proto::Header h;
	proto::IoRequest io;
	std::vector<std::byte> payload; // a WRITE's
};

// The bytes of a reply to `r`: its header (status, body length as given) and `payload`.
inline std::vector<std::byte> reply_bytes(const Request &r, uint32_t status,
				   std::span<const std::byte> payload, proto::Op op = proto::Op{},
				   std::optional<uint64_t> id = std::nullopt)
{
	proto::Header h;
	h.op = op == proto::Op{} ? r.h.op : op;
	h.flags = proto::kFlagResponse;
	h.status = status;
	h.body_len = uint32_t(payload.size());
	h.request_id = id.value_or(r.h.request_id);
	std::vector<std::byte> out(proto::kHeaderSize + payload.size());
	proto::encode_header(h, std::span(out).first<proto::kHeaderSize>());
	if (!payload.empty())
		std::memcpy(out.data() + proto::kHeaderSize, payload.data(), payload.size());
	return out;
}

// A memserver's data side on 127.0.0.1 (no authentication: an --insecure server): accepts
// connections and answers their HELLO; the test then reads requests and answers them as its
// script says. Its "slab" holds pattern() bytes until written.
class FakeMemserver {
public:
	FakeMemserver() : slab(kSlabLen)
	{
		for (uint64_t i = 0; i < kSlabLen; i++)
			slab[i] = pattern(i);
		sockaddr_in a;
		ls_ = listen_loopback(a);
		std::memcpy(&addr.ss, &a, sizeof a);
		addr.len = sizeof a;
	}

	// Accept the next connection within `wait` and answer its HELLO with connection id
	// `conn_id`; `replaces` gets the HELLO's `replaces`. An invalid Fd on failure.
	Fd accept_joined(uint64_t conn_id, uint64_t *replaces = nullptr,
			 std::chrono::milliseconds wait = 5s)
	{
		if (wait_ready(ls_.get(), POLLIN, Clock::now() + wait))
			return {};
		Fd c(::accept4(ls_.get(), nullptr, nullptr, SOCK_CLOEXEC));
		if (!c)
			return {};
		const int one = 1;
		setsockopt(c.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		std::array<std::byte, proto::kHeaderSize + proto::kHelloRequestSize> req;
		if (recv_all_until(c.get(), req.data(), req.size(), Clock::now() + 5s))
			return {};
		proto::Header h;
		proto::HelloRequest hr;
		if (!proto::decode_header(std::span(req).first<proto::kHeaderSize>(), h).ok ||
		    h.op != proto::Op::Hello ||
		    !proto::decode(std::span(req).subspan(proto::kHeaderSize), hr).ok)
			return {};
		if (replaces)
			*replaces = hr.replaces;
		proto::HelloReply hello;
		hello.session_id = kSession;
		hello.token = kToken;
		hello.slab_size = kSlabLen;
		hello.slabs_total = hello.slabs_free = 8;
		hello.max_io = proto::kMaxIo;
		hello.conn_id = conn_id;
		hello.challenge[0] = std::byte{1};
		Request r{h, {}, {}};
		std::array<std::byte, proto::kHelloReplySize> body;
		proto::encode(hello, body);
		const auto out = reply_bytes(r, 0, body);
		if (send_all_until(c.get(), out.data(), out.size(), Clock::now() + 5s))
			return {};
		return c;
	}

	// Read `n` READ/WRITE requests from `fd` (a WRITE's payload too). False on any error.
	static bool read_requests(int fd, unsigned n, std::vector<Request> &out)
	{
		for (unsigned i = 0; i < n; i++) {
			std::array<std::byte, proto::kHeaderSize + proto::kIoRequestSize> m;
			if (recv_all_until(fd, m.data(), m.size(), Clock::now() + 5s))
				return false;
			Request r;
			if (!proto::decode_header(std::span(m).first<proto::kHeaderSize>(), r.h).ok ||
			    !proto::decode(std::span(m).subspan(proto::kHeaderSize), r.io).ok)
				return false;
			if (r.h.op == proto::Op::Write) {
				r.payload.resize(r.io.length);
				if (recv_all_until(fd, r.payload.data(), r.payload.size(),
						   Clock::now() + 5s))
					return false;
			}
			out.push_back(std::move(r));
		}
		return true;
	}

	// The correct reply to `r` (a READ gets the slab's bytes; a WRITE is applied).
	std::vector<std::byte> answer(const Request &r)
	{
		if (r.h.op == proto::Op::Write) {
			std::memcpy(slab.data() + r.io.offset, r.payload.data(), r.payload.size());
			return reply_bytes(r, 0, {});
		}
		return reply_bytes(r, 0, std::span(slab).subspan(r.io.offset, r.io.length));
	}

	SockAddr addr;
	std::vector<std::byte> slab;

private:
	Fd ls_;
};

inline bool send_bytes(int fd, std::span<const std::byte> b)
{
	return send_all_until(fd, b.data(), b.size(), Clock::now() + 5s) == 0;
}

// True once the peer of `fd` has closed it (recv sees end of stream) within `wait`.
inline bool closed_by_peer(int fd, std::chrono::milliseconds wait = 2s)
{
	const auto deadline = Clock::now() + wait;
	std::array<std::byte, 4096> junk;
	for (;;) {
		if (wait_ready(fd, POLLIN, deadline))
			return false;
		const ssize_t n = ::recv(fd, junk.data(), junk.size(), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
	}
}

// The real TcpDataPath, joined to a FakeMemserver; `conn` is the server's end.
struct Harness {
	explicit Harness(std::chrono::milliseconds timeout = 5s)
		: region(4 << 20), lost(std::make_shared<std::atomic<bool>>(false))
	{
		std::thread t([&] { conn = srv.accept_joined(1); });
		try {
			path = std::make_unique<TcpDataPath>(srv.addr, nullptr, kSession, kToken,
							     timeout, region, lost);
		} catch (...) {
		}
		t.join();
		REQUIRE(path);
		REQUIRE(conn);
	}
	std::byte *at(size_t off) { return region.data() + off; }
	bool holds(size_t local, uint64_t remote, uint32_t len) const
	{
		return std::memcmp(region.data() + local, srv.slab.data() + remote, len) == 0;
	}

	FakeMemserver srv;
	std::vector<std::byte> region;
	std::shared_ptr<std::atomic<bool>> lost;
	std::unique_ptr<TcpDataPath> path;
	Fd conn;
	SlabGrant slab{1, kSlabLen, 0, 0};
};

// Restores the busy-poll default (off) when a test that changed it ends.
struct BusyPollScope {
	explicit BusyPollScope(bool on) { set_busy_poll(on); }
	~BusyPollScope() { set_busy_poll(false); }
};

} // namespace rdmaswap::test
