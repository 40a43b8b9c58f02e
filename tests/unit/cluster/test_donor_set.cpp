// SPDX-License-Identifier: MIT
// DonorSet: membership by two choices, replacement of full and dead members, idle ex-members,
// small tables, distinct replicas, and no allocation after construction.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <set>
#include <vector>

#include "common/cluster/donor_set.h"

using namespace rdmaswap;

// Heap allocations made by this thread while counting is on. The sanitizer builds keep their
// own operator new (the test that needs it is skipped there).
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define COUNT_ALLOCATIONS 1
namespace {
thread_local bool t_counting = false;
thread_local uint64_t t_allocs = 0;
} // namespace

// Not inlined: GCC would then see free() of what operator new returned and warn.
[[gnu::noinline]] void *operator new(size_t n)
{
	if (t_counting)
		t_allocs++;
	if (void *p = std::malloc(n ? n : 1))
		return p;
	throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void *p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void *p, size_t) noexcept { std::free(p); }
#endif

namespace {

std::vector<DonorLoad> table(size_t n, uint32_t used = 0, uint32_t total = 100)
{
	return std::vector<DonorLoad>(n, DonorLoad{used, total, true});
}

bool usable(const DonorLoad &d) { return d.alive && d.used < d.total; }

} // namespace

TEST_CASE("donor set: filled to spread with distinct live members that have room", "[donor_set]")
{
	auto donors = table(100);
	for (size_t i = 0; i < donors.size(); i += 3)
		donors[i].alive = false;    // a third dead
	for (size_t i = 1; i < donors.size(); i += 3)
		donors[i].used = 100;       // a third full
	std::minstd_rand rng(1);
	for (int trial = 0; trial < 200; trial++) {
		DonorSet set(8, donors.size());
		REQUIRE(set.refill(donors, rng) == 8);
		const auto m = set.members();
		REQUIRE(m.size() == 8);
		std::set<uint16_t> distinct(m.begin(), m.end());
		CHECK(distinct.size() == 8);
		for (uint16_t i : m) {
			CHECK(usable(donors[i]));
			CHECK(set.is_member(i));
		}
		const uint64_t changes = set.changes();
		CHECK(set.refill(donors, rng) == 0); // full of usable members: nothing moves
		CHECK(set.changes() == changes);
	}
}

TEST_CASE("donor set: members are the less loaded of two drawn", "[donor_set]")
{
	// 8 donors 90 % full, 8 empty; sets of 4. Blind choice would take half its members from
	// the full ones; two choices take a loaded one only when both drawn are loaded.
	auto donors = table(16);
	for (size_t i = 0; i < 8; i++)
		donors[i].used = 90;
	std::minstd_rand rng(2);
	unsigned loaded = 0, all = 0;
	for (int trial = 0; trial < 500; trial++) {
		DonorSet set(4, donors.size());
		set.refill(donors, rng);
		for (uint16_t i : set.members())
			loaded += i < 8;
		all += unsigned(set.members().size());
	}
	INFO(loaded << " of " << all << " members were loaded");
	CHECK(double(loaded) / all < 0.3);
}

TEST_CASE("donor set: members are the one of two drawn with fewer sessions", "[donor_set]")
{
	// 8 donors with many sessions but empty, 8 with none but half full: sessions decide
	// (a donor in many sets fills fastest later); fill only breaks ties.
	auto donors = table(16);
	for (size_t i = 0; i < 16; i++) {
		donors[i].sessions = i < 8 ? 20 : 0;
		donors[i].used = i < 8 ? 0 : 50;
	}
	std::minstd_rand rng(10);
	unsigned busy = 0, all = 0;
	for (int trial = 0; trial < 500; trial++) {
		DonorSet set(4, donors.size());
		set.refill(donors, rng);
		for (uint16_t i : set.members())
			busy += i < 8;
		all += unsigned(set.members().size());
	}
	INFO(busy << " of " << all << " members had many sessions");
	CHECK(double(busy) / all < 0.3);
	// Inside the set, slabs still go by fill: the emptier member wins whatever its sessions.
	DonorSet set(2, 2);
	std::vector<DonorLoad> two = {{0, 100, true, 50}, {60, 100, true, 0}};
	for (int s = 0; s < 100; s++) {
		uint16_t out[1];
		REQUIRE(set.place(two, 1, {}, rng, out) == 1);
		CHECK(out[0] == 0);
	}
}

