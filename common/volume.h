// SPDX-License-Identifier: MIT
// A volume: `size` bytes cut into slabs that live on memservers, each slab on up to
// kMaxReplicas donors, with the block-device operations the nbdkit plugin needs.
//
// Contracts:
// - Thread-safe. The I/O path allocates no memory and takes no lock shared by all threads:
//   each worker uses its own channel (own connections and registered buffer) and takes only
//   the per-slab locks of the slabs it touches.
// - A range never written (or trimmed) reads as zeros without a network round trip.
// - A write returns 0 only when every byte is held by at least one replica that is still
//   valid; replicas that failed it are invalidated (never read again) and repaired later.
// - A read that fails on one replica falls back to another. When no valid replica of a slab
//   is left, its reads and writes fail with EIO: never zeros, never stale bytes.
// - A background thread restores `replicas` copies of degraded slabs on other donors.
// - Reattach (servers bound to a volume, Server::bound()): every replica is
//   tagged on its memserver with (chunk, epoch). A write acknowledged by fewer than
//   `replicas` replicas first raises the epoch of those that took it above every replica
//   that did not (and records the epoch as a floor on the other donors), so a restarted
//   volume, which trusts only the highest epoch of each chunk, never reads a replica that
//   missed an acknowledged write. See docs/replication.md, "Restart".
// - A background thread restores `replicas` copies of degraded slabs on other donors, and
//   moves slabs that their donor wants back (give-back) to other donors before freeing them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <span>
#include <thread>
#include <vector>

#include "common/transport.h"

namespace rdmaswap {

struct VolumeOptions {
	uint64_t size = 0;
	// Data channels (each with its own connection to every server and its own registered
	// buffer). Worker threads map onto them; more threads than channels share with a
	// per-channel lock.
	unsigned channels = 16;
	// Registered bounce buffer per channel; requests larger than this are split.
	size_t buffer_size = 256 * 1024;
	// Bound on waiting for another thread's allocation or release of a slab.
	std::chrono::milliseconds timeout{10000};
	// Copies of each slab on distinct donors (1..kMaxReplicas, at most the server count).
	unsigned replicas = 1;
	// How often the repair thread looks for degraded slabs (and reconciles forgotten slabs
	// with their donors) when nothing wakes it.
	std::chrono::milliseconds repair_interval{500};
	// A donor that failed is not given new slabs for this long.
	std::chrono::milliseconds down_cooldown{10000};
	// Servers of the volume that are not among `servers` (unreachable at start). Reattach
	// counts them as missing (reattach.h).
	unsigned missing_servers = 0;
};

struct VolumeStats {
	uint64_t slabs = 0;          // slabs the volume is cut into
	uint64_t slabs_live = 0;     // slabs holding data (at least one replica, valid or not)
	uint64_t degraded = 0;       // live slabs with fewer valid replicas than wanted
	uint64_t lost = 0;           // live slabs with no valid replica (reads fail with EIO)
	uint64_t repaired = 0;       // replicas re-created by the repair thread
	uint64_t repair_bytes = 0;   // bytes copied by the repair thread
	uint64_t server_failures = 0;
	uint64_t epoch_raises = 0;   // degraded writes that raised a chunk's epoch
	uint64_t reattached = 0;     // chunks taken over from a previous plugin at start
	uint64_t reattach_stale = 0; // replicas found at start that were older: given back
	uint64_t migrated = 0;        // slabs moved off a donor that wanted them back
	uint64_t migrate_bytes = 0;   // bytes copied by those moves
	uint64_t migrate_ms = 0;      // time spent copying them (throughput: bytes / time)
	uint64_t migrate_pending = 0; // slabs wanted back that could not move (last pass)
};

class Volume {
public:
	static constexpr size_t kMaxServers = 64;
	static constexpr unsigned kMaxReplicas = 3;

