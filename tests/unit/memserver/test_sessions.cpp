// SPDX-License-Identifier: MIT
// Unit tests for memserver/sessions: the last leave() of a session decides, in the same
// critical section, whether it is detached (joinable, kept) or ended (gone: no join, no
// takeover), and concurrent joins and leaves never lose or resurrect a session; --max-floors.
// And the worker pool's handshake lane (memserver/workers): a session's handshake never waits
// behind other control work.
#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/obs/log.h"
#include "memserver/sessions.h"
#include "memserver/workers.h"

using namespace rdmaswap;
using Left = SessionTable::Left;

TEST_CASE("sessions: the last leave detaches a bound session with a lease, ends the others",
	  "[sessions]")
{
	SessionTable t;
	const Mac key{};
	const auto a = t.create(false, key); // bound, lease: detached
	REQUIRE(t.bind(a.id, "k/a", "a", 30).err == 0);
	const auto z = t.create(false, key); // bound, lease 0: ended
	REQUIRE(t.bind(z.id, "k/z", "z", 0).err == 0);
	const auto u = t.create(false, key); // unbound: ended

	REQUIRE(t.join(a.id, a.token)); // two references
	CHECK(t.leave(a.id) == Left::Live);
	CHECK_FALSE(t.detached(a.id));
	CHECK(t.leave(a.id) == Left::Detached);
	CHECK(t.detached(a.id));
	// A detached session has no reference left to drop.
	CHECK(t.leave(a.id) == Left::Live);
	CHECK(t.detached(a.id));
	// Its client comes back: live again, and its next last leave detaches it again.
	CHECK(t.join(a.id, a.token));
	CHECK_FALSE(t.detached(a.id));
	CHECK(t.leave(a.id) == Left::Detached);

	CHECK(t.leave(z.id) == Left::Ended);
	CHECK(t.leave(u.id) == Left::Ended);
	// Ended means gone, at once: not joinable, not taken over, not listed.
	CHECK_FALSE(t.join(z.id, z.token));
	CHECK_FALSE(t.join(u.id, u.token));
	CHECK(t.leave(u.id) == Left::Live); // unknown: nothing to do
	const auto b = t.create(false, key);
	const auto r = t.bind(b.id, "k/z", "z", 30);
	CHECK(r.err == 0);
	CHECK(r.took_over == 0);
	CHECK(t.count() == 2);
}

TEST_CASE("sessions: a wrong token joins nothing and changes nothing", "[sessions]")
{
	SessionTable t;
	const auto a = t.create(false, Mac{});
	REQUIRE(t.bind(a.id, "k/a", "a", 30).err == 0);
	CHECK_FALSE(t.join(a.id, a.token ^ 1));
	CHECK(t.leave(a.id) == Left::Detached); // still one reference only
	CHECK_FALSE(t.join(a.id, a.token + 1));
	CHECK(t.detached(a.id));
	CHECK_FALSE(t.join(a.id + 1, a.token));
}

TEST_CASE("sessions: racing joins and leaves keep the reference count exact", "[sessions]")
{
	// Each thread joins and leaves in turn; the session starts with the creator's reference,
	// which is dropped last. Every leave but that one must see other references, and that
	// one must detach the session: never Ended, never a lost or extra reference.
	SessionTable t;
	const auto a = t.create(false, Mac{});
	REQUIRE(t.bind(a.id, "k/a", "a", 30).err == 0);
	std::atomic<int> wrong{0};
	std::vector<std::thread> ts;
	for (int k = 0; k < 4; k++)
		ts.emplace_back([&] {
			for (int i = 0; i < 20000; i++) {
				if (!t.join(a.id, a.token))
					wrong++;
				if (t.leave(a.id) != Left::Live)
					wrong++;
			}
		});
	for (auto &th : ts)
		th.join();
	CHECK(wrong.load() == 0);
	CHECK(t.leave(a.id) == Left::Detached);
	CHECK(t.leave(a.id) == Left::Live);
}

TEST_CASE("sessions: listing pages skip before they cut, so every visible entry is on one page",
	  "[sessions]")
{
	// 20 entries, the odd ones visible; pages of 3. The old listing cut the whole list at the
	// page size first and skipped afterwards: any start >= the page size gave an empty page.
	std::vector<int> all(20);
	for (int i = 0; i < 20; i++)
		all[size_t(i)] = i;
	auto odd = [](int v) { return v % 2 == 1; };
	std::vector<int> seen;
	for (uint64_t start = 0;;) {
		const auto page = list_page(all, odd, start, 3);
		for (const int *p : page)
			seen.push_back(*p);
		start += page.size();
		if (page.size() < 3)
			break;
	}
	CHECK(seen == std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19});
	CHECK(list_page(all, odd, 9, 3).size() == 1);
	CHECK(list_page(all, odd, 10, 3).empty());
	CHECK(list_page(all, odd, 1000, 3).empty());
}