TEST_CASE("donor set: full and dead members are replaced, and retire", "[donor_set]")
{
	auto donors = table(50);
	std::minstd_rand rng(3);
	DonorSet set(8, donors.size());
	set.refill(donors, rng);
	const std::vector<uint16_t> before(set.members().begin(), set.members().end());
	const uint16_t dead = before[0], full = before[1];
	donors[dead].alive = false;
	donors[full].used = donors[full].total;
	uint16_t out[2];
	REQUIRE(set.place(donors, 2, {}, rng, out) == 2);
	CHECK(set.members().size() == 8);
	CHECK_FALSE(set.is_member(dead));
	CHECK_FALSE(set.is_member(full));
	CHECK(set.is_retired(dead));
	CHECK(set.is_retired(full));
	for (size_t k = 2; k < before.size(); k++)
		CHECK(set.is_member(before[k])); // the usable ones stay
	for (uint16_t i : out)
		CHECK((i != dead && i != full && set.is_member(i)));

	// Neither holds slabs of ours: both idle.
	std::vector<uint16_t> idle(50);
	std::vector<uint32_t> held(50, 0);
	CHECK(set.take_idle(held, idle.data(), 50) == 2);
}

TEST_CASE("donor set: retired members are idle once they hold none of our slabs", "[donor_set]")
{
	auto donors = table(30);
	std::minstd_rand rng(4);
	DonorSet set(4, donors.size());
	std::vector<uint32_t> held(30, 0);
	uint16_t out[2];
	for (int s = 0; s < 20; s++) {
		REQUIRE(set.place(donors, 2, {}, rng, out) == 2);
		for (uint16_t i : out) {
			held[i]++;
			donors[i].used++;
		}
	}
	std::vector<uint16_t> idle(30);
	CHECK(set.take_idle(held, idle.data(), 30) == 0); // nobody retired yet
	// Two members die: one holds slabs of ours, the other (made so) none.
	const uint16_t holder = set.members()[0], empty = set.members()[1];
	held[empty] = 0;
	REQUIRE(held[holder] > 0);
	donors[holder].alive = false;
	donors[empty].alive = false;
	REQUIRE(set.place(donors, 2, {}, rng, out) == 2);
	REQUIRE(set.is_retired(holder));
	REQUIRE(set.is_retired(empty));
	REQUIRE(set.take_idle(held, idle.data(), 30) == 1);
	CHECK(idle[0] == empty);
	CHECK_FALSE(set.is_retired(empty));
	CHECK(set.take_idle(held, idle.data(), 30) == 0); // reported once
	// The holder's slabs move away (or are trimmed): then it is idle too.
	held[holder] = 0;
	REQUIRE(set.take_idle(held, idle.data(), 30) == 1);
	CHECK(idle[0] == holder);
	// A member never is, whatever it holds; nor a forgotten donor.
	const uint16_t m = set.members()[0];
	set.forget(m);
	CHECK_FALSE(set.is_member(m));
	CHECK(set.members().size() == 3);
	CHECK(set.take_idle(held, idle.data(), 30) == 0);
}

TEST_CASE("donor set: fewer donors than spread, and donors that appear later", "[donor_set]")
{
	auto donors = table(5);
	donors[4].alive = false;
	std::minstd_rand rng(5);
	DonorSet set(8, 64); // room for a table of 64
	CHECK(set.refill(donors, rng) == 4);
	CHECK(set.members().size() == 4);
	uint16_t out[3];
	for (int s = 0; s < 100; s++) {
		REQUIRE(set.place(donors, 3, {}, rng, out) == 3);
		CHECK(std::set<uint16_t>(out, out + 3).size() == 3);
	}
	// Fewer live donors with room than replicas: as many as there are, distinct.
	donors[0].used = donors[0].total;
	donors[1].alive = false;
	REQUIRE(set.place(donors, 3, {}, rng, out) == 2);
	CHECK(std::set<uint16_t>(out, out + 2) == std::set<uint16_t>{2, 3});
	// None at all: nothing placed.
	donors[2].alive = donors[3].alive = false;
	CHECK(set.place(donors, 3, {}, rng, out) == 0);
	CHECK(set.members().empty());
	// The table grows (a donor registered) and the dead come back: the set takes them.
	donors = table(12);
	REQUIRE(set.place(donors, 2, {}, rng, out) == 2);
	CHECK(set.members().size() == 8);
	// Donors beyond the set's max_donors() are never chosen.
	DonorSet small(8, 3);
	CHECK(small.refill(table(10), rng) == 3);
	for (uint16_t i : small.members())
		CHECK(i < 3);
}

