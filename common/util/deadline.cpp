// SPDX-License-Identifier: MIT
// The stop signal (an eventfd that stays readable once written) and waits bounded by a deadline.
#include "common/util/deadline.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>

namespace rdmaswap {

namespace {

// Created when the library is loaded, before any thread could wait on it. Never read by the
// waits: once written, it stays readable, so every later poll sees it at once.
const int g_stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
std::atomic<bool> g_stopped{false};

// Milliseconds from now to `deadline`, rounded up (poll must not wake before it), capped.
int poll_ms(Deadline deadline)
{
	const auto left = deadline - Clock::now();
	if (left <= Clock::duration::zero())
		return 0;
	const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
	return ms > INT_MAX / 2 ? INT_MAX / 2 : int(ms);
}

} // namespace

void request_stop()
{
	g_stopped.store(true);
	const uint64_t one = 1;
	if (g_stop_fd >= 0)
		(void)!::write(g_stop_fd, &one, sizeof one);
}

bool stop_requested()
{
	return g_stopped.load(std::memory_order_relaxed);
}

int stop_fd()
{
	return g_stop_fd;
}

void clear_stop_for_tests()
{
	uint64_t v = 0;
	if (g_stop_fd >= 0)
		(void)!::read(g_stop_fd, &v, sizeof v);
	g_stopped.store(false);
}

int wait_ready(int fd, short events, Deadline deadline)
{
	for (;;) {
		if (stop_requested())
			return ECANCELED;
		const int ms = poll_ms(deadline);
		if (ms == 0)
			return ETIMEDOUT;
		pollfd p[2] = {{fd, events, 0}, {g_stop_fd, POLLIN, 0}};
		const int n = ::poll(p, g_stop_fd >= 0 ? 2 : 1, ms);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		if (p[1].revents)
			return ECANCELED;
		if (p[0].revents)
			return 0;
	}
}

int sleep_until(Deadline deadline)
{
	for (;;) {
		if (stop_requested())
			return ECANCELED;
		pollfd p{g_stop_fd, POLLIN, 0};
		const int ms = poll_ms(deadline);
		if (ms == 0)
			return 0;
		const int n = ::poll(&p, g_stop_fd >= 0 ? 1 : 0, ms);
		if (n > 0)
			return ECANCELED;
		if (n < 0 && errno != EINTR)
			return 0;
	}
}

} // namespace rdmaswap
