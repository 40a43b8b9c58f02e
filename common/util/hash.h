// SPDX-License-Identifier: MIT
// FNV-1a, 64 bits: a stable hash of names for file names (not for anything a peer may choose to
// collide).
#pragma once

#include <cstdint>
#include <string_view>

namespace rdmaswap {

inline constexpr uint64_t kFnv1aBasis = 14695981039346656037ull; // FNV's 64-bit offset basis
inline constexpr uint64_t kFnv1aPrime = 1099511628211ull;

// FNV-1a of `s` from `h` (the offset basis for a new hash; a previous result to go on hashing).
constexpr uint64_t fnv1a64(std::string_view s, uint64_t h = kFnv1aBasis)
{
	for (const char c : s)
		h = (h ^ uint64_t(static_cast<unsigned char>(c))) * kFnv1aPrime;
	return h;
}

} // namespace rdmaswap
