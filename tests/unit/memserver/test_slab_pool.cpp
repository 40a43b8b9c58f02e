// SPDX-License-Identifier: MIT
// Unit tests for memserver/slab_pool: validation, grants, ownership checks, zeroing by the
// scrubber, and the release/access race (a release never waits; a slab is zeroed and granted
// again only once its accesses have ended).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "memserver/slab_pool.h"

using namespace rdmaswap;

namespace {
constexpr uint64_t KiB = 1024, MiB = KiB * 1024;

bool all_bytes(const std::byte *p, size_t n, std::byte v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return false;
	return true;
}

// Generous (a loaded machine, a sanitizer build): the scrubber needs microseconds per slab here.
std::chrono::steady_clock::time_point soon()
{
	return std::chrono::steady_clock::now() + std::chrono::seconds(10);
}
} // namespace

TEST_CASE("slab pool: geometry", "[slab_pool]")
{
	SlabPool pool(4 * MiB, 64 * KiB, false);
	CHECK(pool.capacity() == 4 * MiB);
	CHECK(pool.slab_size() == 64 * KiB);
	CHECK(pool.slabs_total() == 64);
	CHECK(pool.slabs_free() == 64);
	REQUIRE(pool.base() != nullptr);
	CHECK(pool.slab_base(0) == pool.base());
	CHECK(pool.slab_base(63) == pool.base() + 63 * 64 * KiB);
	// Fresh memory is zero.
	CHECK(all_bytes(pool.base(), 4 * MiB, std::byte{0}));

	SlabPool one(1 * MiB, 1 * MiB, false);
	CHECK(one.slabs_total() == 1);
}

TEST_CASE("slab pool: invalid slab sizes and capacities throw", "[slab_pool]")
{
	for (uint64_t ss : {uint64_t(0), uint64_t(4096), uint64_t(32 * KiB), uint64_t(64 * KiB - 1),
			    uint64_t(64 * KiB + 4096), uint64_t(96 * KiB), uint64_t(3 * MiB)}) {
		INFO("slab size " << ss);
		CHECK_THROWS_AS(SlabPool(6 * MiB, ss, false), std::runtime_error);
	}
	for (uint64_t cap : {uint64_t(0), uint64_t(64 * KiB - 1), uint64_t(64 * KiB + 1),
			     uint64_t(100 * KiB), uint64_t(4 * MiB + 4096)}) {
		INFO("capacity " << cap);
		CHECK_THROWS_AS(SlabPool(cap, 64 * KiB, false), std::runtime_error);
	}
	// Too many slabs for 32-bit ids: 2^32 slabs of 64 KiB; checked before mapping anything.
	CHECK_THROWS_AS(SlabPool(uint64_t(1) << 48, 64 * KiB, false), std::runtime_error);
	// The smallest valid pool.
	CHECK_NOTHROW(SlabPool(64 * KiB, 64 * KiB, false));
}

TEST_CASE("slab pool: allocate until exhausted", "[slab_pool]")
{
	SlabPool pool(4 * MiB, 64 * KiB, false);
	std::set<uint32_t> ids;
	for (uint32_t i = 0; i < 64; i++) {
		const uint64_t owner = 1 + (i % 3);
		auto id = pool.allocate(owner);
		REQUIRE(id);
		CHECK(*id < 64);
		CHECK(ids.insert(*id).second); // never granted twice
		CHECK(pool.owns(*id, owner));
		CHECK(pool.slabs_free() == 63 - i);
	}
	CHECK_FALSE(pool.allocate(1).has_value());
	CHECK_FALSE(pool.allocate(99).has_value());
	CHECK(pool.slabs_free() == 0);
	CHECK(pool.owned_by(1).size() + pool.owned_by(2).size() + pool.owned_by(3).size() == 64);
	CHECK(pool.owned_by(4).empty());

	// Owner 0 (free) and the internal "releasing" marker are not valid owners.
	SlabPool fresh(1 * MiB, 64 * KiB, false);
	CHECK_FALSE(fresh.allocate(0).has_value());
	CHECK_FALSE(fresh.allocate(~uint64_t(0)).has_value());
	CHECK(fresh.slabs_free() == 16);
}

