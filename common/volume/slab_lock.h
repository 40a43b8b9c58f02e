// SPDX-License-Identifier: MIT
// Locks whose waits end at a deadline on the monotonic clock: a reader-writer lock for one
// slab that never lets readers starve a writer (SlabLock), and a mutex (TimedMutex).
//
// Contracts:
// - SlabLock is writer-preferring: once a writer waits, new readers wait behind it, so a
//   writer gets the lock as soon as the readers already inside leave (each of them holds it
//   for one bounded data round trip). glibc's std::shared_mutex prefers readers: under a
//   steady read load a writer could wait forever (issue 11, item 1).
// - Not recursive. A thread holding a SlabLock shared must not take it shared again (a
//   waiting writer would block the second attempt). Several slabs are locked in ascending
//   slab order only.
// - Every wait is bounded: the *_until calls return false at the deadline, holding nothing.
// - No allocation. Built on std::mutex and std::condition_variable, whose steady-clock waits
//   (pthread_cond_clockwait) ThreadSanitizer understands; it does not intercept
//   pthread_mutex_clocklock or pthread_rwlock_clock*lock (gcc 12), and reported every lock
//   taken with them as unheld.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace rdmaswap {

class SlabLock {
public:
	using Clock = std::chrono::steady_clock;

	SlabLock() = default;
	SlabLock(const SlabLock &) = delete;
	SlabLock &operator=(const SlabLock &) = delete;

	bool lock_shared_until(Clock::time_point deadline)
	{
		std::unique_lock l(m_);
		if (!readers_cv_.wait_until(l, deadline, [this] { return !writer_ && !writers_waiting_; }))
			return false;
		readers_++;
		return true;
	}
	// Unbounded: only for callers whose holders never wait on the network (status).
	void lock_shared()
	{
		std::unique_lock l(m_);
		readers_cv_.wait(l, [this] { return !writer_ && !writers_waiting_; });
		readers_++;
	}
	void unlock_shared()
	{
		std::lock_guard l(m_);
		if (--readers_ == 0 && writers_waiting_)
			writers_cv_.notify_one();
	}
	bool lock_until(Clock::time_point deadline)
	{
		std::unique_lock l(m_);
		writers_waiting_++;
		const bool got =
			writers_cv_.wait_until(l, deadline, [this] { return !writer_ && readers_ == 0; });
		writers_waiting_--;
		if (!got) {
			if (!writers_waiting_ && !writer_)
				readers_cv_.notify_all(); // readers held back for us may go on
			return false;
		}
		writer_ = true;
		return true;
	}
	void unlock()
	{
		std::lock_guard l(m_);
		writer_ = false;
		if (writers_waiting_)
			writers_cv_.notify_one();
		else
			readers_cv_.notify_all();
	}

private:
	std::mutex m_;
	std::condition_variable readers_cv_, writers_cv_;
	unsigned readers_ = 0, writers_waiting_ = 0;
	bool writer_ = false;
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

// A mutex with steady-clock timed waits (Lockable and TimedLockable, for std::unique_lock).
class TimedMutex {
public:
	using Clock = std::chrono::steady_clock;

	TimedMutex() = default;
	TimedMutex(const TimedMutex &) = delete;
	TimedMutex &operator=(const TimedMutex &) = delete;

	bool try_lock()
	{
		std::lock_guard l(m_);
		if (locked_)
			return false;
		locked_ = true;
		return true;
	}
	bool try_lock_until(Clock::time_point deadline)
	{
		std::unique_lock l(m_);
		if (!cv_.wait_until(l, deadline, [this] { return !locked_; }))
			return false;
		locked_ = true;
		return true;
	}
	template <typename Rep, typename Period>
	bool try_lock_for(std::chrono::duration<Rep, Period> d)
	{
		return try_lock_until(Clock::now() + d);
	}
	void lock()
	{
		std::unique_lock l(m_);
		cv_.wait(l, [this] { return !locked_; });
		locked_ = true;
	}
	void unlock()
	{
		{
			std::lock_guard l(m_);
			locked_ = false;
		}
		cv_.notify_one();
	}

private:
	std::mutex m_;
	std::condition_variable cv_;
	bool locked_ = false;
};

} // namespace rdmaswap
