// SPDX-License-Identifier: MIT
// Deadlines per operation and the process-wide stop signal that every client wait also wakes on.
#pragma once

#include <chrono>

namespace rdmaswap {

using Clock = std::chrono::steady_clock;
// The instant by which a whole operation (a message, an RPC, a handshake, a data batch) must be
// done. Every client wait is bounded by one, never by a per-syscall timeout.
using Deadline = Clock::time_point;

inline Deadline deadline_after(std::chrono::milliseconds timeout)
{
	return Clock::now() + timeout;
}

// Ask every wait of this process (wait_ready, and the waits built on it: socket transfers,
// connects, RDMA completions and CM events) to give up at once with ECANCELED, now and from now
// on. For shutdown: the plugin calls it when nbdkit is exiting. Async-signal-safe, no
// allocation, idempotent.
void request_stop();
// True once request_stop() was called.
bool stop_requested();
// The eventfd that becomes readable at request_stop() (-1 if it could not be made), for waits
// that poll several fds themselves. Never read it.
int stop_fd();
// Undo request_stop(). Tests only: a process that stops does not start again.
void clear_stop_for_tests();

// Wait until `fd` is ready for `events` (POLLIN / POLLOUT; an error or hang-up on the fd counts
// as ready: the next syscall reports it), `deadline` passes, or a stop is requested. Returns 0,
// ETIMEDOUT (also at once when the deadline has passed: callers try their syscall first and
// wait only when it would block), ECANCELED, or poll's errno. EINTR never escapes. No
// allocation.
int wait_ready(int fd, short events, Deadline deadline);

// Sleep until `deadline` unless a stop is requested first: 0, or ECANCELED.
int sleep_until(Deadline deadline);

} // namespace rdmaswap