TEST_CASE("slab pool: ownership and range checks on the data path", "[slab_pool]")
{
	SlabPool pool(4 * MiB, 64 * KiB, false);
	const uint64_t A = 11, B = 22;
	const uint32_t a = *pool.allocate(A);
	const uint32_t b = *pool.allocate(B);
	const uint64_t ss = pool.slab_size();

	std::byte *p = pool.begin_access(a, A, 0, ss);
	REQUIRE(p == pool.slab_base(a));
	pool.end_access(a);
	p = pool.begin_access(a, A, 100, 200);
	REQUIRE(p == pool.slab_base(a) + 100);
	pool.end_access(a);
	p = pool.begin_access(a, A, ss - 1, 1);
	REQUIRE(p == pool.slab_base(a) + ss - 1);
	pool.end_access(a);

	CHECK(pool.begin_access(a, B, 0, 1) == nullptr); // wrong owner
	CHECK(pool.begin_access(b, A, 0, 1) == nullptr);
	CHECK(pool.begin_access(a, 0, 0, 1) == nullptr); // owner 0
	const uint32_t unowned = (a != 5 && b != 5) ? 5 : 6;
	CHECK(pool.begin_access(unowned, A, 0, 1) == nullptr); // free slab
	CHECK(pool.begin_access(a, A, 0, ss + 1) == nullptr);
	CHECK(pool.begin_access(a, A, 1, ss) == nullptr);
	CHECK(pool.begin_access(a, A, ss, 1) == nullptr);
	CHECK(pool.begin_access(a, A, ss + 1, 0) == nullptr);
	CHECK(pool.begin_access(a, A, ~uint64_t(0), 2) == nullptr); // off+len wraps
	CHECK(pool.begin_access(a, A, 2, ~uint64_t(0)) == nullptr);
	CHECK(pool.begin_access(a, A, 4096, ~uint64_t(0) - 4095) == nullptr);
	CHECK(pool.begin_access(64, A, 0, 1) == nullptr); // id out of range
	CHECK(pool.begin_access(~uint32_t(0), A, 0, 1) == nullptr);

	CHECK(pool.owns(a, A));
	CHECK_FALSE(pool.owns(a, B));
	CHECK_FALSE(pool.owns(a, 0));
	CHECK_FALSE(pool.owns(64, A));

	// The failed checks above left no in-flight count behind: release does not hang.
	CHECK(pool.release(a, A));
	CHECK(pool.release(b, B));
	CHECK(pool.slabs_free() == 64);
}

TEST_CASE("slab pool: release by a non-owner fails and changes nothing", "[slab_pool]")
{
	SlabPool pool(1 * MiB, 64 * KiB, false);
	const uint32_t a = *pool.allocate(1);
	std::memset(pool.slab_base(a), 0x5a, pool.slab_size());
	CHECK_FALSE(pool.release(a, 2));
	CHECK_FALSE(pool.release(a, 0));
	CHECK_FALSE(pool.release(16, 1));
	CHECK_FALSE(pool.release(~uint32_t(0), 1));
	const uint32_t unowned = a == 0 ? 1 : 0;
	CHECK_FALSE(pool.release(unowned, 1));
	CHECK(pool.owns(a, 1));
	CHECK(pool.slabs_free() == 15);
	CHECK(all_bytes(pool.slab_base(a), pool.slab_size(), std::byte{0x5a}));
	CHECK(pool.release(a, 1));
	CHECK_FALSE(pool.release(a, 1)); // twice
	CHECK(pool.slabs_free() == 16);
}

