// SPDX-License-Identifier: MIT
// The memserver's memory: its whole capacity mapped, populated and locked at start, cut into
// slabs that are granted to sessions. Data-path checks are lock-free; grants take a mutex.
// A released slab is zeroed by the pool's own thread (the scrubber), never by the releaser.
// Slabs can be withdrawn (given back to the host's kernel) and restored later.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include "memserver/quota.h"

namespace rdmaswap {

class SlabPool {
public:
	// Maps `capacity` bytes (a multiple of `slab_size`, a power of two >= 64 KiB), populates
	// and mlocks them, and starts the scrubber thread. With lock=false the memory is not
	// locked (unit tests only). Throws std::runtime_error; if locking fails because of
	// RLIMIT_MEMLOCK the message says how to raise it.
	SlabPool(uint64_t capacity, uint64_t slab_size, bool lock = true);
	// Stops the scrubber (slabs still waiting for it are not zeroed: the mapping goes).
	~SlabPool();
	SlabPool(const SlabPool &) = delete;
	SlabPool &operator=(const SlabPool &) = delete;

	uint64_t capacity() const { return capacity_; }
	uint64_t slab_size() const { return slab_size_; }
	uint32_t slabs_total() const { return nslabs_; }
	// Free slabs, counting the released ones the scrubber has not zeroed yet (they are
	// granted once zeroed; see allocate()).
	uint32_t slabs_free() const;
	std::byte *slab_base(uint32_t id) const { return base_ + uint64_t(id) * slab_size_; }
	std::byte *base() const { return base_; }

	// Grant a zeroed slab to `owner` (non-zero). When no zeroed slab is free, a released one
	// whose accesses have ended is zeroed here, by the caller (one slab: bounded), rather than
	// waiting for the scrubber; if there is none but the scrubber is zeroing one, waits for it
	// (at most kAllocWait). nullopt when none is free, or when the quota owner of session
	// `owner` (assign()) holds its limit already: then `*over_quota` (if given) is set.
	std::optional<uint32_t> allocate(uint64_t owner, bool *over_quota = nullptr);
	// Take back a slab `owner` holds, at once: it never waits. From its return no new access
	// to the slab succeeds; the scrubber zeroes it (or, if it is wanted back, drops its pages)
	// and frees it once its in-flight accesses have ended, so memory still being read or
	// written by a connection is never zeroed or granted again. (A TCP access lasts at most
	// the memserver's message timeout: the event loops end it then.) False if `owner` does
	// not hold it.
	bool release(uint32_t id, uint64_t owner);
	// Release every slab `owner` holds; returns how many. Never waits, as release(). The
	// session is over: it is no longer counted to its quota owner (assign()) either.
	uint32_t release_all(uint64_t owner);
	// Wait until every slab released so far has been zeroed (or dropped) and is back in the
	// pool, or until `deadline`; false at the deadline. Tests and diagnostics: no request
	// needs it.
	bool settle(std::chrono::steady_clock::time_point deadline) const;
	// At most this long allocate() waits for the scrubber to finish the slab it is zeroing.
	static constexpr std::chrono::milliseconds kAllocWait{2000};
	bool owns(uint32_t id, uint64_t owner) const;
	// The slabs `owner` holds (control path).
	std::vector<uint32_t> owned_by(uint64_t owner) const;

	// Reattach (control path). A slab's tag says which chunk of its client's volume it holds
	// and the chunk's epoch; a fresh slab has tag {0, 0}, and release() clears it.
	struct Tag {
		uint64_t chunk = 0;
		uint64_t epoch = 0;
	};
	// Set the tag of a slab `owner` holds; false if it does not hold it.
	bool set_tag(uint32_t id, uint64_t owner, const Tag &tag);
	Tag tag(uint32_t id) const;
	// Hand every slab `from` holds to `to` (a session taking over a detached one); their
	// content and tags are kept, and their count moves to `to`'s quota owner; `from` is
	// forgotten. Returns how many.
	uint32_t reassign(uint64_t from, uint64_t to);

