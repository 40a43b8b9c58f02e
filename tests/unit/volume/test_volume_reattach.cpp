// SPDX-License-Identifier: MIT
// Unit tests for common/volume/volume against in-memory fake memservers (fake_transport.h): a restart
// reattaching its slabs (epochs, floors), and give-back moves.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/volume/volume.h"
#include "tests/support/fake_transport.h"
#include "tests/support/volume_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::test;

namespace {
// Three fake donors bound to a volume (tags, epochs, floors), for the reattach tests.
std::vector<std::shared_ptr<FakeBackend>> bound_backends()
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64), backend("c", 64)};
	for (auto &b : bs)
		b->bound = true;
	return bs;
}

// Make every transfer and control call of `b` fail with `err` (0: work again).
void fail_everything(FakeBackend &b, int err)
{
	b.complete_error = err;
	b.post_error = err;
	b.free_error = err;
	b.tag_error = err;
}

VolumeOptions reattach_opts(uint64_t size, std::chrono::milliseconds repair_interval)
{
	auto o = opts(size);
	o.replicas = 2;
	o.repair_interval = repair_interval;
	return o;
}

// Whether `v` has counted `n` give-back moves (up to eventually's limit). A move gives the old
// slab back first and counts itself after, so a donor seen empty does not mean all are counted.
bool counted_moves(const Volume &v, uint64_t n)
{
	return eventually([&] { return v.stats().migrated >= n; });
}
} // namespace

TEST_CASE("volume: a restart never reads a replica that missed writes (epochs)", "[volume][reattach]")
{
	const auto bs = bound_backends();
	const auto o = reattach_opts(8 * SS, std::chrono::milliseconds(20));
	Bytes shadow(8 * SS);
	{
		auto v = make_volume(bs, o);
		REQUIRE(write_shadow(*v, shadow, pattern(8 * SS, 1), 0) == 0);
		// Donor b fails every transfer: the rewrite goes to the other replicas only, so
		// b's replicas miss it, but b keeps them (it never hears a FREE: like a hung donor).
		fail_everything(*bs[1], EIO);
		REQUIRE(write_shadow(*v, shadow, pattern(8 * SS, 2), 0) == 0);
		CHECK(v->stats().epoch_raises > 0);
		CHECK(compare_all(*v, shadow) == -1);
		// The plugin dies here (the Volume goes; the backends keep every slab and tag).
	}
	fail_everything(*bs[1], 0);
	size_t stale_on_b = 0;
	{
		std::lock_guard lock(bs[1]->mu);
		stale_on_b = bs[1]->slabs.size();
	}
	REQUIRE(stale_on_b > 0); // the hung donor still holds replicas of the first pattern
	for (auto &b : bs)
		b->reattach = true;
	auto v2 = make_volume(bs, o);
	const VolumeStats st = v2->stats();
	CHECK(st.reattached == 8);
	CHECK(st.reattach_stale == stale_on_b);
	CHECK(st.lost == 0);
	CHECK(compare_all(*v2, shadow) == -1); // the second pattern, never the first
	check_no_violations(bs);
}

TEST_CASE("volume: a restart that finds only a replica older than its floor reads EIO",
	  "[volume][reattach]")
{
	std::vector<std::shared_ptr<FakeBackend>> bs;
	// No repair: keep the degraded state.
	const auto o = reattach_opts(4 * SS, std::chrono::hours(1));
	Bytes shadow(4 * SS);
	std::set<uint64_t> on_b;
	// Placement is random and may leave b without a replica (then there is nothing to test):
	// start again until b holds one.
	for (int attempt = 0; attempt < 50 && on_b.empty(); attempt++) {
		bs = bound_backends();
		{
			auto v = make_volume(bs, o);
			REQUIRE(write_shadow(*v, shadow, pattern(4 * SS, 3), 0) == 0);
			fail_everything(*bs[1], EIO);
			REQUIRE(write_shadow(*v, shadow, pattern(4 * SS, 4), 0) == 0);
		}
		fail_everything(*bs[1], 0);
		std::lock_guard lock(bs[1]->mu);
		for (auto &[id, t] : bs[1]->tags)
			on_b.insert(t.first);
	}
	// Double fault: every newest replica of a chunk b also held is lost (its donor's
	// memory went), and b's stale replica survives. The third donor recorded the floor: such
	// chunks must read EIO, never b's stale bytes.
	REQUIRE(!on_b.empty());
	for (size_t k : {size_t(0), size_t(2)}) {
		std::lock_guard lock(bs[k]->mu);
		for (auto it = bs[k]->tags.begin(); it != bs[k]->tags.end();) {
			if (on_b.count(it->second.first)) {
				bs[k]->slabs.erase(it->first);
				it = bs[k]->tags.erase(it);
			} else {
				++it;
			}
		}
	}
	for (auto &b : bs)
		b->reattach = true;
	auto v2 = make_volume(bs, o);
	uint64_t eio = 0, good = 0;
	for (uint64_t c = 0; c < 4; c++) {
		Bytes buf(SS);
		const int e = v2->pread(buf.data(), uint32_t(SS), c * SS);
		if (e == 0) {
			CHECK(std::memcmp(buf.data(), shadow.data() + c * SS, SS) == 0); // never stale
			good++;
		} else {
			CHECK(e == EIO);
			eio++;
		}
	}
	CHECK(eio == on_b.size());
	CHECK(good == 4 - on_b.size());
	CHECK(v2->stats().lost == on_b.size());
}