TEST_CASE("slab pool: a released slab is zeroed before its next owner gets it", "[slab_pool]")
{
	// One slab, so the next grant must be the same memory.
	SlabPool pool(64 * KiB, 64 * KiB, false);
	const uint32_t a = *pool.allocate(1);
	std::byte *p = pool.begin_access(a, 1, 0, pool.slab_size());
	REQUIRE(p);
	for (size_t i = 0; i < pool.slab_size(); i++)
		p[i] = std::byte(uint8_t(i * 7 + 1) | 1);
	pool.end_access(a);
	REQUIRE(pool.release(a, 1));
	const auto again = pool.allocate(2);
	REQUIRE(again);
	CHECK(*again == a);
	std::byte *q = pool.begin_access(*again, 2, 0, pool.slab_size());
	REQUIRE(q);
	CHECK(all_bytes(q, pool.slab_size(), std::byte{0}));
	pool.end_access(*again);
	CHECK(pool.begin_access(a, 1, 0, 1) == nullptr); // old owner is locked out

	// With many slabs: dirty all, release all, every re-grant is zero.
	SlabPool many(2 * MiB, 64 * KiB, false);
	std::vector<uint32_t> ids;
	while (auto id = many.allocate(5))
		ids.push_back(*id);
	for (uint32_t id : ids)
		std::memset(many.slab_base(id), 0xff, many.slab_size());
	for (uint32_t id : ids)
		REQUIRE(many.release(id, 5));
	while (auto id = many.allocate(6))
		CHECK(all_bytes(many.slab_base(*id), many.slab_size(), std::byte{0}));
}

TEST_CASE("slab pool: release_all", "[slab_pool]")
{
	SlabPool pool(4 * MiB, 64 * KiB, false);
	std::vector<uint32_t> mine, theirs;
	for (int i = 0; i < 20; i++) {
		mine.push_back(*pool.allocate(7));
		theirs.push_back(*pool.allocate(8));
	}
	for (uint32_t id : mine)
		std::memset(pool.slab_base(id), 0x77, pool.slab_size());
	for (uint32_t id : theirs)
		std::memset(pool.slab_base(id), 0x88, pool.slab_size());
	auto owned = pool.owned_by(7);
	std::sort(mine.begin(), mine.end());
	CHECK(owned == mine);

	CHECK(pool.release_all(7) == 20);
	CHECK(pool.slabs_free() == 64 - 20); // counted free at once, zeroed by the scrubber
	REQUIRE(pool.settle(soon()));
	CHECK(pool.counts().zeroing == 0);
	CHECK(pool.owned_by(7).empty());
	CHECK(pool.owned_by(8).size() == 20);
	for (uint32_t id : mine) {
		CHECK_FALSE(pool.owns(id, 7));
		CHECK(all_bytes(pool.slab_base(id), pool.slab_size(), std::byte{0}));
	}
	for (uint32_t id : theirs) // untouched
		CHECK(all_bytes(pool.slab_base(id), pool.slab_size(), std::byte{0x88}));
	CHECK(pool.release_all(7) == 0);
	CHECK(pool.release_all(0) == 0);
	CHECK(pool.slabs_free() == 44);
	CHECK(pool.release_all(8) == 20);
	CHECK(pool.slabs_free() == 64);
}