	// Quotas per identity (memserver/quota.h; docs/security.md, "Limits"). Control path.
	// The slabs one quota owner may hold (at least 1).
	void set_owner_limit(uint32_t slabs);
	uint32_t owner_limit() const;
	// Count session `session`'s slabs to quota owner `qowner` from now on (OwnerAccounts::
	// assign: 0, or EDQUOT when what it holds would put `qowner` over the limit; with
	// `force` assigned all the same). A session never assigned is not limited.
	int assign(uint64_t session, const std::string &qowner, bool force = false);
	int check_assign(uint64_t session, const std::string &qowner) const;
	// Slabs counted to the quota owner of `session`, and how many more it may take
	// (UINT32_MAX: not assigned).
	uint32_t owner_held(uint64_t session) const;
	uint32_t owner_left(uint64_t session) const;
	// The quota owner of `session` ("" if not assigned), for logs.
	std::string owner_name(uint64_t session) const;
	// Give-back (control path). Withdraw up to `n` more slabs from the pool: free slabs
	// first, at once (their pages are unlocked and released to the kernel, and they are
	// never granted again); then granted slabs are marked *wanted back*: each is withdrawn
	// when its owner releases it. The caller must have deregistered a wanted slab's RDMA MR
	// before it is released (as for any release).
	struct Withdrawal {
		uint32_t now = 0;    // free slabs withdrawn by this call
		uint32_t wanted = 0; // granted slabs newly marked wanted back
	};
	Withdrawal withdraw(uint32_t n);
	// Un-mark up to `n` granted slabs that are wanted back (their owners keep them; a move
	// already under way just frees the slab). Returns how many.
	uint32_t cancel_wanted(uint32_t n);
	// Put back up to `n` withdrawn slabs (populated and locked again), free for grants.
	// Returns how many. Slow (faults in the pages): never on the data path.
	uint32_t restore(uint32_t n);
	// The slabs of `owner` that are wanted back (control path).
	std::vector<uint32_t> wanted_by(uint64_t owner) const;
	uint32_t slabs_withdrawn() const;
	uint32_t slabs_wanted() const;
	// The counts above without a lock (for the metrics endpoint): each is exact when it was
	// published, under the pool's mutex, but they may come from different moments.
	// `zeroing`: released slabs the scrubber has not yet zeroed or dropped (counted in
	// `free`, or in `withdrawn` for those wanted back).
	struct Counts {
		uint32_t total = 0, free = 0, withdrawn = 0, wanted = 0, zeroing = 0;
	};
	Counts counts() const;

	// Data path. On success returns a pointer to [off, off+len) of slab `id`, which `owner`
	// holds, and counts an in-flight access that end_access() must close. nullptr if the slab
	// is not owner's or the range is outside it. No lock, no allocation.
	std::byte *begin_access(uint32_t id, uint64_t owner, uint64_t off, uint64_t len);
	// Close an access: one atomic decrement (no lock, no allocation, no system call). The
	// scrubber sees the count drop to zero when it next looks (kAccessPoll).
	void end_access(uint32_t id) { slabs_[id].inflight.fetch_sub(1); }

private:
	struct Slab {
		// 0: free; kReleasing from release() until it is zeroed and free (or withdrawn)
		std::atomic<uint64_t> owner{0};
		std::atomic<uint32_t> inflight{0}; // in-flight accesses
		Tag tag; // guarded by mu_ (control path only)
	};
	static constexpr uint64_t kReleasing = ~uint64_t(0);
	// Give-back state of a slab (flags_, under mu_). A released slab waiting for the
	// scrubber has 0 (to be zeroed and freed) or kTransit (to be dropped and withdrawn).
	static constexpr uint8_t kWanted = 1;    // granted, to be withdrawn at its release
	static constexpr uint8_t kWithdrawn = 2; // out of the pool, pages released
	static constexpr uint8_t kTransit = 4;   // out of the pool, being withdrawn or restored
	// How often the scrubber looks again at released slabs whose accesses are still open.
	static constexpr std::chrono::milliseconds kAccessPoll{10};
	void wipe(uint32_t id);
	// The scrubber thread: zeroes (or drops) released slabs whose accesses have ended and
	// puts them back, until stop_.
	void scrub_loop();
	// Under mu_: the index in dirty_ of a slab with no access open and flags_ `flags`, or
	// npos.
	size_t ready_dirty(uint8_t flags) const;
	// Under mu_: take dirty_[i] out of the list.
	uint32_t take_dirty(size_t i);
	// Unlock slab `id`'s pages and give them back to the kernel (they read as zeros after).
	void drop_pages(uint32_t id);

	uint64_t capacity_;
	uint64_t slab_size_;
	uint32_t nslabs_;
	std::byte *base_ = nullptr;
	std::unique_ptr<Slab[]> slabs_;
	bool lock_;
	mutable std::mutex mu_; // guards free_, dirty_, the tags, flags_ and the counts below
	std::vector<uint32_t> free_;  // zeroed, grantable
	// Released, owner kReleasing, not yet taken by the scrubber (capacity nslabs_: a push
	// never allocates).
	std::vector<uint32_t> dirty_;
	std::vector<uint8_t> flags_;
	OwnerAccounts accounts_; // slabs held per session and per quota owner
	uint32_t withdrawn_ = 0, wanted_ = 0;
	uint32_t pending_ = 0;   // released slabs on their way to free_ (in dirty_ or being zeroed)
	uint32_t scrubbing_ = 0; // taken from dirty_ and being zeroed or dropped now
	bool stop_ = false;
	std::condition_variable scrub_cv_;        // the scrubber: new work, or stop_
	mutable std::condition_variable done_cv_; // a slab came back (allocate(), settle())
	// Copies of free_.size() + pending_, withdrawn_, wanted_ and dirty_.size() + scrubbing_
	// for counts(), stored by publish() (called under mu_ after each change).
	std::atomic<uint32_t> free_n_{0}, withdrawn_n_{0}, wanted_n_{0}, zeroing_n_{0};
	void publish();
	std::mutex resize_mu_; // serialises withdraw() and restore()
	std::thread scrubber_; // last: started once the rest is made
};

} // namespace rdmaswap