TEST_CASE("volume: give-back moves wanted slabs to other donors while I/O goes on",
	  "[volume][giveback]")
{
	quiet();
	const unsigned replicas = GENERATE(1u, 2u);
	INFO("replicas=" << replicas);
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64),
						     backend("c", 64)};
	auto o = opts(24 * SS, 2, 64 * KiB);
	o.replicas = replicas;
	o.repair_interval = std::chrono::milliseconds(5);
	auto v = make_volume(bs, o);
	Bytes shadow(24 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(24 * SS, 1), 0) == 0);
	REQUIRE(eventually([&] { return v->stats().degraded == 0; }));
	const size_t on_a = bs[0]->live_slabs();
	REQUIRE(on_a > 0);

	// A writer keeps changing the data while donor a wants all its slabs back.
	std::atomic<bool> stop{false};
	std::atomic<int> write_errors{0};
	std::mutex shadow_mu;
	std::thread writer([&] {
		for (uint64_t i = 0; !stop.load(); i++) {
			const uint64_t off = (i * 7919 * 4096) % (24 * SS - 8192);
			const Bytes d = pattern(8192, 100 + i);
			std::lock_guard lock(shadow_mu);
			if (write_shadow(*v, shadow, d, off) != 0)
				write_errors++;
		}
	});
	bs[0]->want_all();
	const bool moved =
		eventually([&] { return bs[0]->live_slabs() == 0; }) && counted_moves(*v, on_a);
	stop = true;
	writer.join();
	CHECK(moved);
	CHECK(write_errors == 0);
	CHECK(bs[0]->frees.load() == on_a); // freed by the client, after the move
	const VolumeStats st = v->stats();
	CHECK(st.migrated == on_a);
	// Each slab copied whole once, plus the blocks the writer changed during its copy again.
	CHECK(st.migrate_bytes >= on_a * SS);
	CHECK(st.migrate_bytes <= on_a * SS * 4);
	CHECK(v->status_text().find("migrate_ms=") != std::string::npos);
	CHECK(st.lost == 0);
	CHECK(st.degraded == 0);
	CHECK(st.slabs_live == 24);
	// Every slab still has `replicas` copies, on b and c only, never two on one donor.
	CHECK(bs[1]->live_slabs() + bs[2]->live_slabs() == 24 * replicas);
	if (replicas == 2) {
		CHECK(bs[1]->live_slabs() == 24);
		CHECK(bs[2]->live_slabs() == 24);
	}
	CHECK(compare_all(*v, shadow) == -1);
	CHECK(v->status_text().find("migrated=" + std::to_string(on_a) + "\n") != std::string::npos);
	check_no_violations(bs);
}

TEST_CASE("volume: give-back with nowhere to move keeps the slabs and their data",
	  "[volume][giveback]")
{
	quiet();
	// Donor b is full: nothing can move off a.
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64)};
	bs[1]->alloc_error = ENOSPC;
	auto o = opts(8 * SS, 2, 64 * KiB);
	o.repair_interval = std::chrono::milliseconds(5);
	auto v = make_volume(bs, o);
	Bytes shadow(8 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(8 * SS, 3), 0) == 0);
	bs[0]->want_all();
	CHECK(eventually([&] { return v->stats().migrate_pending == 8; }));
	CHECK(bs[0]->live_slabs() == 8);
	CHECK(bs[0]->frees.load() == 0); // never free a slab still in use
	CHECK(v->stats().migrated == 0);
	CHECK(compare_all(*v, shadow) == -1);
	// Room appears: the slabs move.
	bs[1]->alloc_error = 0;
	CHECK(eventually([&] { return bs[0]->live_slabs() == 0; }));
	CHECK(eventually([&] { return v->stats().migrate_pending == 0; }));
	CHECK(counted_moves(*v, 8));
	CHECK(v->stats().migrated == 8);
	CHECK(compare_all(*v, shadow) == -1);
	check_no_violations(bs);
}

