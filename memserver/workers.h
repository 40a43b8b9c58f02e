// SPDX-License-Identifier: MIT
// A small fixed pool of threads for the memserver's blocking work (control requests that
// register memory or wait for a session transition; a session's departure), so that the event
// loops never block on it. Handshakes have a lane of their own, so that they never queue
// behind that work.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rdmaswap {

class WorkerPool {
public:
	// Which queue a job waits in. Every worker takes a waiting handshake before any control
	// job, and one more thread takes handshakes only: a handshake waits behind other
	// handshakes at most, never behind control work (an RDMA registration of many slabs,
	// give-back's page work, a FREE, a session's departure), however much of it is queued or
	// running.
	enum class Lane : uint8_t {
		Handshake, // HELLO, BIND, an RDMA connect request
		Control,   // everything else
	};
	// Starts `threads` (at least 1) threads for both lanes, and one for handshakes only.
	explicit WorkerPool(unsigned threads);
	// Runs every job already submitted, then joins the threads.
	~WorkerPool();
	WorkerPool(const WorkerPool &) = delete;
	WorkerPool &operator=(const WorkerPool &) = delete;

	// Queue `job` in `lane`; some worker runs it soon, in submission order with respect to
	// the other jobs of its lane (jobs may run at the same time on different workers).
	// Control path: allocates.
	void submit(Lane lane, std::function<void()> job);
	void submit(std::function<void()> job) { submit(Lane::Control, std::move(job)); }
	// Jobs queued and not yet started (both lanes).
	size_t backlog() const;
	// The threads for both lanes (not counting the handshake-only one).
	unsigned threads() const { return unsigned(threads_.size()) - 1; }

private:
	void run(bool handshakes_only);
	static void run_one(std::function<void()> &job) noexcept;

	mutable std::mutex mu_;
	std::condition_variable cv_;    // any job (the workers of both lanes)
	std::condition_variable hs_cv_; // a handshake (the handshake-only thread)
	std::deque<std::function<void()>> handshakes_, jobs_;
	bool stop_ = false;
	std::vector<std::thread> threads_;
};

} // namespace rdmaswap