TEST_CASE("donor set: replicas are distinct members, never excluded donors", "[donor_set]")
{
	auto donors = table(200, 0, 1000);
	std::minstd_rand rng(6);
	DonorSet set(8, donors.size());
	for (int s = 0; s < 2000; s++) {
		uint16_t out[3];
		// A different member excluded each time, as repairs of different slabs would.
		const auto m = set.members();
		const uint16_t exclude[] = {m.empty() ? uint16_t(0) : m[size_t(s) % m.size()]};
		const unsigned n = set.place(donors, 3, exclude, rng, out);
		REQUIRE(n == 3);
		REQUIRE(std::set<uint16_t>(out, out + 3).size() == 3);
		for (uint16_t i : out) {
			REQUIRE(set.is_member(i));
			REQUIRE(i != exclude[0]);
			donors[i].used++;
		}
	}
	// Inside the set, the two choices keep the members even: each within a few slabs.
	uint32_t lo = UINT32_MAX, hi = 0;
	for (uint16_t i : set.members()) {
		lo = std::min(lo, donors[i].used);
		hi = std::max(hi, donors[i].used);
	}
	INFO("member loads " << lo << ".." << hi);
	CHECK(hi - lo <= 0.2 * hi);
}

TEST_CASE("donor set: when the members left cannot take a slab, excluded members make room",
	  "[donor_set]")
{
	// A repair of a slab whose two replicas are on two of the three members, with a third
	// replica wanted on a fourth donor: the set is full, so an excluded member retires.
	auto donors = table(10);
	std::minstd_rand rng(7);
	DonorSet set(3, donors.size());
	set.refill(donors, rng);
	const std::vector<uint16_t> m(set.members().begin(), set.members().end());
	const uint16_t exclude[] = {m[0], m[1], m[2]};
	uint16_t out[2];
	REQUIRE(set.place(donors, 2, exclude, rng, out) == 2);
	for (uint16_t i : out) {
		CHECK(std::find(m.begin(), m.end(), i) == m.end());
		CHECK(set.is_member(i));
	}
	CHECK(out[0] != out[1]);
	CHECK(set.members().size() == 3);
	unsigned retired = 0;
	for (uint16_t i : m)
		retired += set.is_retired(i);
	CHECK(retired == 2);
	// A set smaller than the replicas wanted gives what it can hold.
	DonorSet one(1, donors.size());
	uint16_t three[3];
	CHECK(one.place(donors, 3, {}, rng, three) == 1);
}

TEST_CASE("donor set: spread 0 is unbounded: every live donor with room", "[donor_set]")
{
	auto donors = table(300);
	donors[7].alive = false;
	donors[8].used = donors[8].total;
	std::minstd_rand rng(8);
	DonorSet set(0, donors.size());
	CHECK(set.capacity() == 300);
	uint16_t out[2];
	REQUIRE(set.place(donors, 2, {}, rng, out) == 2);
	CHECK(set.members().size() == 298);
	CHECK_FALSE(set.is_member(7));
	CHECK_FALSE(set.is_member(8));
	donors[7].alive = true;
	set.place(donors, 2, {}, rng, out);
	CHECK(set.is_member(7));
}

TEST_CASE("donor set: no allocation after construction", "[donor_set]")
{
#ifdef COUNT_ALLOCATIONS
	auto donors = table(4096, 0, 64);
	std::vector<uint32_t> held(4096, 0);
	std::vector<uint16_t> idle(4096);
	std::minstd_rand rng(9);
	DonorSet set(8, donors.size());
	{ // the counter itself works
		t_counting = true;
		void *p = ::operator new(16); // a direct call: a new-expression may be elided
		t_counting = false;
		::operator delete(p);
		REQUIRE(t_allocs == 1);
		t_allocs = 0;
	}
	t_counting = true;
	unsigned placed = 0;
	for (int s = 0; s < 20000; s++) {
		uint16_t out[3];
		const unsigned n = set.place(donors, 3, {}, rng, out);
		for (unsigned k = 0; k < n; k++) {
			donors[out[k]].used++;
			held[out[k]]++;
		}
		placed += n;
		if (s % 100 == 0) {
			donors[set.members()[0]].alive = false; // churn: replacement and retirement
			held[set.members()[1]] = 0;
		}
		set.take_idle(held, idle.data(), unsigned(idle.size()));
	}
	t_counting = false;
	CHECK(placed == 60000);
	CHECK(t_allocs == 0);
#else
	WARN("not checked: operator new is the sanitizer's in this build");
#endif
}