	// Takes ownership of connected servers (at least one; all must report the same slab size)
	// and opens every channel's data paths. Throws std::runtime_error with a clear message.
	Volume(std::vector<std::unique_ptr<Server>> servers, const VolumeOptions &opts);
	~Volume();
	Volume(const Volume &) = delete;
	Volume &operator=(const Volume &) = delete;

	uint64_t size() const { return size_; }
	uint64_t slab_size() const { return slab_size_; }
	unsigned replicas() const { return replicas_; }

	// Each returns 0 or an errno for the client: EINVAL for a range outside the volume,
	// ENOSPC when no donor has room for a new slab, EIO for everything else.
	int pread(void *buf, uint32_t count, uint64_t offset);
	int pwrite(const void *buf, uint32_t count, uint64_t offset);
	// trim: whole slabs inside the range are given back to their memservers and read as zeros
	// afterwards; partial slabs are left as they are (trim is advisory).
	int trim(uint32_t count, uint64_t offset);
	// zero: whole slabs are given back; partial ranges of written slabs get zeros written. With
	// `fast_only`, returns ENOTSUP (changing nothing) if zeros would have to be written.
	int zero(uint32_t count, uint64_t offset, bool fast_only);

	VolumeStats stats() const;
	// The status report: stats() plus one line per donor, as `key=value` lines (control
	// path: allocates).
	std::string status_text() const;
	// Wake the repair thread now (tests; also called on every donor failure).
	void kick_repair();

private:
	struct Replica {
		uint16_t server = 0;
		uint32_t gen = 0; // the server's generation when this replica was last known good
		SlabGrant grant;
		uint64_t epoch = 0; // its tag's epoch on the server (bound volumes)
	};
	struct Slab {
		mutable std::shared_mutex mu; // shared: I/O; exclusive: allocate, trim, repair
		uint8_t nrep = 0;             // 0: never written (reads zeros)
		bool lost = false;            // nrep 0 after a reattach that could not find it: EIO
		Replica rep[kMaxReplicas];
		// Bound volumes. `epoch`: the chunk's epoch (new replicas get it); changed under
		// epoch_mu (with mu shared) or with mu exclusive. `floored`: floors recorded up to.
		std::mutex epoch_mu;
		uint64_t epoch = 1;
		uint64_t floored = 0;
	};
	struct ServerState {
		std::atomic<uint32_t> gen{0};
		std::atomic<int64_t> down_until{0}; // steady_clock ns; no new slabs before this
		std::atomic<uint32_t> used{0};      // slabs this volume holds there
	};
	struct Channel {
		std::mutex mu;
		std::byte *buf = nullptr;
		std::vector<std::unique_ptr<DataPath>> paths; // one per server
	};
	struct Piece {
		uint64_t slab;
		uint64_t off;   // within the slab
		uint32_t len;
		uint32_t pos;   // within the chunk / channel buffer
	};

