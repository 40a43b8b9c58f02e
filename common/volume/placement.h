// SPDX-License-Identifier: MIT
// Where a new slab's replicas go: power of two choices. For each replica, two distinct donors
// are drawn at random among the eligible ones (alive, with a free slab, not already holding a
// replica of this slab) and the less loaded (lower used/total) wins; or, when asked, the one
// with fewer sessions, the less loaded on a tie (DonorSet chooses its members so). Ties go to
// the first drawn. With one eligible donor it is taken; with none, fewer replicas are placed.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace rdmaswap {

struct DonorLoad {
	uint32_t used = 0;   // slabs granted
	uint32_t total = 0;  // slabs it has
	bool alive = true;
	uint32_t sessions = 0; // hosts with a session on it (STATS or a published hint; 0: unknown)
};

enum class Prefer : uint8_t {
	LeastFull,      // lower used/total
	FewestSessions, // fewer sessions; on a tie, lower used/total
};

// Choose up to `replicas` distinct donors for one slab. Writes their indices to `out` (which
// must hold `replicas` entries) and returns how many were chosen. `exclude` lists donors that
// must not be chosen (they already hold a replica). No allocation.
unsigned place_slab(std::span<const DonorLoad> donors, unsigned replicas,
		    std::span<const uint16_t> exclude, std::minstd_rand &rng, uint16_t *out,
		    Prefer prefer = Prefer::LeastFull);

} // namespace rdmaswap
