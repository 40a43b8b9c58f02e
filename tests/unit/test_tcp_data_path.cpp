// SPDX-License-Identifier: MIT
// Unit tests for TcpDataPath against a scripted memserver on 127.0.0.1: replies in any order,
// several replies per segment or one byte per segment, protocol errors (EIO, connection
// dropped), an error status that keeps the stream in step, the shared argument checks, the
// batch deadline and the stop request, with and without busy-polling.
#include <catch2/catch.hpp>

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

#include "common/data_path_base.h"
#include "common/deadline.h"
#include "common/log.h"
#include "common/protocol.h"
#include "common/tcp/socket.h"
#include "common/tcp/tcp_data_path.h"
#include "test_clock.h"

using namespace rdmaswap;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kSession = 42;
constexpr uint64_t kToken = 7;
constexpr uint64_t kSlabLen = 4 << 20;

using test::ms_since;

std::byte pattern(uint64_t off)
{
	return std::byte(uint8_t((off * 131) ^ (off >> 9)));
}

struct Request {
	proto::Header h;
	proto::IoRequest io;
	std::vector<std::byte> payload; // a WRITE's
};

// The bytes of a reply to `r`: its header (status, body length as given) and `payload`.
std::vector<std::byte> reply_bytes(const Request &r, uint32_t status,
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
		ls_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
		sockaddr_in a{};
		a.sin_family = AF_INET;
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		REQUIRE(::bind(ls_.get(), reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
		REQUIRE(::listen(ls_.get(), 8) == 0);
		socklen_t len = sizeof a;
		REQUIRE(::getsockname(ls_.get(), reinterpret_cast<sockaddr *>(&a), &len) == 0);
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

bool send_bytes(int fd, std::span<const std::byte> b)
{
	return send_all_until(fd, b.data(), b.size(), Clock::now() + 5s) == 0;
}

// True once the peer of `fd` has closed it (recv sees end of stream) within `wait`.
bool closed_by_peer(int fd, std::chrono::milliseconds wait = 2s)
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

} // namespace

TEST_CASE("TcpDataPath: replies in any order are matched by request id", "[tcp]")
{
	set_log_level("off");
	BusyPollScope bp(GENERATE(false, true));
	Harness t;
	// Reads: four requests in flight, answered 3, 1, 0, 2, each in its own segment.
	const uint64_t roff[4] = {0, 8192, 3 << 20, 65536};
	for (unsigned i = 0; i < 4; i++)
		REQUIRE(t.path->post_read(t.slab, roff[i], 4096, t.at(i * 4096)) == 0);
	bool served = false;
	std::thread s([&] {
		std::vector<Request> rq;
		if (!FakeMemserver::read_requests(t.conn.get(), 4, rq))
			return;
		for (unsigned i : {3u, 1u, 0u, 2u}) {
			if (!send_bytes(t.conn.get(), t.srv.answer(rq[i])))
				return;
			std::this_thread::sleep_for(2ms);
		}
		served = true;
	});
	CHECK(t.path->complete() == 0);
	s.join();
	REQUIRE(served);
	for (unsigned i = 0; i < 4; i++)
		CHECK(t.holds(i * 4096, roff[i], 4096));

	// Writes: three in flight, answered in reverse.
	for (unsigned i = 0; i < 3; i++) {
		std::memset(t.at(i * 4096), 0x50 + int(i), 4096);
		REQUIRE(t.path->post_write(t.slab, 100000 + i * 4096, 4096, t.at(i * 4096)) == 0);
	}
	served = false;
	s = std::thread([&] {
		std::vector<Request> rq;
		if (!FakeMemserver::read_requests(t.conn.get(), 3, rq))
			return;
		for (unsigned i : {2u, 1u, 0u})
			if (!send_bytes(t.conn.get(), t.srv.answer(rq[i])))
				return;
		served = true;
	});
	CHECK(t.path->complete() == 0);
	s.join();
	REQUIRE(served);
	for (unsigned i = 0; i < 3; i++)
		CHECK(t.holds(i * 4096, 100000 + i * 4096, 4096));
}

TEST_CASE("TcpDataPath: many replies in one segment, a reply a byte at a time, a payload "
	  "larger than the staging buffer",
	  "[tcp]")
{
	set_log_level("off");
	BusyPollScope bp(GENERATE(false, true));
	Harness t;

	// Sixteen reads (a full batch), all answered with one send.
	for (unsigned i = 0; i < kMaxBatch; i++)
		REQUIRE(t.path->post_read(t.slab, i * 5000, 3000, t.at(i * 3000)) == 0);
	bool served = false;
	std::thread s([&] {
		std::vector<Request> rq;
		if (!FakeMemserver::read_requests(t.conn.get(), kMaxBatch, rq))
			return;
		std::vector<std::byte> all;
		for (unsigned i = kMaxBatch; i-- > 0;) { // reversed, for good measure
			const auto r = t.srv.answer(rq[i]);
			all.insert(all.end(), r.begin(), r.end());
		}
		served = send_bytes(t.conn.get(), all);
	});
	CHECK(t.path->complete() == 0);
	s.join();
	REQUIRE(served);
	for (unsigned i = 0; i < kMaxBatch; i++)
		CHECK(t.holds(i * 3000, i * 5000, 3000));

	// Three reads whose replies arrive one byte per segment.
	const uint32_t len[3] = {100, 7, 300};
	size_t local = 0;
	for (unsigned i = 0; i < 3; i++, local += len[i - 1])
		REQUIRE(t.path->post_read(t.slab, 777 * (i + 1), len[i], t.at(local)) == 0);
	served = false;
	s = std::thread([&] {
		std::vector<Request> rq;
		if (!FakeMemserver::read_requests(t.conn.get(), 3, rq))
			return;
		std::vector<std::byte> all;
		for (unsigned i : {1u, 2u, 0u}) {
			const auto r = t.srv.answer(rq[i]);
			all.insert(all.end(), r.begin(), r.end());
		}
		for (std::byte b : all) {
			if (::send(t.conn.get(), &b, 1, MSG_NOSIGNAL) != 1)
				return;
			std::this_thread::sleep_for(100us);
		}
		served = true;
	});
	CHECK(t.path->complete() == 0);
	s.join();
	REQUIRE(served);
	local = 0;
	for (unsigned i = 0; i < 3; i++, local += len[i - 1])
		CHECK(t.holds(local, 777 * (i + 1), len[i]));

	// A read of kMaxIo (far more than the staging buffer), its header and first bytes
	// apart, then the rest in the same segment as the whole reply of a second read.
	REQUIRE(t.path->post_read(t.slab, 12345, proto::kMaxIo, t.at(0)) == 0);
	REQUIRE(t.path->post_read(t.slab, 999, 5000, t.at(proto::kMaxIo)) == 0);
	served = false;
	s = std::thread([&] {
		std::vector<Request> rq;
		if (!FakeMemserver::read_requests(t.conn.get(), 2, rq))
			return;
		auto big = t.srv.answer(rq[0]);
		const auto small = t.srv.answer(rq[1]);
		const size_t first = proto::kHeaderSize + 1000;
		if (!send_bytes(t.conn.get(), std::span(big).first(first)))
			return;
		std::this_thread::sleep_for(20ms);
		std::vector<std::byte> rest(big.begin() + long(first), big.end());
		rest.insert(rest.end(), small.begin(), small.end());
		served = send_bytes(t.conn.get(), rest);
	});
	CHECK(t.path->complete() == 0);
	s.join();
	REQUIRE(served);
	CHECK(t.holds(0, 12345, proto::kMaxIo));
	CHECK(t.holds(proto::kMaxIo, 999, 5000));
}

TEST_CASE("TcpDataPath: a reply that does not fit the batch is EIO and drops the connection",
	  "[tcp]")
{
	set_log_level("off");
	static const char *const kinds[] = {"an id that was never sent", "an id from before the batch",
					    "a second reply for one request", "the wrong op",
					    "the wrong length", "bytes after the last reply"};
	const int kind = GENERATE(range(0, 6));
	INFO(kinds[kind]);
	Harness t;
	// A first batch, answered right (its id is the one before the next batch's).
	REQUIRE(t.path->post_read(t.slab, 0, 4096, t.at(0)) == 0);
	std::thread s0([&] {
		std::vector<Request> rq;
		if (FakeMemserver::read_requests(t.conn.get(), 1, rq))
			send_bytes(t.conn.get(), t.srv.answer(rq[0]));
	});
	REQUIRE(t.path->complete() == 0);
	s0.join();
	for (unsigned i = 0; i < 3; i++)
		REQUIRE(t.path->post_read(t.slab, i * 4096, 4096, t.at(i * 4096)) == 0);
	std::vector<Request> rq;
	std::thread s([&] {
		if (!FakeMemserver::read_requests(t.conn.get(), 3, rq))
			return;
		// Request 0 answered right, then the faulty reply, in one segment.
		std::vector<std::byte> bad = t.srv.answer(rq[0]), b;
		const auto page = std::span<const std::byte>(t.srv.slab).first(4096);
		switch (kind) {
		case 0: b = reply_bytes(rq[1], 0, page, proto::Op{}, rq[2].h.request_id + 1); break;
		case 1: b = reply_bytes(rq[1], 0, page, proto::Op{}, rq[0].h.request_id - 1); break;
		case 2: b = t.srv.answer(rq[0]); break;
		case 3: b = reply_bytes(rq[1], 0, {}, proto::Op::Write); break;
		case 4: b = reply_bytes(rq[1], 0, page.first(4095)); break;
		default: {
			b = t.srv.answer(rq[1]);
			const auto c = t.srv.answer(rq[2]);
			b.insert(b.end(), c.begin(), c.end());
			b.resize(b.size() + 32, std::byte{0x55});
		}
		}
		bad.insert(bad.end(), b.begin(), b.end());
		send_bytes(t.conn.get(), bad);
	});
	const auto start = Clock::now();
	CHECK(t.path->complete() == EIO);
	CHECK(ms_since(start) < 2000); // not the 5 s timeout: failed as soon as it was seen
	s.join();
	REQUIRE(rq.size() == 3);
	CHECK(closed_by_peer(t.conn.get()));
}

TEST_CASE("TcpDataPath: after a protocol error, the next post reconnects (with backoff), "
	  "fencing the old connection",
	  "[tcp]")
{
	set_log_level("off");
	Harness t;
	REQUIRE(t.path->post_read(t.slab, 0, 4096, t.at(0)) == 0);
	std::thread s([&] {
		std::vector<Request> rq;
		if (FakeMemserver::read_requests(t.conn.get(), 1, rq))
			send_bytes(t.conn.get(), reply_bytes(rq[0], 0, {}, proto::Op::Write));
	});
	CHECK(t.path->complete() == EIO);
	s.join();
	// At once: the backoff (100 ms) refuses to reconnect.
	CHECK(t.path->post_read(t.slab, 0, 4096, t.at(0)) == EIO);
	CHECK(t.path->complete() == EIO);
	std::this_thread::sleep_for(150ms);
	uint64_t replaces = 0;
	Fd conn2;
	s = std::thread([&] {
		conn2 = t.srv.accept_joined(2, &replaces);
		std::vector<Request> rq;
		if (conn2 && FakeMemserver::read_requests(conn2.get(), 1, rq))
			send_bytes(conn2.get(), t.srv.answer(rq[0]));
	});
	CHECK(t.path->post_read(t.slab, 8192, 4096, t.at(0)) == 0);
	CHECK(t.path->complete() == 0);
	s.join();
	CHECK(replaces == 1); // the HELLO named the connection it replaces
	CHECK(t.holds(0, 8192, 4096));
	CHECK_FALSE(t.lost->load());
}

TEST_CASE("TcpDataPath: an error status for one request fails the batch, the others land, "
	  "and the connection stays in step",
	  "[tcp]")
{
	set_log_level("off");
	BusyPollScope bp(GENERATE(false, true));
	Harness t;
	for (unsigned i = 0; i < 3; i++)
		REQUIRE(t.path->post_read(t.slab, 4096 * (i + 5), 4096, t.at(i * 4096)) == 0);
	bool served = false;
	std::thread s([&] {
		std::vector<Request> rq;
		if (!FakeMemserver::read_requests(t.conn.get(), 3, rq))
			return;
		served = send_bytes(t.conn.get(), t.srv.answer(rq[2])) &&
			 send_bytes(t.conn.get(), reply_bytes(rq[1], EACCES, {})) &&
			 send_bytes(t.conn.get(), t.srv.answer(rq[0]));
	});
	CHECK(t.path->complete() == EACCES);
	s.join();
	REQUIRE(served);
	CHECK(t.holds(0, 4096 * 5, 4096));
	CHECK(t.holds(2 * 4096, 4096 * 7, 4096));
	// The same connection serves the next batch.
	served = false;
	s = std::thread([&] {
		std::vector<Request> rq;
		served = FakeMemserver::read_requests(t.conn.get(), 1, rq) &&
			 send_bytes(t.conn.get(), t.srv.answer(rq[0]));
	});
	CHECK(t.path->post_read(t.slab, 40960, 4096, t.at(0)) == 0);
	CHECK(t.path->complete() == 0);
	s.join();
	CHECK(served);
	CHECK(t.holds(0, 40960, 4096));
}

TEST_CASE("DataPathBase checks: range, region, batch full, reads and writes not mixed; the "
	  "first error wins and the stream stays in step",
	  "[tcp]")
{
	set_log_level("off");
	Harness t;
	SECTION("arguments refused before anything is sent")
	{
		CHECK(t.path->post_read(t.slab, kSlabLen - 100, 4096, t.at(0)) == EINVAL);
		CHECK(t.path->post_read(t.slab, 0, 0, t.at(0)) == EINVAL);
		CHECK(t.path->post_read(t.slab, 0, proto::kMaxIo + 1, t.at(0)) == EINVAL);
		CHECK(t.path->post_read(t.slab, 0, 4096, t.at(t.region.size() - 100)) == EINVAL);
		std::byte outside[16];
		CHECK(t.path->post_read(t.slab, 0, 16, outside) == EINVAL);
		CHECK(t.path->complete() == EINVAL);
	}
	SECTION("a write in a batch of reads, after the first read went out")
	{
		REQUIRE(t.path->post_read(t.slab, 0, 4096, t.at(0)) == 0);
		CHECK(t.path->post_write(t.slab, 0, 4096, t.at(4096)) == EINVAL);
		// Later posts report the latched error.
		CHECK(t.path->post_read(t.slab, 4096, 4096, t.at(4096)) == EINVAL);
		std::thread s([&] {
			std::vector<Request> rq;
			if (FakeMemserver::read_requests(t.conn.get(), 1, rq))
				send_bytes(t.conn.get(), t.srv.answer(rq[0]));
		});
		CHECK(t.path->complete() == EINVAL);
		s.join();
	}
	SECTION("a seventeenth post")
	{
		for (unsigned i = 0; i < kMaxBatch; i++)
			REQUIRE(t.path->post_write(t.slab, i * 64, 64, t.at(i * 64)) == 0);
		CHECK(t.path->post_write(t.slab, 0, 64, t.at(0)) == ENOBUFS);
		std::thread s([&] {
			std::vector<Request> rq;
			if (FakeMemserver::read_requests(t.conn.get(), kMaxBatch, rq))
				for (const Request &r : rq)
					send_bytes(t.conn.get(), t.srv.answer(r));
		});
		// The sixteen writes went out at their posts and are answered; the batch fails as
		// a whole.
		CHECK(t.path->complete() == ENOBUFS);
		s.join();
	}
	// In every case the connection is in step: the next batch works on it.
	bool served = false;
	std::thread s([&] {
		std::vector<Request> rq;
		served = FakeMemserver::read_requests(t.conn.get(), 2, rq) &&
			 send_bytes(t.conn.get(), t.srv.answer(rq[1])) &&
			 send_bytes(t.conn.get(), t.srv.answer(rq[0]));
	});
	CHECK(t.path->post_read(t.slab, 4096, 4096, t.at(0)) == 0);
	CHECK(t.path->post_read(t.slab, 8192, 4096, t.at(4096)) == 0);
	CHECK(t.path->complete() == 0);
	s.join();
	CHECK(served);
	CHECK(t.holds(0, 4096, 8192));
}

TEST_CASE("TcpDataPath: a silent memserver costs the batch's timeout; a stop ends the wait at "
	  "once",
	  "[tcp][stop]")
{
	set_log_level("off");
	BusyPollScope bp(GENERATE(false, true));
	SECTION("timeout")
	{
		Harness t(300ms);
		const auto start = Clock::now();
		REQUIRE(t.path->post_read(t.slab, 0, 4096, t.at(0)) == 0);
		CHECK(t.path->complete() == EIO);
		const double took = ms_since(start);
		CHECK(took >= 290);
		CHECK(took < 1500);
		CHECK(closed_by_peer(t.conn.get()));
	}
	SECTION("stop")
	{
		Harness t(10s);
		REQUIRE(t.path->post_read(t.slab, 0, 4096, t.at(0)) == 0);
		std::thread stopper([] {
			std::this_thread::sleep_for(100ms);
			request_stop();
		});
		const auto start = Clock::now();
		CHECK(t.path->complete() == EIO);
		const double took = ms_since(start);
		stopper.join();
		clear_stop_for_tests();
		CHECK(took < 1000);
		CHECK(closed_by_peer(t.conn.get()));
	}
}

TEST_CASE("TcpDataPath: a reply that came before the batch's deadline is taken even when "
	  "complete() starts after it",
	  "[tcp]")
{
	// Volume posts to several memservers, then completes them one by one: while it waited
	// on a hung one, the deadline of the next one's batch may pass with its answer there.
	set_log_level("off");
	BusyPollScope bp(GENERATE(false, true));
	Harness t(200ms);
	bool served = false;
	std::thread s([&] {
		std::vector<Request> rq;
		served = FakeMemserver::read_requests(t.conn.get(), 1, rq) &&
			 send_bytes(t.conn.get(), t.srv.answer(rq[0]));
	});
	REQUIRE(t.path->post_read(t.slab, 4096, 4096, t.at(0)) == 0);
	s.join();
	REQUIRE(served);
	std::this_thread::sleep_for(300ms);
	CHECK(t.path->complete() == 0);
	CHECK(t.holds(0, 4096, 4096));
}

TEST_CASE("affinity_cpus counts this process's CPUs", "[tcp]")
{
	cpu_set_t set;
	CPU_ZERO(&set);
	REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
	CHECK(affinity_cpus() == unsigned(CPU_COUNT(&set)));
	CHECK(affinity_cpus() >= 1);
	CHECK_FALSE(busy_poll()); // the default
}

namespace {

// Serves `fd` until it closes or `stop`: reads whatever requests are there (at least one), and
// answers them last first, so that replies of different paths interleave and come out of order.
void serve_reversed(FakeMemserver &srv, int fd, const std::atomic<bool> &stop)
{
	while (!stop) {
		if (wait_ready(fd, POLLIN, Clock::now() + 100ms))
			continue;
		std::vector<Request> rq;
		if (!FakeMemserver::read_requests(fd, 1, rq))
			return;
		while (wait_ready(fd, POLLIN, Clock::now() + 1ms) == 0 && rq.size() < 16)
			if (!FakeMemserver::read_requests(fd, 1, rq))
				return;
		std::vector<std::byte> out;
		for (auto r = rq.rbegin(); r != rq.rend(); ++r) {
			const auto b = srv.answer(*r);
			out.insert(out.end(), b.begin(), b.end());
		}
		if (!send_bytes(fd, out))
			return;
	}
}

} // namespace

TEST_CASE("TcpDataPath: paths sharing a connection, used by threads at once, each get their "
	  "own replies",
	  "[tcp][tcpshare]")
{
	set_log_level("off");
	BusyPollScope bp(GENERATE(false, true));
	Harness t;
	std::vector<std::unique_ptr<TcpDataPath>> paths;
	for (unsigned k = 1; k < TcpDataPath::kMaxSharing; k++)
		paths.push_back(std::make_unique<TcpDataPath>(*t.path));
	// The connection carries kMaxSharing paths: no more.
	CHECK_THROWS_AS(TcpDataPath(*t.path), std::runtime_error);
	std::atomic<bool> stop{false};
	std::thread server([&] { serve_reversed(t.srv, t.conn.get(), stop); });

	// Thread k uses remote [k MiB, k MiB + 64 KiB) and local [k MiB, ...): it knows what its
	// own range holds (a shadow copy), whatever the others do.
	constexpr uint64_t kRange = 64 * 1024;
	std::atomic<unsigned> bad{0}, failed{0};
	auto run = [&](unsigned k, TcpDataPath &p) {
		std::minstd_rand rng(k + 1);
		const uint64_t base = uint64_t(k) << 20;
		std::vector<std::byte> shadow(kRange);
		for (uint64_t i = 0; i < kRange; i++)
			shadow[i] = pattern(base + i);
		for (unsigned round = 0; round < 300; round++) {
			const bool write = rng() % 3 == 0;
			const unsigned n = 1 + rng() % 3;
			uint64_t off[3];
			for (unsigned j = 0; j < n; j++) {
				off[j] = (rng() % (kRange / 4096 - 1)) * 4096;
				std::byte *local = t.at(base + j * 8192);
				if (write) {
					for (unsigned b = 0; b < 4096; b++)
						local[b] = std::byte(uint8_t(rng()));
					// Pieces of one batch never overlap (Volume's never do).
					if (j && std::any_of(off, off + j, [&](uint64_t o) {
						    return o == off[j] || o + 4096 > off[j] && o < off[j] + 4096;
					    })) {
						off[j] = kRange; // skip: out of the range used
						continue;
					}
					std::memcpy(shadow.data() + off[j], local, 4096);
					if (p.post_write(t.slab, base + off[j], 4096, local))
						failed++;
				} else if (p.post_read(t.slab, base + off[j], 4096, local)) {
					failed++;
				}
			}
			if (p.complete())
				failed++;
			if (!write)
				for (unsigned j = 0; j < n; j++)
					if (std::memcmp(t.at(base + j * 8192), shadow.data() + off[j],
							4096))
						bad++;
		}
	};
	std::vector<std::thread> threads;
	threads.emplace_back(run, 0, std::ref(*t.path));
	for (unsigned k = 1; k < TcpDataPath::kMaxSharing; k++)
		threads.emplace_back(run, k, std::ref(*paths[k - 1]));
	for (auto &th : threads)
		th.join();
	stop = true;
	server.join();
	CHECK(failed == 0);
	CHECK(bad == 0);
}

TEST_CASE("TcpDataPath: a batch timing out on a shared connection fails every batch on it, "
	  "and the next posts reconnect once for all its paths",
	  "[tcp][tcpshare]")
{
	set_log_level("off");
	Harness t(400ms);
	TcpDataPath other(*t.path);
	// Both paths post a read; the server answers only the first path's, after 100 ms.
	REQUIRE(t.path->post_read(t.slab, 0, 4096, t.at(0)) == 0);
	const auto posted = Clock::now(); // the other batch's deadline: 400 ms from its post
	REQUIRE(other.post_read(t.slab, 8192, 4096, t.at(65536)) == 0);
	std::thread s([&] {
		std::vector<Request> rq;
		if (!FakeMemserver::read_requests(t.conn.get(), 2, rq))
			return;
		std::this_thread::sleep_for(100ms);
		const Request &first = rq[0].io.offset == 0 ? rq[0] : rq[1];
		send_bytes(t.conn.get(), t.srv.answer(first));
	});
	int r_other = -1;
	double other_ms = 0;
	std::thread waiter([&] {
		r_other = other.complete();
		other_ms = ms_since(posted);
	});
	CHECK(t.path->complete() == 0);
	CHECK(t.holds(0, 0, 4096));
	waiter.join();
	s.join();
	CHECK(r_other == EIO);
	CHECK(other_ms >= 350);
	CHECK(other_ms < 2000);
	CHECK(closed_by_peer(t.conn.get()));
	// After the backoff, one reconnect (fencing the old connection) serves both paths.
	std::this_thread::sleep_for(150ms);
	uint64_t replaces = 0;
	Fd conn2;
	std::atomic<bool> stop{false};
	s = std::thread([&] {
		conn2 = t.srv.accept_joined(2, &replaces);
		if (conn2)
			serve_reversed(t.srv, conn2.get(), stop);
	});
	CHECK(t.path->post_read(t.slab, 4096, 4096, t.at(0)) == 0);
	CHECK(t.path->complete() == 0);
	CHECK(other.post_read(t.slab, 12288, 4096, t.at(65536)) == 0);
	CHECK(other.complete() == 0);
	stop = true;
	s.join();
	CHECK(replaces == 1);
	CHECK(t.holds(0, 4096, 4096));
	CHECK(t.holds(65536, 12288, 4096));
}

TEST_CASE("TcpDataPath: a payload half-received by one path's reader is finished by the path "
	  "it belongs to",
	  "[tcp][tcpshare]")
{
	// The reader's own batch ends with another path's reply only partly in: the reading
	// passes to that waiting path, which receives the rest into its own buffer.
	set_log_level("off");
	Harness t(3s);
	TcpDataPath other(*t.path);
	constexpr uint32_t kBig = 128 * 1024; // more than the staging buffer
	REQUIRE(t.path->post_read(t.slab, 0, 4096, t.at(0)) == 0);
	REQUIRE(other.post_read(t.slab, 65536, kBig, t.at(1 << 20)) == 0);
	std::vector<Request> rq;
	REQUIRE(FakeMemserver::read_requests(t.conn.get(), 2, rq));
	const Request &small = rq[0].io.length == 4096 ? rq[0] : rq[1];
	const Request &big = rq[0].io.length == 4096 ? rq[1] : rq[0];
	int r_first = -1, r_other = -1;
	double other_ms = 0;
	std::thread first([&] { r_first = t.path->complete(); }); // the reader
	std::this_thread::sleep_for(100ms);
	std::thread second([&] {
		const auto start = Clock::now();
		r_other = other.complete(); // waits: the first one reads
		other_ms = ms_since(start);
	});
	std::this_thread::sleep_for(100ms);
	// The small reply whole and 10 KiB of the big one, then the rest after 200 ms.
	std::vector<std::byte> out = t.srv.answer(small);
	const auto b = t.srv.answer(big);
	out.insert(out.end(), b.begin(), b.begin() + 10240);
	REQUIRE(send_bytes(t.conn.get(), out));
	first.join();
	std::this_thread::sleep_for(200ms);
	REQUIRE(send_bytes(t.conn.get(), std::span(b).subspan(10240)));
	second.join();
	CHECK(r_first == 0);
	CHECK(r_other == 0);
	CHECK(other_ms < 1500); // not the 3 s timeout
	CHECK(t.holds(0, 0, 4096));
	CHECK(t.holds(1 << 20, 65536, kBig));
}
