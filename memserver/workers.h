// SPDX-License-Identifier: MIT
// A small fixed pool of threads for the memserver's blocking work (control requests that
// register memory, zero slabs or wait for a session transition; a session's departure), so
// that the event loops never block on it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rdmaswap {

class WorkerPool {
public:
	// Starts `threads` (at least 1) threads.
	explicit WorkerPool(unsigned threads);
	// Runs every job already submitted, then joins the threads.
	~WorkerPool();
	WorkerPool(const WorkerPool &) = delete;
	WorkerPool &operator=(const WorkerPool &) = delete;

	// Queue `job`; some worker runs it soon, in submission order with respect to the other
	// jobs (jobs may run at the same time on different workers). Control path: allocates.
	void submit(std::function<void()> job);
	// Jobs queued and not yet started.
	size_t backlog() const;
	unsigned threads() const { return unsigned(threads_.size()); }

private:
	void run();

	mutable std::mutex mu_;
	std::condition_variable cv_;
	std::deque<std::function<void()>> jobs_;
	bool stop_ = false;
	std::vector<std::thread> threads_;
};

} // namespace rdmaswap