TEST_CASE("sessions: --max-floors bounds a session's epoch floors; freed ones are counted",
	  "[sessions]")
{
	SessionTable t(4);
	CHECK(t.max_floors() == 4);
	const auto s = t.create(false, Mac{});
	REQUIRE(t.bind(s.id, "k/v", "v", 30).err == 0);
	for (uint64_t c = 0; c < 4; c++)
		REQUIRE(t.set_floor(s.id, c, 5) == 0);
	CHECK(t.set_floor(s.id, 4, 5) == ENOSPC);
	CHECK(t.set_floor(s.id, 2, 9) == 0); // changing one is allowed at the limit
	CHECK(t.set_floor(s.id, 3, 0) == 0); // and removing one
	CHECK(t.take_freed() == 1);
	CHECK(t.set_floor(s.id, 4, 5) == 0);
	CHECK(t.floors(s.id, 0, 100).size() == 4);
	// The session ends: its 4 floors and itself are freed.
	CHECK(t.leave(s.id) == SessionTable::Left::Detached);
	CHECK(t.expire(SessionTable::Clock::now() + std::chrono::seconds(31)).size() == 1);
	CHECK(t.take_freed() == 5);
	CHECK(t.take_freed() == 0);
	CHECK(SessionTable().max_floors() == SessionTable::kDefaultMaxFloors);
}

TEST_CASE("workers: a handshake runs while every worker is busy with control work",
	  "[sessions][workers]")
{
	// Issue 25: every HELLO waited in one FIFO with the zeroing of freed slabs. A control job
	// that does not end until released here stands for such work on each worker; more wait
	// behind them. A handshake submitted after them all still runs, and at once.
	std::mutex mu;
	std::condition_variable cv;
	bool release = false;
	std::atomic<int> control_started{0}, control_done{0};
	std::atomic<bool> handshake_ran{false};
	{
		WorkerPool pool(2);
		CHECK(pool.threads() == 2);
		auto control = [&] {
			control_started++;
			std::unique_lock lock(mu);
			cv.wait(lock, [&] { return release; });
			control_done++;
		};
		for (int i = 0; i < 5; i++)
			pool.submit(control);
		pool.submit(WorkerPool::Lane::Handshake, [&] { handshake_ran = true; });
		const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
		while (!handshake_ran.load() && std::chrono::steady_clock::now() < deadline)
			std::this_thread::sleep_for(std::chrono::milliseconds(1));
		CHECK(handshake_ran.load());
		CHECK(control_done.load() == 0); // every worker still held
		CHECK(control_started.load() <= 2);
		{
			std::lock_guard lock(mu);
			release = true;
		}
		cv.notify_all();
	} // the destructor runs what is queued
	CHECK(control_done.load() == 5);

	// The control lane keeps its order: with one worker, jobs run in submission order.
	std::vector<int> order;
	std::mutex order_mu;
	{
		WorkerPool pool(1);
		std::mutex gate;
		std::unique_lock hold(gate);
		pool.submit([&] { std::lock_guard g(gate); }); // holds the worker until `hold` goes
		for (int i = 0; i < 3; i++)
			pool.submit([&, i] {
				std::lock_guard l(order_mu);
				order.push_back(i);
			});
		std::this_thread::sleep_for(std::chrono::milliseconds(20));
		hold.unlock();
	}
	CHECK(order == std::vector<int>{0, 1, 2}); // in submission order within the lane
}

TEST_CASE("workers: a job that throws is logged and the worker takes the next one",
	  "[sessions][workers]")
{
	// Issue 29: no exception reaches std::terminate. Without the boundary the first job's
	// exception would abort the process.
	set_log_level("off");
	std::atomic<int> ran{0};
	{
		WorkerPool pool(1);
		pool.submit([] { throw std::runtime_error("test: a job that throws"); });
		pool.submit(WorkerPool::Lane::Handshake, [] { throw 42; });
		pool.submit([&] { ran++; });
		pool.submit(WorkerPool::Lane::Handshake, [&] { ran++; });
	} // the destructor runs what is queued
	CHECK(ran.load() == 2);
}
