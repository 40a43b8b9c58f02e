// SPDX-License-Identifier: MIT
// Volume::close_idle_server (idle-disconnect=, issue 14): a donor is closed only when the
// volume holds nothing there; afterwards it gets no slab, no floor and no post.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "tests/support/fake_transport.h"
#include "tests/support/volume_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::test;

namespace {

// The donor that holds chunk 0 (written once), by its slab count.
size_t holder_of(const std::vector<std::shared_ptr<FakeBackend>> &bs)
{
	for (size_t i = 0; i < bs.size(); i++) {
		std::lock_guard lock(bs[i]->mu);
		if (!bs[i]->slabs.empty())
			return i;
	}
	return bs.size();
}

} // namespace

TEST_CASE("idle close: only a donor holding nothing is closed; it gets nothing afterwards",
	  "[volume][idle]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 16), backend("b", 16)};
	auto o = opts(8 * SS, 2);
	o.replicas = 1;
	auto v = make_volume(bs, o);
	Bytes shadow(8 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(SS, 1), 0) == 0);
	const size_t h = holder_of(bs);
	REQUIRE(h < 2);
	const size_t idle = 1 - h;

	CHECK_FALSE(v->close_idle_server(h)); // it holds chunk 0
	CHECK_FALSE(v->closed(h));
	CHECK(v->close_idle_server(idle));
	CHECK(v->closed(idle));
	CHECK(bs[idle]->closed.load());
	CHECK_FALSE(v->close_idle_server(idle)); // once
	// Every I/O channel's path at once, the maintenance thread's soon after.
	CHECK(bs[idle]->paths_closed.load() >= 2);
	CHECK(eventually([&] { return bs[idle]->paths_closed.load() == 3; }, std::chrono::seconds(5)));
	CHECK(v->status_text().find(bs[idle]->name + " state=closed ") != std::string::npos);
	CHECK(v->metrics_text().find("state=\"closed\"} 1") != std::string::npos);

	// New slabs go to the other donor only; everything reads back.
	for (uint64_t c = 1; c < 8; c++)
		REQUIRE(write_shadow(*v, shadow, pattern(SS, 10 + c), c * SS) == 0);
	CHECK(compare_all(*v, shadow) == -1);
	CHECK(bs[idle]->allocs.load() == 0);
	check_no_violations(bs);
}

TEST_CASE("idle close: a donor with a floor (a witness) is not closed", "[volume][idle]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 16), backend("b", 16)};
	auto o = opts(4 * SS, 2);
	o.replicas = 1;
	auto v = make_volume(bs, o);
	{
		std::lock_guard lock(bs[0]->mu);
		bs[0]->floors[3] = 7; // as record_floor leaves it on a witness
	}
	CHECK_FALSE(v->close_idle_server(0));
	CHECK_FALSE(v->closed(0));
	CHECK_FALSE(bs[0]->closed.load());
	CHECK(v->close_idle_server(1));
	Bytes shadow(4 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(SS, 3), 0) == 0); // placed on a, still open
	CHECK(compare_all(*v, shadow) == -1);
	check_no_violations(bs);
}

TEST_CASE("idle close: closing races with writes and trims; no slab ever lands on a closed "
	  "donor and every byte reads back",
	  "[volume][idle]")
{
	quiet();
	// c is never closed and can hold the whole volume.
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 32), backend("b", 32),
						     backend("c", 32)};
	for (auto &b : bs)
		b->alloc_delay_us = 200; // widen the window between placement and the grant
	auto o = opts(16 * SS, 4);
	o.replicas = 1;
	auto v = make_volume(bs, o);
	Bytes shadow(16 * SS);
	std::atomic<bool> done{false};
	std::atomic<int> failures{0};
	std::mutex shadow_mu;
	std::vector<std::thread> writers;
	for (int t = 0; t < 4; t++)
		writers.emplace_back([&, t] {
			for (int i = 0; i < 200; i++) {
				// Each thread owns 4 chunks: write or trim one of them.
				const uint64_t chunk = uint64_t(t) * 4 + uint64_t(i % 4);
				int r;
				if (i % 3 == 2) {
					r = v->trim(uint32_t(SS), chunk * SS);
					std::lock_guard lock(shadow_mu);
					std::fill_n(shadow.begin() + long(chunk * SS), SS, std::byte{0});
				} else {
					const Bytes d = pattern(SS, uint64_t(t * 1000 + i));
					r = v->pwrite(d.data(), uint32_t(SS), chunk * SS);
					std::lock_guard lock(shadow_mu);
					std::copy(d.begin(), d.end(), shadow.begin() + long(chunk * SS));
				}
				if (r)
					failures++;
			}
		});
	std::thread closer([&] {
		while (!done.load())
			for (size_t i = 0; i < 2; i++)
				if (v->close_idle_server(i))
					return;
	});
	for (auto &w : writers)
		w.join();
	done = true;
	closer.join();
	CHECK(failures.load() == 0);
	CHECK(compare_all(*v, shadow) == -1);
	for (size_t i = 0; i < 2; i++)
		if (v->closed(i)) {
			std::lock_guard lock(bs[i]->mu);
			CHECK(bs[i]->slabs.empty());
		}
	check_no_violations(bs);
}
