// SPDX-License-Identifier: MIT
// Unit tests for the client's waits: transfers and RPCs bounded by a deadline per operation
// however slowly the peer moves the bytes, the stop signal, and a forget_slab that never waits.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/net/socket.h"
#include "common/obs/log.h"
#include "common/transport/control_client.h"
#include "common/transport/remote_server.h"
#include "common/util/deadline.h"
#include "common/wire/protocol.h"
#include "tests/support/loopback.h"
#include "tests/support/test_clock.h"

using namespace rdmaswap;
using namespace std::chrono_literals;

namespace {

struct Pair {
	Fd a, b;
	Pair()
	{
		int sv[2];
		REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
		a.reset(sv[0]);
		b.reset(sv[1]);
	}
};

using test::ms_since;

// Writes `data` to `fd` one byte every `every` until done or `stop`.
std::thread trickle_writer(int fd, std::vector<std::byte> data, std::chrono::milliseconds every,
			   std::atomic<bool> &stop)
{
	return std::thread([fd, data = std::move(data), every, &stop] {
		for (std::byte b : data) {
			if (stop.load() || ::send(fd, &b, 1, MSG_NOSIGNAL) != 1)
				return;
			std::this_thread::sleep_for(every);
		}
	});
}

} // namespace

TEST_CASE("recv_all_until: a peer trickling bytes cannot stretch the wait past the deadline",
	  "[socket]")
{
	Pair p;
	std::atomic<bool> stop{false};
	auto t = trickle_writer(p.b.get(), std::vector<std::byte>(100, std::byte{7}), 20ms, stop);
	std::array<std::byte, 100> buf;
	const auto start = Clock::now();
	const int r = recv_all_until(p.a.get(), buf.data(), buf.size(), start + 300ms);
	const double took = ms_since(start);
	stop = true;
	t.join();
	CHECK(r == ETIMEDOUT);
	CHECK(took >= 290);
	CHECK(took < 1000);
}

TEST_CASE("recv_all_until: the whole message, and ECONNRESET when the peer closes", "[socket]")
{
	Pair p;
	const char msg[] = "0123456789";
	REQUIRE(::send(p.b.get(), msg, 5, 0) == 5);
	std::thread t([&] {
		std::this_thread::sleep_for(50ms);
		::send(p.b.get(), msg + 5, 5, 0);
	});
	char got[10];
	CHECK(recv_all_until(p.a.get(), got, 10, Clock::now() + 5s) == 0);
	t.join();
	CHECK(std::memcmp(got, msg, 10) == 0);
	p.b.reset();
	CHECK(recv_all_until(p.a.get(), got, 1, Clock::now() + 5s) == ECONNRESET);
}

TEST_CASE("sendv_all_until: a peer that reads a byte at a time cannot stretch the send",
	  "[socket]")
{
	Pair p;
	std::atomic<bool> stop{false};
	std::thread reader([&] {
		std::byte b;
		while (!stop.load() && ::recv(p.b.get(), &b, 1, MSG_DONTWAIT) != 0)
			std::this_thread::sleep_for(20ms);
	});
	std::vector<std::byte> big(8 << 20); // far more than the socket buffers
	iovec iov[2] = {{big.data(), big.size() / 2}, {big.data() + big.size() / 2, big.size() / 2}};
	const auto start = Clock::now();
	const int r = sendv_all_until(p.a.get(), iov, 2, start + 300ms);
	const double took = ms_since(start);
	stop = true;
	reader.join();
	CHECK(r == ETIMEDOUT);
	CHECK(took >= 290);
	CHECK(took < 1000);
}

