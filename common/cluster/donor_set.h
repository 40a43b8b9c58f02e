// SPDX-License-Identifier: MIT
// A volume's bounded donor set: the few donors (`spread`, default 8) where its new slabs go,
// chosen by power of two choices over the live donors with room, so that each donor serves
// a bounded number of hosts however many there are.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "common/volume/placement.h"

namespace rdmaswap {

// The set holds indices into a donor table that the caller owns and passes to every call as
// a span of DonorLoad (index i is donor i; `used`/`total` and `sessions` from the donors'
// published hints or STATS, `alive` the caller's judgement). Indices are uint16_t, like place_slab's: a table of up to
// 65,536 donors (the constructor's `max_donors`); donors at or beyond max_donors() in a span
// are never chosen.
//
// The set is only "where new slabs go". A donor leaves it when it is dead or full (by the
// loads given), or when it is excluded from a placement that the rest of the set cannot
// take; it stays a *retired* member until the caller's count of our slabs on it is zero,
// and take_idle() then hands it back once so that the caller can disconnect it. The caller
// keeps using every donor that holds slabs of ours, member or not.
//
// Not thread-safe: the caller serialises every call (Volume: under its placement mutex).
// Every buffer is allocated by the constructor; no call after it allocates, blocks or logs.
class DonorSet {
public:
	static constexpr unsigned kDefaultSpread = 8;
	static constexpr size_t kMaxDonors = 65536; // uint16_t indices

	// `spread`: the most members at once (>= 1), or 0 for no bound (every live donor with
	// room is a member: the behaviour before donor sets). `max_donors`: the size of the
	// caller's donor table (1..kMaxDonors; larger is clamped). Allocates; may throw
	// std::bad_alloc.
	DonorSet(unsigned spread, size_t max_donors);

	// Drop the members that are dead or full in `donors` (they become retired), then fill
	// the set up to its spread from the eligible donors (alive, with room, not a member),
	// each new member the better of two drawn at random (place_slab, Prefer::FewestSessions):
	// the one with fewer sessions, the less full on a tie, so the less full when the caller
	// has no sessions hint (all 0). Sessions first because sets formed at about the same time
	// see the donors equally empty: by fill alone a donor would join 18 sets where the mean
	// is 8 (placement-sim, docs/performance.md). When no more than the vacancies are
	// eligible, all of them join. Returns how many joined. Cheap (no scan of the table) when
	// the set is full of usable members.
	unsigned refill(std::span<const DonorLoad> donors, std::minstd_rand &rng);

	// Choose up to `replicas` distinct donors for one new slab, all of them members: calls
	// refill(), then place_slab() over the members, never choosing a donor in `exclude`.
	// If the members other than the excluded ones cannot take all replicas, the rest are
	// chosen among the eligible non-members by two choices and join the set, each taking a
	// vacancy or, with none, the place of an excluded member (which retires). Writes the
	// indices to `out` (room for `replicas`) and returns how many were chosen: fewer than
	// `replicas` only when fewer donors are eligible in the whole table (then every
	// eligible one not excluded is chosen; the caller decides whether a slab with fewer
	// replicas will do: Volume keeps it degraded and lets repair add the rest later, when a
	// donor has come or has room). With spread < replicas at most `spread` are chosen.
	unsigned place(std::span<const DonorLoad> donors, unsigned replicas,
		       std::span<const uint16_t> exclude, std::minstd_rand &rng, uint16_t *out);

	// Make donor i a member if there is a vacancy and it is not one already (e.g. the
	// donors a volume was started with). True if it is a member now. No check of its load:
	// the next refill() retires it if it is dead or full.
	bool seed(uint16_t i);

	// Retired members that now hold none of our slabs (held[i] == 0; held is indexed like
	// the donor table, a missing entry counting as 0): written to `out` (room for `max`)
	// and forgotten, so each is reported once; returns how many. The caller may disconnect
	// them. Scans the table only when there are retired members.
	unsigned take_idle(std::span<const uint32_t> held, uint16_t *out, unsigned max);

	// The caller's table entry `i` no longer names the same donor (removed, or its index
	// reused): forget it without reporting it idle.
	void forget(uint16_t i);

	// The members, in no particular order; valid until the next non-const call.
	std::span<const uint16_t> members() const { return {members_.data(), nmembers_}; }
	bool is_member(uint16_t i) const { return i < state_.size() && state_[i] == kMember; }
	bool is_retired(uint16_t i) const { return i < state_.size() && state_[i] == kRetired; }
	// Members at most: spread, or max_donors for an unbounded set.
	unsigned capacity() const { return unsigned(members_.size()); }
	size_t max_donors() const { return state_.size(); }
	// Counts every join and every retirement: a caller that mirrors the set compares it.
	uint64_t changes() const { return changes_; }

private:
	enum State : uint8_t { kNone, kMember, kRetired };
	static bool usable(const DonorLoad &d) { return d.alive && d.used < d.total; }
	void join(uint16_t i);
	void retire(unsigned k); // members_[k]
	// Up to `want` new members by two choices among the eligible non-members that are not
	// in `exclude`; they are written to added_ (not yet joined). Returns how many.
	unsigned choose_new(std::span<const DonorLoad> donors, unsigned want,
			    std::span<const uint16_t> exclude, std::minstd_rand &rng);

	std::vector<uint8_t> state_;      // per donor: State
	std::vector<uint16_t> members_;   // [0, nmembers_) are the members
	unsigned nmembers_ = 0;
	unsigned nretired_ = 0;
	uint64_t changes_ = 0;
	std::vector<DonorLoad> scratch_;  // per donor: the table as place_slab should see it
	std::vector<DonorLoad> local_;    // per member: its load, for place_slab over the set
	std::vector<uint16_t> added_;     // per member slot: donors chosen to join
};

} // namespace rdmaswap
