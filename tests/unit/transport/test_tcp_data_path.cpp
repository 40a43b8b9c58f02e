// SPDX-License-Identifier: MIT
// Unit tests for TcpDataPath against a scripted memserver on 127.0.0.1: replies in any order,
// several replies per segment or one byte per segment, protocol errors (EIO, connection
// dropped), an error status that keeps the stream in step, the shared argument checks, the
// batch deadline and the stop request, with and without busy-polling. Paths sharing one
// connection: test_tcp_shared.cpp.
#include <catch2/catch.hpp>

#include <sched.h>

#include "common/transport/data_path_base.h"
#include "common/transport/tcp/data_path.h"
#include "common/util/deadline.h"
#include "tests/support/tcp_fake_memserver.h"

using namespace rdmaswap;
using namespace rdmaswap::test;
using namespace std::chrono_literals;


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