TEST_CASE("slab pool: release locks the owner out at once and zeroes after the last access",
	  "[slab_pool][concurrency]")
{
	SlabPool pool(1 * MiB, 64 * KiB, false);
	const uint64_t owner = 42;
	const uint64_t ss = pool.slab_size();

	SECTION("an open access keeps the slab from being zeroed or granted, not release")
	{
		const uint32_t id = *pool.allocate(owner);
		std::byte *p = pool.begin_access(id, owner, 0, ss);
		REQUIRE(p);
		// Returns at once, though the access is open (it used to wait for it).
		const auto t0 = std::chrono::steady_clock::now();
		CHECK(pool.release(id, owner));
		CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
		CHECK_FALSE(pool.owns(id, owner));
		// New accesses are refused from the return on.
		CHECK(pool.begin_access(id, owner, 0, 1) == nullptr);
		// Still the accessor's to write until it ends the access: not zeroed meanwhile.
		std::memset(p, 0xab, ss);
		std::this_thread::sleep_for(std::chrono::milliseconds(100));
		CHECK(pool.counts().zeroing == 1);
		CHECK_FALSE(pool.settle(std::chrono::steady_clock::now()));
		CHECK(all_bytes(p, ss, std::byte{0xab}));
		pool.end_access(id);
		REQUIRE(pool.settle(soon()));
		CHECK(all_bytes(pool.slab_base(id), ss, std::byte{0}));
		CHECK(pool.counts().zeroing == 0);
		CHECK(pool.slabs_free() == 16);
	}

	SECTION("racing accessors never succeed after release returns")
	{
		for (int round = 0; round < 20; round++) {
			const uint32_t id = *pool.allocate(owner);
			std::atomic<bool> release_done{false};
			std::atomic<bool> violation{false};
			std::atomic<bool> stop{false};
			std::atomic<uint64_t> successes{0};
			std::vector<std::thread> ts;
			for (int t = 0; t < 4; t++)
				ts.emplace_back([&, t] {
					while (!stop.load()) {
						// Read the flag before trying: if the release had
						// already returned, the access must fail.
						const bool after = release_done.load();
						std::byte *p = pool.begin_access(id, owner,
										 uint64_t(t) * 4096, 4096);
						if (!p)
							continue;
						if (after)
							violation = true;
						std::memset(p, 0xc0 + t, 4096);
						successes++;
						pool.end_access(id);
					}
				});
			// Let the accessors get going.
			while (successes.load() < 100)
				std::this_thread::yield();
			REQUIRE(pool.release(id, owner));
			release_done = true;
			// The slab is wiped after the last access ended: all zeros while the
			// accessors keep trying.
			const bool settled = pool.settle(soon());
			const bool zero = all_bytes(pool.slab_base(id), ss, std::byte{0});
			stop = true;
			for (auto &th : ts)
				th.join();
			CHECK_FALSE(violation.load());
			CHECK(settled);
			CHECK(zero);
			CHECK_FALSE(pool.owns(id, owner));
			CHECK(pool.slabs_free() == 16);
		}
	}
}

namespace {
// Resident pages of [p, p+len) (mincore).
size_t resident_pages(const std::byte *p, size_t len)
{
	const size_t pg = size_t(sysconf(_SC_PAGESIZE));
	std::vector<unsigned char> v((len + pg - 1) / pg);
	if (mincore(const_cast<std::byte *>(p), len, v.data()) != 0)
		return size_t(-1);
	return size_t(std::count_if(v.begin(), v.end(), [](unsigned char c) { return c & 1; }));
}
} // namespace

TEST_CASE("slab pool: give-back withdraws free slabs first, then wants granted ones back",
	  "[slab_pool][giveback]")
{
	SlabPool pool(1 * MiB, 64 * KiB, false); // 16 slabs
	std::vector<uint32_t> mine;
	for (int i = 0; i < 10; i++)
		mine.push_back(*pool.allocate(7));
	std::memset(pool.slab_base(mine[0]), 0xab, 64 * KiB);
	CHECK(pool.slabs_free() == 6);

	// 4 free slabs go at once; nothing granted is touched.
	auto w = pool.withdraw(4);
	CHECK(w.now == 4);
	CHECK(w.wanted == 0);
	CHECK(pool.slabs_free() == 2);
	CHECK(pool.slabs_withdrawn() == 4);
	CHECK(pool.slabs_wanted() == 0);
	CHECK(pool.wanted_by(7).empty());

	// 5 more: the last 2 free ones, then 3 granted ones are wanted back (still served).
	w = pool.withdraw(5);
	CHECK(w.now == 2);
	CHECK(w.wanted == 3);
	CHECK(pool.slabs_free() == 0);
	CHECK(pool.slabs_withdrawn() == 6);
	CHECK(pool.slabs_wanted() == 3);
	const auto wanted = pool.wanted_by(7);
	REQUIRE(wanted.size() == 3);
	CHECK(pool.wanted_by(8).empty());
	for (uint32_t id : wanted) {
		CHECK(pool.owns(id, 7));
		std::byte *p = pool.begin_access(id, 7, 0, 4096);
		CHECK(p != nullptr); // a wanted slab is still served to its owner
		if (p)
			pool.end_access(id);
	}
	CHECK_FALSE(pool.allocate(9).has_value()); // withdrawn slabs are never granted

	// Releasing a wanted slab withdraws it (no longer free, pages gone, zeros).
	std::memset(pool.slab_base(wanted[0]), 0xcd, 64 * KiB);
	CHECK(pool.release(wanted[0], 7));
	CHECK(pool.slabs_wanted() == 2);
	CHECK(pool.slabs_withdrawn() == 7);
	CHECK(pool.slabs_free() == 0);
	REQUIRE(pool.settle(soon())); // the scrubber drops its pages
	CHECK(resident_pages(pool.slab_base(wanted[0]), 64 * KiB) == 0);
	CHECK(all_bytes(pool.slab_base(wanted[0]), 64 * KiB, std::byte{0}));

	// Releasing a slab that is not wanted puts it on the free list as before.
	uint32_t plain = 0;
	for (uint32_t id : mine)
		if (std::find(wanted.begin(), wanted.end(), id) == wanted.end())
			plain = id;
	CHECK(pool.release(plain, 7));
	CHECK(pool.slabs_free() == 1);

	// The owner's session ends: its remaining wanted slabs are withdrawn too.
	pool.release_all(7);
	CHECK(pool.slabs_wanted() == 0);
	CHECK(pool.slabs_withdrawn() == 9);
	CHECK(pool.slabs_free() == 7);

	// More than there is: everything left is withdrawn, and asking again is a no-op.
	REQUIRE(pool.settle(soon()));
	w = pool.withdraw(100);
	CHECK(w.now == 7);
	CHECK(w.wanted == 0);
	CHECK(pool.slabs_withdrawn() == 16);
	w = pool.withdraw(1);
	CHECK(w.now == 0);
	CHECK(w.wanted == 0);

	// Restore: slabs come back zeroed and can be granted again.
	CHECK(pool.restore(3) == 3);
	CHECK(pool.slabs_withdrawn() == 13);
	CHECK(pool.slabs_free() == 3);
	auto id = pool.allocate(5);
	REQUIRE(id);
	CHECK(all_bytes(pool.slab_base(*id), 64 * KiB, std::byte{0}));
	CHECK(pool.restore(100) == 13);
	CHECK(pool.slabs_withdrawn() == 0);
	CHECK(pool.slabs_free() == 15);
}

