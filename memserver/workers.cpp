// SPDX-License-Identifier: MIT
// WorkerPool: two mutex-guarded queues (handshakes first) and a few threads that run their jobs.
#include "memserver/workers.h"

#include <pthread.h>

#include <algorithm>

#include "common/obs/log.h"
#include "common/util/swap_safety.h"

namespace rdmaswap {

WorkerPool::WorkerPool(unsigned threads)
{
	const unsigned n = std::max(1u, threads);
	for (unsigned i = 0; i <= n; i++)
		threads_.emplace_back([this, hs = i == n] {
			prefault_stack();
			if (hs)
				pthread_setname_np(pthread_self(), "rdmaswap-hs");
			run(hs);
		});
}

WorkerPool::~WorkerPool()
{
	{
		std::lock_guard lock(mu_);
		stop_ = true;
	}
	cv_.notify_all();
	hs_cv_.notify_all();
	for (auto &t : threads_)
		t.join();
}

void WorkerPool::submit(Lane lane, std::function<void()> job)
{
	{
		std::lock_guard lock(mu_);
		(lane == Lane::Handshake ? handshakes_ : jobs_).push_back(std::move(job));
	}
	// A handshake may be taken by either kind of thread: wake one of each (the one that
	// finds the queue empty sleeps again).
	if (lane == Lane::Handshake)
		hs_cv_.notify_one();
	cv_.notify_one();
}

size_t WorkerPool::backlog() const
{
	std::lock_guard lock(mu_);
	return handshakes_.size() + jobs_.size();
}

// A job's exception boundary (docs/architecture.md, "Exception boundaries"): a job that throws
// (a bug, or std::bad_alloc while it handles a control request) is logged and the worker takes
// the next one; the connection it served is never handed back, so its loop's deadline ends it.
void WorkerPool::run_one(std::function<void()> &job) noexcept
{
	try {
		job();
	} catch (const std::exception &e) {
		try {
			logger("memserver")->error("a worker's job failed: {}; its connection is "
						   "dropped at its deadline",
						   e.what());
		} catch (...) {
		}
	} catch (...) {
		try {
			logger("memserver")->error("a worker's job failed: an unknown exception");
		} catch (...) {
		}
	}
}

void WorkerPool::run(bool handshakes_only)
{
	std::unique_lock lock(mu_);
	auto &cv = handshakes_only ? hs_cv_ : cv_;
	for (;;) {
		cv.wait(lock, [&] {
			return stop_ || !handshakes_.empty() ||
			       (!handshakes_only && !jobs_.empty());
		});
		auto &q = !handshakes_.empty() ? handshakes_ : jobs_;
		if (q.empty() || (handshakes_only && &q == &jobs_))
			return; // stopping, and nothing left for this thread to run
		auto job = std::move(q.front());
		q.pop_front();
		lock.unlock();
		run_one(job);
		job = nullptr; // what it captured goes before the lock is taken again
		lock.lock();
	}
}

} // namespace rdmaswap