	Channel &channel();
	int check_range(uint64_t count, uint64_t offset) const;
	// Length of the chunk starting at `at` with `left` bytes to go.
	uint32_t chunk_len(uint64_t at, uint64_t left) const;
	// Split [offset, offset+len) (len <= buffer_size) into per-slab pieces. Returns count.
	unsigned split(uint64_t offset, uint32_t len, Piece *out) const;
	bool valid(const Replica &r) const;
	unsigned valid_count(const Slab &s) const;
	// A replica on `server` missed a write that another replica took, or failed a read that
	// another replica can serve: none of its replicas is read again (they are repaired).
	void invalidate(uint16_t server);
	// `server` failed a control call: give it no new slabs for a while.
	void mark_down(uint16_t server);
	// Choose up to `want` donors for a slab (power of two choices), avoiding `exclude` and,
	// unless nothing else has room, donors on cooldown. Returns how many went to `out`.
	unsigned place(unsigned want, std::span<const uint16_t> exclude, uint16_t *out);
	// Give `s` (exclusively locked, empty) `replicas_` replicas. 0, ENOSPC or EIO.
	int allocate(Slab &s);
	// Lock `slab` shared, allocating it first if it is empty. 0 or errno (unlocked on error).
	int lock_for_write(uint64_t slab);
	int give_back(uint64_t slab);
	// Return one replica's slab to its server: freed at once if the server is healthy,
	// otherwise forgotten (reclaimed later) so that a hung donor never blocks us.
	// True if the server confirmed it took the slab back (or the session is gone with it).
	bool release_replica(const Replica &r);
	// Record `epoch` as the floor of `slab` on every healthy donor not in `skip` (bit per
	// server). Best effort.
	void record_floor(uint64_t slab, uint64_t epoch, uint64_t skip);
	int read_chunk(Channel &ch, uint64_t at, uint32_t len);
	// Write the channel buffer's first `len` bytes to [at, at+len).
	int write_chunk(Channel &ch, uint64_t at, uint32_t len);
	// Take over what the memservers kept for our volume (constructor, bound volumes).
	void recover(unsigned missing);
	// A write of slab `slab` was taken by the replicas in `took` (bit k: rep[k]) only, fewer
	// than replicas_: make sure their epoch is above every other replica's and recorded as
	// a floor elsewhere before it is acknowledged. 0 or EIO. Slab held shared.
	int fence_stale(uint64_t slab, uint8_t took);
	void repair_loop();
	// Copy the whole slab from replica `src` into grant `g` on server `dst` through `ch`,
	// counting the bytes in `bytes`. False if a transfer failed (that donor is marked down).
	bool copy_slab(Channel &ch, const Replica &src, uint16_t dst, const SlabGrant &g,
		       std::atomic<uint64_t> &bytes);
	// Give-back: ask every donor which of our slabs it wants back and move them. Returns the
	// number of wanted slabs that could not move.
	uint64_t migrate_wanted(Channel &ch);
	// Move the replica of `slab` held as slab `id` on `server` to another donor (not one
	// holding a copy), then free it. True when moved or nothing is left to move.
	bool migrate(uint64_t slab, uint16_t server, uint32_t id, Channel &ch);
	// Restore the replica count of one slab. Returns true if it changed anything.
	bool repair(uint64_t slab, Channel &ch);

	std::vector<std::unique_ptr<Server>> servers_;
	std::unique_ptr<ServerState[]> sstate_;
	const uint64_t size_;
	uint64_t slab_size_ = 0;
	const size_t buffer_size_;
	unsigned replicas_ = 1;
	const std::chrono::milliseconds repair_interval_;
	const std::chrono::milliseconds down_cooldown_;
	std::unique_ptr<Slab[]> slabs_;
	uint64_t nslabs_ = 0;
	std::byte *region_ = nullptr;
	size_t region_len_ = 0;
	std::vector<std::unique_ptr<Channel>> channels_; // the last one belongs to repair
	std::mutex place_mu_;  // placement (rng, load snapshot): allocation path only
	std::minstd_rand rng_;

	bool tagged_ = false; // every server is bound to the volume
	std::atomic<uint64_t> repaired_{0}, repair_bytes_{0}, server_failures_{0};
	std::atomic<uint64_t> epoch_raises_{0}, reattached_{0}, reattach_stale_{0};
	std::atomic<uint64_t> migrated_{0}, migrate_bytes_{0}, migrate_pending_{0}, migrate_ns_{0};
	std::mutex repair_mu_;
	std::condition_variable repair_cv_;
	bool repair_kick_ = false;
	bool stop_ = false;
	std::thread repair_thread_;
	// Give-back: a thread of its own asks the donors which slabs they want back (WANTED), so
	// that a hung donor stalls it, never the repair thread; migrate_wanted() takes its lists.
	void poll_loop();
	std::mutex wanted_mu_;
	std::vector<std::vector<uint32_t>> wanted_; // by server, under wanted_mu_
	std::thread poll_thread_;
};

} // namespace rdmaswap
