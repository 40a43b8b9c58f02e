// SPDX-License-Identifier: MIT
// Probing many donors at once (issue 26, S6): each probe asks one donor whether it answers (the
// plugin's: an authenticated STATS), a few worker threads run them in parallel, and the whole
// batch ends by one deadline, so that silent addresses cost the batch its deadline at most, not
// one timeout each. Control path only (the plugin's start, the membership thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/util/config.h"
#include "common/util/result.h"
#include "common/volume/placement.h"

namespace rdmaswap {

using ProbeClock = std::chrono::steady_clock;

// One probe: the donor's load (its own counts), or a failure saying why. Must end by
// `deadline` (it may run on any of the workers, several at once: thread-safe). An exception
// counts as a failure (its what() is the why).
using ProbeFn =
	std::function<Result<DonorLoad>(const Endpoint &ep, ProbeClock::time_point deadline)>;

struct ProbeTarget {
	Endpoint ep;
	// This probe ends by min(start + bound, the batch's deadline): a short bound for donors
	// the caller merely considers, so that silent ones hold a worker briefly.
	std::chrono::milliseconds bound{0};
};

struct ProbeOutcome {
	enum class State { NotRun, Ok, Failed } state = State::NotRun;
	DonorLoad load{0, 0, true, 0}; // Ok: the donor's counts
	std::string why;               // Failed: why
};

// Probe `targets`, in their order, up to `workers` at a time (>= 1; threads of 256 KiB
// stacks, made for the batch and joined before it returns), until every one was probed, the
// `deadline` passed (no probe starts after it: those left are NotRun), or `enough` (if given;
// called after each probe ends, with the outcomes so far, under the batch's lock: cheap, no
// wait) returns true (no further probe starts). Returns once the probes started have ended:
// by the deadline when each probe keeps its own. One outcome per target, same order. Throws
// std::system_error only if not a single worker can be made.
std::vector<ProbeOutcome>
probe_all(std::span<const ProbeTarget> targets, const ProbeFn &probe,
	  ProbeClock::time_point deadline, unsigned workers,
	  const std::function<bool(std::span<const ProbeOutcome>)> &enough = {});

} // namespace rdmaswap
