// SPDX-License-Identifier: MIT
// Power-of-two-choices placement.
#include "common/volume/placement.h"

#include <algorithm>

namespace rdmaswap {

namespace {

bool eligible(const DonorLoad &d, uint16_t i, std::span<const uint16_t> exclude, const uint16_t *chosen,
	      unsigned nchosen)
{
	if (!d.alive || d.used >= d.total)
		return false;
	if (std::find(exclude.begin(), exclude.end(), i) != exclude.end())
		return false;
	return std::find(chosen, chosen + nchosen, i) == chosen + nchosen;
}

// Compare used/total without division: a.used/a.total < b.used/b.total.
bool less_full(const DonorLoad &a, const DonorLoad &b)
{
	return uint64_t(a.used) * b.total < uint64_t(b.used) * a.total;
}

// Whether `a` is to be preferred to `b`.
bool less_loaded(const DonorLoad &a, const DonorLoad &b, Prefer prefer)
{
	if (prefer == Prefer::FewestSessions && a.sessions != b.sessions)
		return a.sessions < b.sessions;
	return less_full(a, b);
}

} // namespace

unsigned place_slab(std::span<const DonorLoad> donors, unsigned replicas,
		    std::span<const uint16_t> exclude, std::minstd_rand &rng, uint16_t *out,
		    Prefer prefer)
{
	unsigned n = 0;
	while (n < replicas) {
		// Count the eligible donors, then draw two of them by rank (no allocation).
		uint32_t count = 0;
		for (size_t i = 0; i < donors.size(); i++)
			count += eligible(donors[i], uint16_t(i), exclude, out, n);
		if (count == 0)
			break;
		auto nth = [&](uint32_t k) -> uint16_t {
			for (size_t i = 0; i < donors.size(); i++)
				if (eligible(donors[i], uint16_t(i), exclude, out, n) && k-- == 0)
					return uint16_t(i);
			return 0; // unreachable: k < count
		};
		// Two distinct donors when there are two: drawing the same one twice would make
		// that choice blind (with two donors, half of all choices).
		std::uniform_int_distribution<uint32_t> pick(0, count - 1);
		const uint32_t ka = pick(rng);
		uint32_t kb = ka;
		if (count > 1) {
			std::uniform_int_distribution<uint32_t> other(0, count - 2);
			kb = other(rng);
			kb += kb >= ka;
		}
		const uint16_t a = nth(ka);
		const uint16_t b = nth(kb);
		out[n++] = less_loaded(donors[b], donors[a], prefer) ? b : a;
	}
	return n;
}

} // namespace rdmaswap
