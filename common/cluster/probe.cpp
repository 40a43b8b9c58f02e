// SPDX-License-Identifier: MIT
// probe_all (probe.h): a batch of probes on a few short-lived worker threads, one deadline.
#include "common/cluster/probe.h"

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <system_error>

namespace rdmaswap {

namespace {

// 256 KiB: a probe is a connect, an authentication (OpenSSL's HMAC) and one RPC, with its
// buffers on the stack; a default 8 MiB stack would be locked whole (and resident) in a process
// under mlockall(MCL_FUTURE), as nbdkit --swap runs.
constexpr size_t kStack = size_t(256) << 10;

struct Batch {
	std::span<const ProbeTarget> targets;
	const ProbeFn *probe;
	ProbeClock::time_point deadline;
	const std::function<bool(std::span<const ProbeOutcome>)> *enough;
	std::mutex mu;
	size_t next = 0;   // the next target to probe (under mu)
	bool done = false; // enough said so (under mu)
	std::vector<ProbeOutcome> out;

	// The next target to probe, or SIZE_MAX when none should start now.
	size_t take()
	{
		std::lock_guard lock(mu);
		if (done || next >= targets.size() || ProbeClock::now() >= deadline)
			return SIZE_MAX;
		return next++;
	}
	void run()
	{
		for (size_t i; (i = take()) != SIZE_MAX;) {
			const ProbeTarget &t = targets[i];
			const auto start = ProbeClock::now();
			const auto until = t.bound.count() > 0 ? std::min(deadline, start + t.bound)
							       : deadline;
			ProbeOutcome o;
			try {
				if (auto load = (*probe)(t.ep, until)) {
					o.state = ProbeOutcome::State::Ok;
					o.load = *load;
				} else {
					o.state = ProbeOutcome::State::Failed;
					o.why = load.error.empty() ? "no answer" : std::move(load.error);
				}
			} catch (const std::exception &e) {
				o.state = ProbeOutcome::State::Failed;
				o.why = e.what();
			} catch (...) {
				o.state = ProbeOutcome::State::Failed;
				o.why = "unknown exception";
			}
			std::lock_guard lock(mu);
			out[i] = std::move(o);
			if (*enough && (*enough)(out))
				done = true;
		}
	}
	// The worker's exception boundary: nothing leaves a thread (what could throw here is
	// std::bad_alloc or a caller's `enough`: the worker stops taking targets).
	static void *entry(void *self) noexcept
	{
		try {
			static_cast<Batch *>(self)->run();
		} catch (...) {
		}
		return nullptr;
	}
};

} // namespace

std::vector<ProbeOutcome> probe_all(std::span<const ProbeTarget> targets, const ProbeFn &probe,
				    ProbeClock::time_point deadline, unsigned workers,
				    const std::function<bool(std::span<const ProbeOutcome>)> &enough)
{
	Batch b{targets, &probe, deadline, &enough, {}, 0, false, {}};
	b.out.resize(targets.size());
	const size_t n = std::min<size_t>(std::max(1u, workers), targets.size());
	std::vector<pthread_t> threads;
	threads.reserve(n);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, kStack);
	int err = 0;
	for (size_t k = 0; k < n; k++) {
		pthread_t t;
		if ((err = pthread_create(&t, &attr, &Batch::entry, &b)) != 0)
			break; // the workers made do (none: below)
		threads.push_back(t);
	}
	pthread_attr_destroy(&attr);
	if (threads.empty() && n > 0)
		throw std::system_error(err, std::generic_category(), "probes: pthread_create");
	for (pthread_t t : threads)
		pthread_join(t, nullptr);
	return std::move(b.out);
}

} // namespace rdmaswap
