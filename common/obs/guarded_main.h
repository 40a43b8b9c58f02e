// SPDX-License-Identifier: MIT
// Exception boundaries (docs/architecture.md, "Exception boundaries"): a program's, shared by
// the memserver's and the tools' main(), and a thread's, shared by every thread the project
// starts (and the callbacks a C library calls on its own threads).
#pragma once

#include <chrono>
#include <cstdio>
#include <exception>
#include <string_view>

#include "common/obs/log.h"

namespace rdmaswap {

// Runs `run(argc, argv)` and returns its status; whatever it throws is reported on stderr as
// "PROG: what" and the program exits with status 1, never through std::terminate.
inline int guarded_main(const char *prog, int (*run)(int, char **), int argc, char **argv) noexcept
{
	try {
		return run(argc, argv);
	} catch (const std::exception &e) {
		std::fprintf(stderr, "%s: %s\n", prog, e.what());
	} catch (...) {
		std::fprintf(stderr, "%s: unexpected failure\n", prog);
	}
	return 1;
}

// What a thread's boundary does once it has logged what the thread's body threw.
enum class AfterFailure {
	End,   // the thread ends (what its loss needs was done by the `failed` callback)
	Again, // the body runs again (the callback waited first, as long as the thread should)
};

namespace detail {

// The text of the exception being handled, copied into `buf` (no allocation). Call it only
// inside a catch block.
inline void current_exception_text(char *buf, size_t n) noexcept
{
	try {
		throw;
	} catch (const std::exception &e) {
		std::snprintf(buf, n, "%s", e.what());
	} catch (...) {
		std::snprintf(buf, n, "an exception of an unknown type");
	}
}

} // namespace detail

// A thread's exception boundary: runs body() and returns when it returns. Nothing it throws
// reaches std::terminate (which would abort the process: nbdkit and the host's swap with it,
// or a memserver and every slab it holds). A failure is logged on logger `component` as an
// error naming the thread and what its loss becomes, "THREAD failed: WHAT; THEN" (a thread
// that fails again logs that at debug level, and as an error again only 10 minutes after its
// last error line, with the count); then `failed(what)` (`what` lives until it returns; it
// should not throw: if it does, the thread ends) does what the failure needs and decides:
// AfterFailure::End (the function returns: the thread ends) or AfterFailure::Again (body()
// runs again; `failed` waits first, e.g. until the thread's next interval or its stop).
// Allocates nothing of its own.
template <typename Body, typename Failed>
void guarded_thread(std::string_view component, const char *thread, const char *then, Body &&body,
		    Failed &&failed) noexcept
{
	constexpr auto kRelog = std::chrono::minutes(10);
	std::chrono::steady_clock::time_point logged{};
	bool ever = false;
	unsigned long unlogged = 0;
	for (;;) {
		char what[512];
		try {
			body();
			return;
		} catch (...) {
			detail::current_exception_text(what, sizeof what);
		}
		try {
			const auto now = std::chrono::steady_clock::now();
			if (!ever || now - logged >= kRelog) {
				if (unlogged)
					logger(component)->error("{} failed: {}; {} ({} more failures "
								 "since the last such line)",
								 thread, what, then, unlogged);
				else
					logger(component)->error("{} failed: {}; {}", thread, what,
								 then);
				logged = now;
				unlogged = 0;
			} else {
				logger(component)->debug("{} failed again: {}", thread, what);
				unlogged++;
			}
		} catch (...) { // (a log line that cannot be written is lost, nothing more)
		}
		ever = true;
		try {
			if (failed(static_cast<const char *>(what)) == AfterFailure::End)
				return;
		} catch (...) { // (a callback that throws after all: the thread ends)
			return;
		}
	}
}

// The same boundary for a callback that a C library calls on a thread of its own (e.g.
// libmicrohttpd's request handler): runs body(); true if it returned, false if it threw, which
// is logged as an error on logger `component`, "WHAT_FAILED failed: WHAT" (each time: the
// caller answers the failure, e.g. with an error reply, and the library's thread goes on).
template <typename Body>
bool guarded_call(std::string_view component, const char *what_failed, Body &&body) noexcept
{
	char what[512];
	try {
		body();
		return true;
	} catch (...) {
		detail::current_exception_text(what, sizeof what);
	}
	try {
		logger(component)->error("{} failed: {}", what_failed, static_cast<const char *>(what));
	} catch (...) {
	}
	return false;
}

} // namespace rdmaswap
