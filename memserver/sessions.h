// SPDX-License-Identifier: MIT
// Client sessions of a memserver: a session owns slabs and is shared by all of one client's
// connections (control, TCP data, RDMA QPs). It ends, and its slabs are freed, when its last
// connection closes.
#pragma once

#include <cstdint>

#include "common/auth.h"
#include <mutex>
#include <optional>
#include <unordered_map>

namespace rdmaswap {

class SessionTable {
public:
	struct Creds {
		uint64_t id = 0;
		uint64_t token = 0;
	};
	// New session with one reference and fresh random id and token. `attach_key`: what its
	// RDMA connects must prove (auth.h; zeros on an --insecure server).
	Creds create(bool rdma, const Mac &attach_key);
	// Add a reference to an existing session if the token matches (compared in constant time).
	bool join(uint64_t id, uint64_t token);
	// Drop a reference; true if it was the last (the caller then frees the session's slabs).
	bool leave(uint64_t id);
	bool wants_rdma(uint64_t id) const;
	// The attach key of session `id`; false if there is no such session.
	bool attach_key(uint64_t id, Mac &out) const;
	uint32_t count() const;
	uint32_t rdma_count() const;

private:
	struct Entry {
		uint64_t token = 0;
		uint32_t refs = 0;
		bool rdma = false;
		Mac attach{};
	};
	mutable std::mutex mu_;
	std::unordered_map<uint64_t, Entry> map_;
};

// 64 random bits from the kernel's CSPRNG, never 0.
uint64_t random_u64();

} // namespace rdmaswap