TEST_CASE("slab pool: withdrawing a free slab releases its pages", "[slab_pool][giveback]")
{
	SlabPool pool(1 * MiB, 256 * KiB, false); // 4 slabs, populated at start
	const size_t pages = 256 * KiB / size_t(sysconf(_SC_PAGESIZE));
	size_t before = 0;
	for (uint32_t i = 0; i < 4; i++)
		before += resident_pages(pool.slab_base(i), 256 * KiB);
	CHECK(before == 4 * pages);
	CHECK(pool.withdraw(2).now == 2);
	size_t after = 0;
	for (uint32_t i = 0; i < 4; i++)
		after += resident_pages(pool.slab_base(i), 256 * KiB);
	CHECK(after == 2 * pages);
}

namespace {
double process_cpu_seconds()
{
	timespec ts{};
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}
} // namespace

TEST_CASE("slab pool: the scrubber sleeps while an access is open and zeroes once it ends",
	  "[slab_pool][concurrency]")
{
	// A TCP access lasts as long as its peer takes (up to the message deadline): the
	// scrubber waiting for it must not burn a CPU meanwhile.
	SlabPool pool(1 * MiB, 64 * KiB, false);
	const uint64_t owner = 7;
	const uint32_t id = *pool.allocate(owner);
	std::byte *p = pool.begin_access(id, owner, 0, 4096);
	REQUIRE(p);
	std::memset(p, 0x11, 4096);
	const double c0 = process_cpu_seconds();
	REQUIRE(pool.release(id, owner));
	const auto hold = std::chrono::milliseconds(400);
	std::this_thread::sleep_for(hold);
	const double cpu = process_cpu_seconds() - c0;
	CHECK(all_bytes(p, 4096, std::byte{0x11})); // not zeroed under the access
	CHECK_FALSE(pool.owns(id, owner));
	const auto ended = std::chrono::steady_clock::now();
	pool.end_access(id);
	REQUIRE(pool.settle(soon()));
	const auto woke = std::chrono::steady_clock::now() - ended;
	// Seen within a poll (kAccessPoll, 10 ms), not a long interval.
	CHECK(woke < std::chrono::milliseconds(500));
	// Asleep while it waited, but for a look every 10 ms: well under a millisecond of CPU per
	// 100 ms (a spinning scrubber would use the whole 400 ms).
	INFO("the process used " << cpu * 1000 << " ms of CPU over a " << hold.count()
				 << " ms wait");
	CHECK(cpu < 0.05);
	CHECK(all_bytes(pool.slab_base(id), 64 * KiB, std::byte{0}));
	CHECK(pool.slabs_free() == 16);

	// A refused access (the slab is being released) that races the release: only once every
	// access has ended is the slab zeroed.
	const uint32_t id2 = *pool.allocate(owner);
	std::byte *a = pool.begin_access(id2, owner, 0, 1);
	std::byte *b = pool.begin_access(id2, owner, 1, 1);
	REQUIRE((a && b));
	*a = std::byte{0x22};
	REQUIRE(pool.release(id2, owner));
	CHECK(pool.begin_access(id2, owner, 0, 1) == nullptr);
	pool.end_access(id2);
	std::this_thread::sleep_for(std::chrono::milliseconds(50));
	CHECK_FALSE(pool.settle(std::chrono::steady_clock::now()));
	CHECK(*a == std::byte{0x22});
	pool.end_access(id2);
	REQUIRE(pool.settle(soon()));
	CHECK(*pool.slab_base(id2) == std::byte{0});
	CHECK(pool.slabs_free() == 16);
}

