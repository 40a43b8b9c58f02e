// SPDX-License-Identifier: MIT
// Quotas per identity on a memserver (docs/security.md, "Limits"): how many slabs one owner may
// hold (OwnerAccounts, kept by SlabPool under its mutex) and how many distinct owners one
// address may bind per period (OwnerWindow). An owner is who a session's slabs are counted to:
// for a session bound to a volume, that volume's key (the Ed25519 public key proven at BIND),
// so every session of it (a restarted host, a detached session kept for its lease, several
// connections) shares one count; for a session not bound (yet), the address that created it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "memserver/peers.h"

namespace rdmaswap {

// The slab limit of one owner: the smaller of `max_slabs` (0: none) and `share_percent` of
// `total` slabs (rounded down), at least 1.
uint32_t owner_slab_limit(uint32_t total, uint32_t max_slabs, unsigned share_percent);

// The owner a session is counted to before it binds: its creator's address.
std::string address_owner(const PeerAddr &a);
// The owner of a session bound with volume key `pubkey_hex` (lower-case hex).
std::string key_owner(const std::string &pubkey_hex);

// Slabs held per session and per owner. Not thread-safe: the caller serialises every call
// (SlabPool, under its mutex). A session not assigned to an owner is not counted (unit tests
// of the pool alone; the memserver assigns each session at its HELLO). Allocates only when a
// session or an owner is added (control path).
class OwnerAccounts {
public:
	explicit OwnerAccounts(uint32_t limit = UINT32_MAX) : limit_(limit ? limit : 1) {}
	uint32_t limit() const { return limit_; }
	void set_limit(uint32_t limit) { limit_ = limit ? limit : 1; }
	// Count session `s` (and the slabs it holds) to `owner` from now on. 0, or EDQUOT if the
	// slabs it holds would put `owner` over the limit (then nothing changes; with `force` it
	// is assigned all the same). Assigning the same owner again is a no-op.
	int assign(uint64_t s, const std::string &owner, bool force = false);
	// What assign(s, owner) would answer, changing nothing.
	int check_assign(uint64_t s, const std::string &owner) const;
	// One more slab for session `s`: false (nothing counted) if its owner holds the limit
	// already. True for a session not assigned.
	bool charge(uint64_t s);
	// Session `s` holds `n` slabs fewer (released).
	void uncharge(uint64_t s, uint32_t n);
	// `n` slabs of session `from` now belong to `to` (a takeover).
	void move(uint64_t from, uint64_t to, uint32_t n);
	// Session `s` is over: what it still holds is no longer counted, and it is forgotten.
	void forget(uint64_t s);
	// Slabs counted to `owner`, and to the owner of session `s` (0: none or not assigned).
	uint32_t held(const std::string &owner) const;
	uint32_t held_by_owner_of(uint64_t s) const;
	// How many more slabs the owner of session `s` may take (UINT32_MAX: not assigned).
	uint32_t left(uint64_t s) const;
	// The owner of session `s` ("" if not assigned).
	std::string owner_of(uint64_t s) const;
	size_t owners() const { return owners_.size(); }

private:
	struct Session {
		std::string owner;
		uint32_t slabs = 0;
	};
	struct Owner {
		uint32_t slabs = 0;
		uint32_t sessions = 0;
	};
	void drop_owner(const std::string &owner, uint32_t slabs);
	uint32_t limit_;
	std::unordered_map<uint64_t, Session> sessions_;
	std::unordered_map<std::string, Owner> owners_;
};

// --max-peer-owners: the distinct owners (volume keys) one address has bound within the last
// `period`, at most `max` of them (volume keys are free to mint: without this one address could
// bind as many owners as it likes, each with its own quota). An owner's entry lasts `period`
// after its last BIND from that address, so a host binding its own volumes again and again
// (restarts) counts each once. Thread-safe (one mutex, a leaf in the memserver's lock order).
// Bounded: at most `max` entries per address and `max_peers` addresses (one more address is
// refused while the table is full of live entries).
class OwnerWindow {
public:
	using Clock = std::chrono::steady_clock;
	OwnerWindow(unsigned max, std::chrono::seconds period, size_t max_peers = 65536)
		: max_(max), period_(period), max_peers_(max_peers)
	{
	}
	// A BIND of `owner` from `a` at `now`: true (and recorded) if `a` has bound that owner
	// within the period or has room for one more; false if it has `max` others already.
	bool admit(const PeerAddr &a, const std::string &owner, Clock::time_point now);
	// Distinct owners `a` bound within the period ending at `now`.
	unsigned owners(const PeerAddr &a, Clock::time_point now);
	unsigned max() const { return max_; }
	std::chrono::seconds period() const { return period_; }

private:
	struct Seen {
		std::string owner;
		Clock::time_point last;
	};
	void prune(std::vector<Seen> &v, Clock::time_point now) const;
	const unsigned max_;
	const std::chrono::seconds period_;
	const size_t max_peers_;
	std::mutex mu_;
	std::unordered_map<PeerAddr, std::vector<Seen>, PeerAddrHash> map_;
};

} // namespace rdmaswap
