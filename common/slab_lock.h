// SPDX-License-Identifier: MIT
// A reader-writer lock for one slab that never lets readers starve a writer, with waits that
// end at a deadline.
//
// Contracts:
// - Writer-preferring: once a writer waits, new readers wait behind it, so a writer gets the
//   lock as soon as the readers already inside leave (each of them holds it for one bounded
//   data round trip). glibc's std::shared_mutex prefers readers: under a steady read load a
//   writer could wait forever (issue 11, item 1).
// - Not recursive. A thread holding it shared must not take it shared again (a waiting writer
//   would block the second attempt). Several slabs are locked in ascending slab order only.
// - Every wait is bounded: the *_until calls return false at the deadline, holding nothing.
// - No allocation; one pthread_rwlock_t.
#pragma once

#include <pthread.h>

#include <cerrno>
#include <chrono>
#include <ctime>

namespace rdmaswap {

class SlabLock {
public:
	using Clock = std::chrono::steady_clock; // CLOCK_MONOTONIC on Linux

	SlabLock()
	{
		pthread_rwlockattr_t attr;
		pthread_rwlockattr_init(&attr);
		pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
		pthread_rwlock_init(&l_, &attr);
		pthread_rwlockattr_destroy(&attr);
	}
	~SlabLock() { pthread_rwlock_destroy(&l_); }
	SlabLock(const SlabLock &) = delete;
	SlabLock &operator=(const SlabLock &) = delete;

	bool lock_shared_until(Clock::time_point deadline)
	{
		const timespec ts = to_timespec(deadline);
		int r;
		while ((r = pthread_rwlock_clockrdlock(&l_, CLOCK_MONOTONIC, &ts)) == EINTR)
			;
		return r == 0;
	}
	bool lock_until(Clock::time_point deadline)
	{
		const timespec ts = to_timespec(deadline);
		int r;
		while ((r = pthread_rwlock_clockwrlock(&l_, CLOCK_MONOTONIC, &ts)) == EINTR)
			;
		return r == 0;
	}
	// Unbounded: only for callers whose holders never wait on the network (status).
	void lock_shared() { pthread_rwlock_rdlock(&l_); }
	void unlock_shared() { pthread_rwlock_unlock(&l_); }
	void unlock() { pthread_rwlock_unlock(&l_); }

private:
	static timespec to_timespec(Clock::time_point t)
	{
		const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
					t.time_since_epoch())
					.count();
		timespec ts;
		ts.tv_sec = time_t(ns / 1000000000);
		ts.tv_nsec = long(ns % 1000000000);
		return ts;
	}
	pthread_rwlock_t l_;
};

// Holds a SlabLock shared or exclusive until destroyed (if it got it).
class SlabGuard {
public:
	enum Mode { Shared, Exclusive };
	SlabGuard(SlabLock &l, Mode m, SlabLock::Clock::time_point deadline) : l_(&l)
	{
		held_ = m == Shared ? l.lock_shared_until(deadline) : l.lock_until(deadline);
		shared_ = m == Shared;
	}
	~SlabGuard() { release(); }
	SlabGuard(const SlabGuard &) = delete;
	SlabGuard &operator=(const SlabGuard &) = delete;
	explicit operator bool() const { return held_; }
	void release()
	{
		if (held_)
			shared_ ? l_->unlock_shared() : l_->unlock();
		held_ = false;
	}

private:
	SlabLock *l_;
	bool held_ = false;
	bool shared_ = true;
};

} // namespace rdmaswap
