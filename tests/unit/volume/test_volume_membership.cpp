// SPDX-License-Identifier: MIT
// Unit tests for common/volume/volume against in-memory fake memservers (fake_transport.h): donors
// added and retired while it serves.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/volume/volume.h"
#include "tests/support/fake_transport.h"
#include "tests/support/volume_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::test;

TEST_CASE("volume: donors added while writers run get new slabs; retired ones get none",
	  "[volume][membership]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64)};
	for (auto &b : bs)
		b->live_free = true;
	auto o = opts(48 * SS, 2, 64 * KiB);
	o.replicas = 2;
	o.max_servers = 4;
	o.repair_interval = std::chrono::milliseconds(5);
	auto v = make_volume(bs, o);
	Bytes shadow(48 * SS);
	std::mutex shadow_mu;
	REQUIRE(write_shadow(*v, shadow, pattern(16 * SS, 1), 0) == 0);
	// Writers to the first 16 slabs while c is added (its data paths opened, then published).
	std::atomic<bool> stop{false};
	std::atomic<int> write_errors{0};
	std::thread writer([&] {
		for (uint64_t i = 0; !stop.load(); i++) {
			const uint64_t off = (i * 7919 * 4096) % (16 * SS - 8192);
			const Bytes d = pattern(8192, 100 + i);
			std::lock_guard lock(shadow_mu);
			if (write_shadow(*v, shadow, d, off) != 0)
				write_errors++;
		}
	});
	auto c = backend("c", 64);
	c->live_free = true;
	bs.push_back(c);
	CHECK(v->add_server(std::make_unique<FakeServer>(c)) == 2);
	CHECK(v->servers() == 3);
	{
		// New slabs: c is the emptiest, so each of the 16 gets a copy there.
		std::lock_guard lock(shadow_mu);
		REQUIRE(write_shadow(*v, shadow, pattern(16 * SS, 2), 16 * SS) == 0);
	}
	CHECK(c->live_slabs() == 16);
	// Retired: no new slab goes to c, though it is the emptiest.
	v->set_retired(2, true);
	CHECK(v->retired(2));
	{
		std::lock_guard lock(shadow_mu);
		REQUIRE(write_shadow(*v, shadow, pattern(16 * SS, 3), 32 * SS) == 0);
	}
	CHECK(c->live_slabs() == 16);
	CHECK(v->status_text().find("=c state=retired") != std::string::npos);
	// Its replicas still serve: reads go on while it is retired.
	{
		std::lock_guard lock(shadow_mu);
		CHECK(compare_all(*v, shadow) == -1);
	}
	// A restart of c (a new boot id): its replicas are invalid at once and repaired on a, b
	// and the next added donor d.
	auto d = backend("d", 64);
	d->live_free = true;
	bs.push_back(d);
	CHECK(v->add_server(std::make_unique<FakeServer>(d)) == 3);
	// A fifth donor does not fit max_servers=4.
	CHECK_THROWS_AS(v->add_server(std::make_unique<FakeServer>(backend("e", 64))),
			std::runtime_error);
	v->donor_restarted(2);
	// (A repair's copy is counted after it switched over: wait for the count too.)
	CHECK(eventually([&] { return v->stats().degraded == 0 && v->stats().repaired >= 16; }));
	stop = true;
	writer.join();
	CHECK(write_errors == 0);
	const VolumeStats st = v->stats();
	CHECK(st.lost == 0);
	CHECK(st.repaired >= 16);
	CHECK(d->live_slabs() >= 1);
	CHECK(compare_all(*v, shadow) == -1);
	check_no_violations(bs);
}

TEST_CASE("volume: add_server refuses a donor that does not fit", "[volume][membership]")
{
	quiet();
	auto v = make_volume({backend("a", 8)}, opts(4 * SS));
	// Another slab size.
	CHECK_THROWS_AS(v->add_server(std::make_unique<FakeServer>(backend("b", 8, 2 * SS))),
			std::runtime_error);
	// Its data paths cannot be opened: nothing is published.
	auto c = backend("c", 8);
	c->fail_open = true;
	CHECK_THROWS_AS(v->add_server(std::make_unique<FakeServer>(c)), std::runtime_error);
	CHECK(v->servers() == 1);
	c->fail_open = false;
	CHECK(v->add_server(std::make_unique<FakeServer>(c)) == 1);
}
