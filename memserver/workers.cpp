// SPDX-License-Identifier: MIT
// WorkerPool: a mutex-guarded queue and a few threads that run its jobs.
#include "memserver/workers.h"

#include <algorithm>

#include "common/swap_safety.h"

namespace rdmaswap {

WorkerPool::WorkerPool(unsigned threads)
{
	for (unsigned i = 0; i < std::max(1u, threads); i++)
		threads_.emplace_back([this] {
			prefault_stack();
			run();
		});
}

WorkerPool::~WorkerPool()
{
	{
		std::lock_guard lock(mu_);
		stop_ = true;
	}
	cv_.notify_all();
	for (auto &t : threads_)
		t.join();
}

void WorkerPool::submit(std::function<void()> job)
{
	{
		std::lock_guard lock(mu_);
		jobs_.push_back(std::move(job));
	}
	cv_.notify_one();
}

size_t WorkerPool::backlog() const
{
	std::lock_guard lock(mu_);
	return jobs_.size();
}

void WorkerPool::run()
{
	std::unique_lock lock(mu_);
	for (;;) {
		cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
		if (jobs_.empty())
			return; // stopping, and nothing left to run
		auto job = std::move(jobs_.front());
		jobs_.pop_front();
		lock.unlock();
		job();
		job = nullptr; // what it captured goes before the lock is taken again
		lock.lock();
	}
}

} // namespace rdmaswap
