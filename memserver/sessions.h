// SPDX-License-Identifier: MIT
// Client sessions of a memserver: a session owns slabs and is shared by all of one client's
// connections (control, TCP data, RDMA QPs). It ends, and its slabs are freed, when its last
// connection closes, unless it is bound to a volume with a lease: then it is kept detached
// (slabs untouched) until the lease expires or a new session of the same volume takes it over.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "common/wire/auth.h"
#include "memserver/floors.h"

namespace rdmaswap {

class SessionTable {
public:
	// --max-floors: epoch floors per session (set_floor).
	static constexpr size_t kDefaultMaxFloors = 65536;
	explicit SessionTable(size_t max_floors = kDefaultMaxFloors) : max_floors_(max_floors) {}
	struct Creds {
		uint64_t id = 0;
		uint64_t token = 0;
	};
	// New session with one reference and fresh random id and token. `attach_key`: what its
	// RDMA connects must prove (auth.h; zeros on an --insecure server).
	Creds create(bool rdma, const Mac &attach_key);
	// Add a reference to an existing session if the token matches (compared in constant time).
	bool join(uint64_t id, uint64_t token);
	// What the last leave() of a session decided, in the same critical section that dropped
	// the reference (so no join or takeover can come between the decision and its effect).
	enum class Left {
		Live,     // other references remain (or no such session): nothing to do
		Detached, // bound with a lease: kept, joinable, its slabs untouched; the caller
			  // drops its RDMA state
		Ended,    // removed: it can no longer be joined (ENOENT) or taken over; the
			  // caller drops its RDMA state and frees its slabs
	};
	// Drop a reference of session `id`.
	Left leave(uint64_t id);
	bool wants_rdma(uint64_t id) const;
	// The attach key of session `id`; false if there is no such session.
	bool attach_key(uint64_t id, Mac &out) const;
	uint32_t count() const;
	uint32_t rdma_count() const;
	// Sessions, those of them detached (kept for their lease) and RDMA ones, without a lock
	// (for the metrics endpoint): exact when published, under the table's mutex, after each
	// change.
	struct Counts {
		uint32_t sessions = 0, detached = 0, rdma = 0;
	};
	Counts counts() const;

	// --- Volumes and reattach (docs/interfaces.md). A detached session can be joined again
	// with its token (its client came back), or taken over by a new session that binds the
	// same volume id.
	using Clock = std::chrono::steady_clock;
	// Who created session `id` (for logs and status).
	void set_peer(uint64_t id, const std::string &peer);
	struct BindResult {
		int err = 0;                 // 0, EBUSY (live owner), EINVAL (bound to another volume)
		uint64_t took_over = 0;      // the detached session whose slabs are now ours (0: none)
		std::chrono::milliseconds detached_for{0};
		std::string other_peer;      // EBUSY: the peer of the live owner
	};
	// Bind session `id` to `scoped` (the volume id prefixed with the key id, so that a client
	// holding another key never matches it; `name` is the id as the client gave it). Takes
	// over a detached session of the same volume (its floors move to `id`; the caller moves
	// its slabs with SlabPool::reassign). Binding the same volume again is a no-op.
	BindResult bind(uint64_t id, const std::string &scoped, const std::string &name,
			uint32_t lease_s);
	// True if session `id` exists and is detached (leave() kept it for its lease).
	bool detached(uint64_t id) const;
	struct Expired {
		uint64_t id = 0;
		std::string name, peer;
	};
	// Remove detached sessions whose lease ended by `now`; the caller frees their slabs.
	std::vector<Expired> expire(Clock::time_point now);
	// A chunk's epoch floor in the volume of bound session `id` (epoch 0 removes it).
	// 0, EINVAL (not bound) or ENOSPC (max_floors() floors already; changing or removing
	// one is still allowed).
	int set_floor(uint64_t id, uint64_t chunk, uint64_t epoch);
	// Floors of session `id` with chunk >= start, at most `max`.
	std::vector<std::pair<uint64_t, uint64_t>> floors(uint64_t id, uint64_t start,
							  size_t max) const;
	size_t max_floors() const { return max_floors_; }
	// Floors and sessions freed (removed from the table) since the last call.
	uint64_t take_freed();
	struct Report {
		uint64_t id = 0;
		bool rdma = false, bound = false, detached = false;
		uint32_t refs = 0, lease_s = 0;
		std::chrono::milliseconds lease_left{0};
		std::string name, peer;
	};
	// Every session, sorted by id (control path: allocates).
	std::vector<Report> report(Clock::time_point now) const;

private:
	struct Entry {
		uint64_t token = 0;
		uint32_t refs = 0;
		bool rdma = false;
		Mac attach{};
		std::string peer;
		std::string scoped, name;  // bound volume ("" if not bound)
		uint32_t lease_s = 0;
		bool detached = false;
		Clock::time_point detached_at{};
		std::unique_ptr<FloorMap> floors; // chunk -> epoch floor; null: none yet
	};
	const size_t max_floors_;
	mutable std::mutex mu_;
	std::unordered_map<uint64_t, Entry> map_;
	uint64_t freed_ = 0; // floors and sessions removed, for take_freed()
	// For counts(): stored by publish() (under mu_, after each change of the map or of a
	// session's detached flag: one pass over the table, on transitions only, never per
	// request).
	std::atomic<uint32_t> sessions_n_{0}, detached_n_{0}, rdma_n_{0};
	void publish();
};

// One page of a listing: the entries of `all` that `visible` admits, after skipping the first
// `start` of those, at most `max` (a page shorter than `max` is the last one). Skipping comes
// before cutting, so every visible entry is on exactly one page.
template <class T, class Visible>
std::vector<const T *> list_page(const std::vector<T> &all, Visible visible, uint64_t start,
				 size_t max)
{
	std::vector<const T *> page;
	uint64_t index = 0;
	for (const T &e : all) {
		if (!visible(e) || index++ < start)
			continue;
		if (page.size() >= max)
			break;
		page.push_back(&e);
	}
	return page;
}

// 64 random bits from the kernel's CSPRNG, never 0.
uint64_t random_u64();

} // namespace rdmaswap
