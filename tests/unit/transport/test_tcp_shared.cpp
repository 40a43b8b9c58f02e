// SPDX-License-Identifier: MIT
// Unit tests for TcpDataPath paths that share one connection, used by several threads at
// once, against a scripted memserver on 127.0.0.1: every reply reaches its own path, a
// timeout fails every batch on the connection and one reconnect serves all its paths, and a
// payload half-received by one thread is finished by the path it belongs to.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "common/obs/log.h"
#include "common/transport/data_path_base.h"
#include "common/transport/tcp/data_path.h"
#include "common/util/deadline.h"
#include "tests/support/tcp_fake_memserver.h"

using namespace rdmaswap;
using namespace rdmaswap::test;
using namespace std::chrono_literals;

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