TEST_CASE("volume: a donor that fails the give-back poll is not asked again during its cooldown",
	  "[volume][giveback]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64)};
	auto o = opts(8 * SS, 2, 64 * KiB);
	o.repair_interval = std::chrono::milliseconds(5);
	o.down_cooldown = std::chrono::seconds(60);
	o.replicas = 2; // both donors hold slabs of ours: both are polled every pass
	auto v = make_volume(bs, o);
	Bytes shadow(8 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(8 * SS, 9), 0) == 0);
	REQUIRE(eventually([&] { return bs[0]->wanted_polls.load() > 3; }));
	bs[0]->wanted_error = EAGAIN;
	const uint64_t before = bs[0]->wanted_polls.load();
	REQUIRE(eventually([&] { return bs[1]->wanted_polls.load() > before + 20; }));
	CHECK(bs[0]->wanted_polls.load() <= before + 2); // one failed poll, then cooldown
	// I/O goes on.
	CHECK(compare_all(*v, shadow) == -1);
	check_no_violations(bs);
}

TEST_CASE("volume: only donors holding our slabs are asked which they want back; every donor's "
	  "hint is refreshed",
	  "[volume][giveback]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64)};
	auto o = opts(8 * SS, 2, 64 * KiB);
	o.repair_interval = std::chrono::milliseconds(5);
	o.replicas = 1;
	auto v = make_volume(bs, o);
	Bytes shadow(8 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(SS, 4), 0) == 0); // one slab, on one donor
	const size_t h = bs[0]->live_slabs() ? 0 : 1;
	// Its first poll (a WANTED, then the hint) is done: no WANTED after it.
	REQUIRE(eventually([&] { return bs[1 - h]->hint_refreshes.load() > 0; }));
	const uint64_t before = bs[1 - h]->wanted_polls.load();
	REQUIRE(eventually([&] { return bs[h]->wanted_polls.load() > 40; }));
	CHECK(bs[1 - h]->wanted_polls.load() == before);
	CHECK(before == 1);
	CHECK(bs[1 - h]->hint_refreshes.load() > 40);
	CHECK(bs[h]->hint_refreshes.load() > 40);
	// A non-holder that does not answer is given up on for its cooldown, like a holder.
	bs[1 - h]->wanted_error = EAGAIN;
	CHECK(eventually([&] { return v->status_text().find(bs[1 - h]->name + " state=failed") !=
				      std::string::npos; }));
	check_no_violations(bs);
}

TEST_CASE("volume: give-back passes over a donor that turns out full", "[volume][giveback]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64),
						     backend("c", 64)};
	bs[1]->alloc_error = ENOSPC; // reports free slabs, but has none
	bs[2]->alloc_error = ENOSPC;
	auto o = opts(16 * SS, 2, 64 * KiB);
	o.repair_interval = std::chrono::milliseconds(100);
	auto v = make_volume(bs, o);
	Bytes shadow(16 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(16 * SS, 21), 0) == 0);
	REQUIRE(bs[0]->live_slabs() == 16);
	bs[2]->alloc_error = 0;
	bs[0]->want_all();
	// b's refusal sends each slab on to c: no move is ever left pending (a pass's count stays
	// visible until the next pass, 100 ms later).
	uint64_t max_pending = 0;
	CHECK(eventually([&] {
		max_pending = std::max(max_pending, v->stats().migrate_pending);
		return bs[0]->live_slabs() == 0;
	}));
	CHECK(max_pending == 0);
	CHECK(bs[2]->live_slabs() == 16);
	CHECK(counted_moves(*v, 16));
	CHECK(v->stats().migrated == 16);
	CHECK(compare_all(*v, shadow) == -1);
	check_no_violations(bs);
}

TEST_CASE("volume: slabs moved by a give-back carry their epoch: a restart reattaches them",
	  "[volume][giveback][reattach]")
{
	const auto bs = bound_backends();
	const auto o = reattach_opts(8 * SS, std::chrono::milliseconds(5));
	Bytes shadow(8 * SS);
	size_t moved = 0;
	{
		auto v = make_volume(bs, o);
		REQUIRE(write_shadow(*v, shadow, pattern(8 * SS, 31), 0) == 0);
		moved = bs[0]->live_slabs();
		REQUIRE(moved > 0);
		bs[0]->want_all();
		REQUIRE(eventually([&] { return bs[0]->live_slabs() == 0; }));
		CHECK(counted_moves(*v, moved));
		CHECK(v->stats().migrated == moved);
		// No copy is left tagged with epoch 0 (incomplete) on the new donors.
		for (size_t k : {size_t(1), size_t(2)}) {
			std::lock_guard lock(bs[k]->mu);
			for (auto &[id, t] : bs[k]->tags)
				CHECK(t.second != 0);
		}
		CHECK(compare_all(*v, shadow) == -1);
	}
	for (auto &b : bs)
		b->reattach = true;
	auto v2 = make_volume(bs, o);
	const VolumeStats st = v2->stats();
	CHECK(st.reattached == 8);
	CHECK(st.reattach_stale == 0);
	CHECK(st.lost == 0);
	CHECK(st.degraded == 0);
	CHECK(compare_all(*v2, shadow) == -1);
	check_no_violations(bs);
}