TEST_CASE("sendv_all_until: sends every iovec whole, on a blocking socket too", "[socket]")
{
	Pair p;
	std::vector<std::byte> a(300000, std::byte{1}), b(200000, std::byte{2});
	std::vector<std::byte> got(a.size() + b.size());
	int recv_r = -1; // Catch2 assertions only on the main thread (it is not thread-safe)
	std::thread reader([&] {
		recv_r = recv_all_until(p.b.get(), got.data(), got.size(), Clock::now() + 5s);
	});
	iovec iov[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
	CHECK(sendv_all_until(p.a.get(), iov, 2, Clock::now() + 5s) == 0);
	reader.join();
	CHECK(recv_r == 0);
	CHECK(std::equal(a.begin(), a.end(), got.begin()));
	CHECK(std::equal(b.begin(), b.end(), got.begin() + long(a.size())));
	CHECK(send_all_until(p.a.get(), a.data(), 10, Clock::now() + 5s) == 0);
	p.b.reset();
	CHECK(send_all_until(p.a.get(), a.data(), a.size(), Clock::now() + 5s) == EPIPE);
}

TEST_CASE("wait_ready: a passed deadline is ETIMEDOUT at once", "[socket]")
{
	Pair p;
	const auto start = Clock::now();
	CHECK(wait_ready(p.a.get(), POLLIN, start - 1ms) == ETIMEDOUT);
	CHECK(wait_ready(p.a.get(), POLLIN, start + 50ms) == ETIMEDOUT);
	CHECK(ms_since(start) < 500);
	CHECK(wait_ready(p.a.get(), POLLOUT, start + 5s) == 0);
}

TEST_CASE("request_stop wakes every wait at once with ECANCELED", "[socket][stop]")
{
	Pair p, q; // p: a receive waits on it; q: a send waits on it (no one reads)
	std::array<std::byte, 16> buf;
	int recv_r = -1, send_r = -1, sleep_r = -1;
	double recv_ms = 0, send_ms = 0;
	std::vector<std::byte> big(8 << 20);
	std::thread waiter([&] {
		const auto start = Clock::now();
		recv_r = recv_all_until(p.a.get(), buf.data(), buf.size(), start + 20s);
		recv_ms = ms_since(start);
	});
	std::thread sender([&] {
		const auto start = Clock::now();
		send_r = send_all_until(q.a.get(), big.data(), big.size(), start + 20s);
		send_ms = ms_since(start);
	});
	std::thread sleeper([&] { sleep_r = sleep_until(Clock::now() + 20s); });
	std::this_thread::sleep_for(100ms);
	CHECK_FALSE(stop_requested());
	request_stop();
	waiter.join();
	sender.join();
	sleeper.join();
	CHECK(stop_requested());
	CHECK(recv_r == ECANCELED);
	CHECK(send_r == ECANCELED);
	CHECK(sleep_r == ECANCELED);
	CHECK(recv_ms < 2000);
	CHECK(send_ms < 2000);
	// Later waits end at once too, until the (test-only) reset.
	CHECK(wait_ready(p.a.get(), POLLIN, Clock::now() + 20s) == ECANCELED);
	clear_stop_for_tests();
	CHECK_FALSE(stop_requested());
	CHECK(wait_ready(p.a.get(), POLLIN, Clock::now() + 20ms) == ETIMEDOUT);
}

TEST_CASE("recv_some_until: the blocking wait in slices takes the bytes, ends at the deadline "
	  "(not a slice later) and within a slice of a stop",
	  "[socket][stop]")
{
	Pair p;
	REQUIRE(set_recv_slice(p.a.get(), 100ms) == 0);
	std::array<std::byte, 64> buf{};
	iovec iov{buf.data(), buf.size()};
	size_t got = 0;
	SECTION("bytes that come while it blocks")
	{
		std::thread writer([&] {
			std::this_thread::sleep_for(150ms); // after the first slice ended empty
			const char msg[] = "hello";
			(void)!::write(p.b.get(), msg, 5);
		});
		const int r = recv_some_until(p.a.get(), &iov, 1, Clock::now() + 5s, true, 0ns, got,
					      100ms);
		writer.join();
		CHECK(r == 0);
		CHECK(got == 5);
		CHECK(std::memcmp(buf.data(), "hello", 5) == 0);
	}
	SECTION("the deadline, between two slices")
	{
		REQUIRE(set_recv_slice(p.a.get(), 200ms) == 0);
		const auto start = Clock::now();
		CHECK(recv_some_until(p.a.get(), &iov, 1, start + 500ms, true, 0ns, got, 200ms) ==
		      ETIMEDOUT);
		const double took = ms_since(start);
		CHECK(took >= 495);
		CHECK(took < 590); // not 600 (a third slice) or later: the rest is a poll
	}
	SECTION("a stop request")
	{
		std::thread stopper([] {
			std::this_thread::sleep_for(120ms);
			request_stop();
		});
		const auto start = Clock::now();
		const int r = recv_some_until(p.a.get(), &iov, 1, start + 20s, true, 0ns, got, 100ms);
		const double took = ms_since(start);
		stopper.join();
		clear_stop_for_tests();
		CHECK(r == ECANCELED);
		CHECK(took < 400);
	}
	SECTION("the peer closes")
	{
		p.b.reset();
		CHECK(recv_some_until(p.a.get(), &iov, 1, Clock::now() + 5s, true, 0ns, got, 100ms) ==
		      ECONNRESET);
	}
}

TEST_CASE("rpc: a reply trickled a byte at a time fails at the deadline, out of step",
	  "[socket][rpc]")
{
	Pair p;
	std::atomic<bool> stop{false};
	std::thread server([&] {
		std::array<std::byte, proto::kHeaderSize> hdr;
		if (recv_all_until(p.b.get(), hdr.data(), hdr.size(), Clock::now() + 5s))
			return;
		proto::Header h;
		if (!proto::decode_header(hdr, h).ok)
			return; // the client then times out waiting: the checks below fail
		proto::Header rh;
		rh.op = h.op;
		rh.flags = proto::kFlagResponse;
		rh.body_len = proto::kStatsReplySize;
		rh.request_id = h.request_id;
		std::vector<std::byte> reply(proto::kHeaderSize + proto::kStatsReplySize);
		proto::encode_header(rh, std::span(reply).first<proto::kHeaderSize>());
		for (std::byte b : reply) {
			if (stop.load())
				return;
			::send(p.b.get(), &b, 1, MSG_NOSIGNAL);
			std::this_thread::sleep_for(20ms);
		}
	});
	std::array<std::byte, proto::kStatsReplySize> reply;
	bool in_step = true;
	const auto start = Clock::now();
	const int r = rpc(p.a.get(), 9, proto::Op::Stats, {}, reply, start + 400ms, &in_step);
	const double took = ms_since(start);
	stop = true;
	server.join();
	CHECK(r == ETIMEDOUT);
	CHECK_FALSE(in_step);
	CHECK(took >= 390);
	CHECK(took < 1200);
}

namespace {

// A memserver that opens a session (no authentication: an --insecure server) and then never
// answers anything else: a control call on it waits until its deadline.
class SilentMemserver {
public:
	SilentMemserver()
	{
		sockaddr_in a;
		ls_ = test::listen_loopback(a);
		port_ = ntohs(a.sin_port);
		thread_ = std::thread([this] { serve(); });
	}
	~SilentMemserver()
	{
		stop_ = true;
		::shutdown(ls_.get(), SHUT_RDWR);
		thread_.join();
	}
	uint16_t port() const { return port_; }

private:
	void serve()
	{
		std::vector<Fd> conns;
		while (!stop_.load()) {
			if (wait_ready(ls_.get(), POLLIN, Clock::now() + 50ms))
				continue;
			Fd c(::accept4(ls_.get(), nullptr, nullptr, SOCK_CLOEXEC));
			if (!c)
				continue;
			std::array<std::byte, proto::kHeaderSize + proto::kHelloRequestSize> req;
			if (recv_all_until(c.get(), req.data(), req.size(), Clock::now() + 2s))
				continue;
			proto::Header h;
			if (!proto::decode_header(std::span(req).first<proto::kHeaderSize>(), h).ok ||
			    h.op != proto::Op::Hello)
				continue;
			proto::HelloReply hello;
			hello.session_id = 42;
			hello.token = 7;
			hello.slab_size = 1 << 20;
			hello.slabs_total = hello.slabs_free = 8;
			hello.max_io = proto::kMaxIo;
			hello.conn_id = 1;
			hello.challenge[0] = std::byte{1};
			proto::Header rh;
			rh.op = h.op;
			rh.flags = proto::kFlagResponse;
			rh.body_len = proto::kHelloReplySize;
			rh.request_id = h.request_id;
			std::array<std::byte, proto::kHeaderSize + proto::kHelloReplySize> out;
			proto::encode_header(rh, std::span(out).first<proto::kHeaderSize>());
			proto::encode(hello, std::span(out).subspan(proto::kHeaderSize));
			send_all_until(c.get(), out.data(), out.size(), Clock::now() + 2s);
			conns.push_back(std::move(c)); // held open, never answered again
		}
	}
	Fd ls_;
	uint16_t port_ = 0;
	std::atomic<bool> stop_{false};
	std::thread thread_;
};

} // namespace

TEST_CASE("RemoteServer::forget_slab never waits for a control call in flight",
	  "[socket][remote]")
{
	set_log_level("off");
	SilentMemserver ms;
	RemoteServerOptions o;
	o.endpoint = Endpoint{"127.0.0.1", ms.port()};
	o.timeout = 1500ms;
	RemoteServer srv(o);
	int alloc_r = -1;
	double alloc_ms = 0;
	std::thread caller([&] {
		SlabGrant g;
		const auto start = Clock::now();
		alloc_r = srv.alloc_slab(g); // holds the control connection until its deadline
		alloc_ms = ms_since(start);
	});
	std::this_thread::sleep_for(200ms);
	const auto start = Clock::now();
	srv.forget_slab(3);
	srv.forget_slab(5);
	const double forget_ms = ms_since(start);
	caller.join();
	CHECK(forget_ms < 100); // before: ~1.3 s, behind the ALLOC on ControlClient's mutex
	CHECK(alloc_r == ETIMEDOUT);
	CHECK(alloc_ms >= 1400);
	CHECK(alloc_ms < 3000);
	set_log_level("info");
}