TEST_CASE("slab pool: release is bounded: a slab whose access never ends is never granted",
	  "[slab_pool][concurrency]")
{
	// Issue 25: a FREE waited in release() for accesses that only its own (parked)
	// connection could end, and held a worker forever. Now release() returns at once, the
	// slab is withheld while its access is open, and allocate() does not wait for it.
	SlabPool pool(128 * KiB, 64 * KiB, false); // 2 slabs
	const uint32_t a = *pool.allocate(1);
	const uint32_t b = *pool.allocate(2);
	std::byte *p = pool.begin_access(a, 1, 0, 64 * KiB); // never ended below, until the end
	REQUIRE(p);
	std::memset(p, 0x33, 64 * KiB);
	const auto t0 = std::chrono::steady_clock::now();
	REQUIRE(pool.release(a, 1));
	CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
	CHECK(pool.slabs_free() == 1); // counted free (it will be), but not grantable yet
	CHECK(pool.counts().zeroing == 1);

	// The pool is full but for it: allocate() refuses rather than grant or wait for it (it
	// waits only for a slab the scrubber is zeroing, at most kAllocWait).
	const auto t1 = std::chrono::steady_clock::now();
	CHECK_FALSE(pool.allocate(3).has_value());
	CHECK(std::chrono::steady_clock::now() - t1 < SlabPool::kAllocWait + std::chrono::seconds(1));
	CHECK(all_bytes(p, 64 * KiB, std::byte{0x33}));

	// A slab released with no access open is granted again at once, zeroed (by allocate
	// itself if the scrubber has not got to it).
	std::memset(pool.slab_base(b), 0x44, 64 * KiB);
	REQUIRE(pool.release(b, 2));
	const auto again = pool.allocate(3);
	REQUIRE(again);
	CHECK(*again == b);
	CHECK(all_bytes(pool.slab_base(b), 64 * KiB, std::byte{0}));

	// A withdrawal takes the released slab still being read: the scrubber drops its pages
	// instead of zeroing it, once the access ends.
	const auto w = pool.withdraw(1);
	CHECK(w.now == 1);
	CHECK(w.wanted == 0);
	CHECK(pool.slabs_withdrawn() == 1);
	CHECK(pool.slabs_free() == 0);
	CHECK_FALSE(pool.settle(std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
	pool.end_access(a);
	REQUIRE(pool.settle(soon()));
	CHECK(resident_pages(pool.slab_base(a), 64 * KiB) == 0);
	CHECK(pool.restore(1) == 1);
	CHECK(pool.slabs_free() == 1);
	const auto last = pool.allocate(4);
	REQUIRE(last);
	CHECK(*last == a);
	CHECK(all_bytes(pool.slab_base(a), 64 * KiB, std::byte{0}));
}
