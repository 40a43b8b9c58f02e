// SPDX-License-Identifier: MIT
// A volume's bounded donor set: membership by power of two choices, placement inside it.
#include "common/cluster/donor_set.h"

#include <algorithm>

namespace rdmaswap {

DonorSet::DonorSet(unsigned spread, size_t max_donors)
{
	max_donors = std::min(max_donors, kMaxDonors);
	const size_t cap = spread == 0 ? max_donors : std::min<size_t>(spread, max_donors);
	state_.assign(max_donors, kNone);
	members_.assign(cap, 0);
	scratch_.assign(max_donors, DonorLoad{});
	local_.assign(cap, DonorLoad{});
	added_.assign(cap, 0);
}

void DonorSet::join(uint16_t i)
{
	if (state_[i] == kRetired)
		nretired_--;
	state_[i] = kMember;
	members_[nmembers_++] = i;
	changes_++;
}

void DonorSet::retire(unsigned k)
{
	const uint16_t i = members_[k];
	members_[k] = members_[--nmembers_];
	state_[i] = kRetired;
	nretired_++;
	changes_++;
}

unsigned DonorSet::choose_new(std::span<const DonorLoad> donors, unsigned want,
			      std::span<const uint16_t> exclude, std::minstd_rand &rng)
{
	want = std::min<unsigned>(want, unsigned(added_.size()));
	const size_t n = std::min(donors.size(), state_.size());
	if (want == 0 || n == 0)
		return 0;
	// The table as place_slab should see it: members and excluded donors are not eligible.
	uint32_t eligible = 0;
	for (size_t i = 0; i < n; i++) {
		scratch_[i] = donors[i];
		if (state_[i] == kMember)
			scratch_[i].alive = false;
		eligible += usable(scratch_[i]);
	}
	for (uint16_t e : exclude) {
		if (e < n && usable(scratch_[e])) {
			scratch_[e].alive = false;
			eligible--;
		}
	}
	if (eligible > want)
		return place_slab(std::span(scratch_.data(), n), want, {}, rng, added_.data(),
				  Prefer::FewestSessions);
	// No choice to make: all of them (an unbounded set takes every donor this way).
	unsigned got = 0;
	for (size_t i = 0; i < n && got < eligible; i++)
		if (usable(scratch_[i]))
			added_[got++] = uint16_t(i);
	return got;
}

unsigned DonorSet::refill(std::span<const DonorLoad> donors, std::minstd_rand &rng)
{
	for (unsigned k = 0; k < nmembers_;) {
		const uint16_t i = members_[k];
		if (i >= donors.size() || !usable(donors[i]))
			retire(k); // the last member moves into slot k
		else
			k++;
	}
	if (nmembers_ == capacity())
		return 0;
	const unsigned n = choose_new(donors, capacity() - nmembers_, {}, rng);
	for (unsigned k = 0; k < n; k++)
		join(added_[k]);
	return n;
}

unsigned DonorSet::place(std::span<const DonorLoad> donors, unsigned replicas,
			 std::span<const uint16_t> exclude, std::minstd_rand &rng, uint16_t *out)
{
	if (replicas == 0)
		return 0;
	refill(donors, rng);
	// Every member is usable now; the excluded ones are hidden from place_slab.
	for (unsigned k = 0; k < nmembers_; k++)
		local_[k] = donors[members_[k]];
	unsigned nexcluded = 0;
	for (uint16_t e : exclude) {
		if (!is_member(e))
			continue;
		for (unsigned k = 0; k < nmembers_; k++) {
			if (members_[k] == e && local_[k].alive) {
				local_[k].alive = false;
				nexcluded++;
			}
		}
	}
	unsigned got = place_slab(std::span(local_.data(), nmembers_), replicas, {}, rng, out);
	for (unsigned k = 0; k < got; k++)
		out[k] = members_[out[k]];
	if (got == replicas)
		return got;
	// The members left cannot take them all: new members from outside, into a vacancy or
	// in the place of an excluded member. Only members were chosen so far, so the new ones
	// are distinct from them.
	const unsigned n = choose_new(donors, replicas - got, exclude, rng);
	for (unsigned j = 0; j < n; j++) {
		if (nmembers_ == capacity()) {
			if (nexcluded == 0)
				break; // spread < replicas: the set holds no more
			unsigned k = 0;
			while (std::find(exclude.begin(), exclude.end(), members_[k]) == exclude.end())
				k++; // there is one: nexcluded > 0
			retire(k);
			nexcluded--;
		}
		join(added_[j]);
		out[got++] = added_[j];
	}
	return got;
}

bool DonorSet::seed(uint16_t i)
{
	if (i >= state_.size())
		return false;
	if (state_[i] == kMember)
		return true;
	if (nmembers_ == capacity())
		return false;
	join(i);
	return true;
}

unsigned DonorSet::take_idle(std::span<const uint32_t> held, uint16_t *out, unsigned max)
{
	unsigned n = 0, seen = 0;
	const unsigned retired = nretired_;
	for (size_t i = 0; i < state_.size() && seen < retired && n < max; i++) {
		if (state_[i] != kRetired)
			continue;
		seen++;
		if (i < held.size() && held[i] != 0)
			continue;
		state_[i] = kNone;
		nretired_--;
		out[n++] = uint16_t(i);
	}
	return n;
}

void DonorSet::forget(uint16_t i)
{
	if (i >= state_.size())
		return;
	if (state_[i] == kRetired) {
		nretired_--;
	} else if (state_[i] == kMember) {
		for (unsigned k = 0; k < nmembers_; k++) {
			if (members_[k] == i) {
				members_[k] = members_[--nmembers_];
				break;
			}
		}
		changes_++;
	}
	state_[i] = kNone;
}

} // namespace rdmaswap
