// SPDX-License-Identifier: MIT
// A volume: `size` bytes cut into slabs that live on memservers, each slab on up to
// kMaxReplicas donors, with the block-device operations the nbdkit plugin needs.
//
// Contracts:
// - Thread-safe. The I/O path allocates no memory and takes no lock shared by all threads:
//   a request takes a free data channel (own connections and registered buffer) and only
//   the per-slab locks of the slabs it touches.
// - Every wait of an operation is bounded by `timeout` (a data round trip, a control call,
//   a lock): a hung or trickling donor costs at most that, then the request fails over to
//   another replica or fails with EIO. No thread waits on the network while holding a slab
//   lock exclusively or a channel other than its own (docs/architecture.md, "Concurrency
//   model: the volume").
// - A range never written (or trimmed) reads as zeros without a network round trip.
// - A write returns 0 only when every byte is held by at least one replica that is still
//   valid; replicas that failed it are invalidated (never read again) and repaired later.
// - A read that fails on one replica falls back to another. When no valid replica of a slab
//   is left, its reads and writes fail with EIO: never zeros, never stale bytes.
// - Reattach (servers bound to a volume, Server::bound()): every replica is
//   tagged on its memserver with (chunk, epoch). A write acknowledged by fewer than
//   `replicas` replicas first raises the epoch of those that took it above every replica
//   that did not (and records the epoch as a floor on the other donors), so a restarted
//   volume, which trusts only the highest epoch of each chunk, never reads a replica that
//   missed an acknowledged write. See docs/replication.md, "Restart".
// - A background thread restores `replicas` copies of degraded slabs on other donors, and
//   moves slabs that their donor wants back (give-back) to other donors before freeing them.
//   Both copy while the slab keeps serving reads and writes, and switch over in a short
//   exclusive section.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <span>
#include <thread>
#include <vector>

#include "common/obs/metrics_text.h"
#include "common/transport/transport.h"
#include "common/util/counters.h"
#include "common/util/mapped_region.h"
#include "common/volume/backup.h"
#include "common/volume/placement.h"
#include "common/volume/slab_lock.h"

namespace rdmaswap {

struct VolumeOptions {
	uint64_t size = 0;
	// Data channels (each with its own registered buffer). Worker threads map onto them;
	// more threads than channels share with a per-channel lock.
	unsigned channels = 16;
	// Data connections (RDMA: queue pairs) to each donor for I/O, shared by the channels:
	// a request takes one that is free (each has a lock), else waits for its channel's
	// usual one (channel index % paths), up to the timeout. A donor carries
	// min(paths, channels) + 1 of them per volume (the one more: the repair thread's),
	// whatever `channels` is. 1..1024; the default: one per default channel, none shared
	// (docs/performance.md, "Issue 28": sharing costs a wake-up per request).
	unsigned paths = 16;
	// Registered bounce buffer per channel; requests larger than this are split.
	size_t buffer_size = 256 * 1024;
	// Bound on every wait of one operation: a data round trip, a control call, a channel or
	// slab lock (the data paths and control connections are made with the same timeout).
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
	// Of the servers given at start, the first `start_holders` may hold slabs of the volume
	// (a reattach counts those that hand nothing back as missing); the rest are known to
	// hold none (donors that are not in the volume's holders record: fresh members of its
	// donor set), so handing nothing back is expected of them. Default: all may.
	size_t start_holders = SIZE_MAX;
	// Donors the volume can ever use, those at start and those added later (add_server()):
	// every per-donor table (states, data paths) is allocated for this many
	// at construction, so that the data path never allocates. 1..kMaxServers.
	unsigned max_servers = 4096;
	// The disk backup tier (backup.h): empty: none. Every write also goes to this file; it
	// serves slabs left with no valid replica (reads, writes, and repair's copies) and, after
	// a restart, the slabs no donor kept (if the previous run closed it cleanly).
	std::string backup_path;
	std::string backup_volume;            // the volume's name, stored in the file
	size_t backup_queue = 32 << 20;       // bytes of queue between writes and the file
	uint64_t run_id = 0, previous_run_id = 0; // (backup.h, BackupOptions)
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
	uint64_t clone_aborts = 0;    // copies abandoned (a donor failed, or I/O needed the slab)
	uint64_t switch_us_max = 0;   // longest exclusive switch-over section after a copy
	uint64_t switch_blocks_max = 0; // most blocks copied in one (at most kSwitchDirtyBlocks)
	// backup= only:
	uint64_t backup_only = 0;      // live slabs with no valid replica, served by the backup
	uint64_t backup_unbacked = 0;  // slabs the backup does not hold (write errors, restart)
	uint64_t backup_errors = 0;    // failed writes to the backup file
	uint64_t backup_full_waits = 0; // writes that waited for room in the backup queue
	uint64_t backup_queued = 0;    // bytes queued for the backup file now
};

// The errors a request returned to the client, by operation and errno.
enum class VolumeOp : uint8_t { Read, Write, Trim, Zero };
inline constexpr size_t kVolumeOps = 4;
enum class VolumeErr : uint8_t { Eio, Enospc, Einval, Other };
inline constexpr size_t kVolumeErrs = 4;

// Everything the status file and the metrics file report, gathered once (control path).
struct VolumeReport {
	VolumeStats st;
	uint64_t size = 0, slab_size = 0;
	unsigned replicas = 0;
	// The I/O channels (not the repair thread's copies): requests served and bytes moved
	// (bytes: of requests that succeeded).
	uint64_t reads = 0, writes = 0, read_bytes = 0, write_bytes = 0;
	LatencySnapshot read_latency, write_latency; // every read and write, failed ones too
	DataPathCounters dp;
	std::array<std::array<uint64_t, kVolumeErrs>, kVolumeOps> errors{};
	uint64_t lock_timeouts = 0; // no channel, slab or path lock within the bound
	struct Donor {
		std::string name;   // host:port
		// "ok", "failed" (cooling down), "lost" (session gone), "retired" (no new slabs:
		// its registration vanished, add_server's caller said so), "outside" (not in the
		// donor set: new slabs only when no member has room)
		const char *state;
		uint32_t slabs = 0; // slabs of this volume there
		uint32_t generation = 0;
		uint64_t free_on_donor = 0;
	};
	std::vector<Donor> donors;
};

class Volume {
public:
	static constexpr size_t kMaxServers = 4096;
	static constexpr unsigned kMaxReplicas = 3;

	// Takes ownership of connected servers (at least one; all must report the same slab size)
	// and opens their data paths. Throws std::runtime_error with a clear message.
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
	// The status report: stats(), the I/O channels' request and data path counters (summed
	// without taking a channel), and one line per donor, as `key=value` lines (control path:
	// allocates).
	std::string status_text() const;
	// The same report in the Prometheus text format (rdmaswap_volume_* families;
	// docs/metrics.md). Control path: allocates.
	std::string metrics_text() const;
	// What both reports are made of.
	VolumeReport report() const;
	// Wake the repair thread now (tests; also called on every donor failure).
	void kick_repair();

	// ---- Donors added and retired while the volume serves (control path) ----
	// Add a connected server (same slab size, max_io >= the channel buffer, bound to the
	// volume iff the others are, and not holding slabs kept for the volume from an earlier
	// run: those are taken over only at start). Opens its data paths (min(paths, channels)
	// + 1: network waits; no lock the data path needs is held), then publishes it: from then on
	// placement may choose it. Returns its index (stable for the volume's life). Throws
	// std::runtime_error, naming the server and why, if it does not fit or the paths fail,
	// or when max_servers donors were added already. Calls are serialised.
	size_t add_server(std::unique_ptr<Server> server);
	// Donors known so far (indices 0..servers()-1; never decreases).
	size_t servers() const { return nservers_.load(std::memory_order_acquire); }
	const Server &server(size_t i) const { return *servers_[i]; }
	// A retired donor gets no new slabs (placement, repair and moves skip it); the replicas
	// it holds stay valid and keep serving until its data path fails. Used when its
	// registration vanished (losing the registry is not losing the donor).
	void set_retired(size_t i, bool retired);
	bool retired(size_t i) const { return sstate_[i].retired.load(); }
	// The donor's slabs are gone (a new boot id): none of its replicas is read again, and
	// repair starts at once. It also gets no new slabs (retired).
	void donor_restarted(size_t i);
	// A donor outside the volume's donor set (Membership, spread=): placement chooses it
	// only when no donor inside the set (alive, not retired, with room) is left, and then
	// calls the need-donor hook. Its replicas serve on. New donors start inside.
	void set_outside(size_t i, bool outside);
	bool outside(size_t i) const { return sstate_[i].outside.load(); }
	// Slabs of this volume on donor i, counting ALLOCs in flight: 0 means none is there.
	uint32_t holds(size_t i) const { return sstate_[i].used.load() + sstate_[i].placing.load(); }
	// Disconnect donor i if the volume holds nothing there (no slab, none being placed, no
	// floor: Server::close_if_idle): from then on it gets no slab and no floor, its session's
	// connections and its data paths are closed (each I/O path with its lock held, waiting
	// for the paths at most the timeout in all; the maintenance thread closes its own), and
	// its index is never used again (a donor wanted again is added anew). True if closed.
	// Control path (Membership's thread): may wait for a control call in progress.
	bool close_idle_server(size_t i);
	bool closed(size_t i) const { return sstate_[i].closed.load(); }
	// The most donors add_server() takes (VolumeOptions::max_servers).
	size_t max_servers() const { return max_servers_; }
	// Called (on whichever thread places a slab: an nbdkit worker or the repair thread,
	// with no lock held) when no donor inside the set could take a replica: `fn(arg)` must
	// only wake someone (Membership::wake), never wait or allocate. Set once before the
	// volume serves, or later: the pair is published atomically; null: none. Once
	// set_need_donor_hook(nullptr) returns, no call of the old hook runs any more (its owner
	// may be destroyed): it waits out a call in progress (a few instructions: a lock and a
	// notify), which calls count in need_donor_calls_ (seq_cst on both sides, so either the
	// call sees null or the setter sees the call).
	struct NeedDonorHook {
		void (*fn)(void *) = nullptr;
		void *arg = nullptr;
	};
	void set_need_donor_hook(const NeedDonorHook *hook)
	{
		need_donor_.store(hook, std::memory_order_seq_cst);
		if (!hook)
			while (need_donor_calls_.load(std::memory_order_seq_cst) != 0)
				std::this_thread::yield();
	}
	// The hook's owner finished a pass over the donors (it may have added or changed some):
	// wakes allocations waiting for a donor with room (grant()).
	void donors_changed();

private:
	using Clock = std::chrono::steady_clock;
	struct Replica {
		uint16_t server = 0;
		uint32_t gen = 0; // the server's generation when this replica was last known good
		SlabGrant grant;
		uint64_t epoch = 0; // its tag's epoch on the server (bound volumes)
	};
	// A slab being copied to a new replica (repair, give-back move): writes that land while
	// the copy runs mark the blocks they touched, and those blocks are copied again.
	struct CloneJob {
		uint64_t block = 0;  // bytes per dirty bit
		uint64_t nblocks = 0;
		unsigned window = 0; // blocks in flight per window
		std::unique_ptr<std::atomic<uint64_t>[]> dirty; // nblocks bits
		void mark(uint64_t off, uint64_t len);
		// Take (and clear) the dirty bit of block b.
		bool take(uint64_t b);
		uint64_t count() const;
	};
	// Locking (docs/architecture.md, "Concurrency model: the volume"):
	// - `mu` (writer-preferring, timed): shared for one chunk's data round trip; exclusive only
	//   for short sections with no network wait that change the replica set (install after
	//   an allocation, detach for a trim, switch after a clone).
	// - `maint`: serialises the slow, networked changes of one slab (allocation, trim, slow
	//   fencing, repair and move copies). Never taken by reads; writes take it only to
	//   allocate an empty slab or to fence a degraded write. Held across control RPCs (not a
	//   copy's ALLOC: grant_copy), never with `mu` held across them. A waiter sets `yield` so
	//   that a long copy gives way.
	// - `epoch_mu`: the epochs (rep[k].epoch, epoch, floored); never held across a wait.
	// rep[]/nrep/lost change only with `maint` and `mu` exclusive both held.
	struct Slab {
		mutable SlabLock mu;
		TimedMutex maint;
		std::atomic<unsigned> yield{0};     // threads waiting for `maint`
		uint8_t nrep = 0;             // 0: never written (reads zeros)
		// nrep 0, but not zeros: lost at a reattach that could not find it (EIO), or held
		// only by the backup (backed(): served from it, repaired onto a donor from it).
		bool lost = false;
		Replica rep[kMaxReplicas];
		std::atomic<CloneJob *> clone{nullptr}; // set while a copy of this slab runs
		mutable std::mutex epoch_mu;
		uint64_t epoch = 1;
		uint64_t floored = 0;
	};
	struct ServerState {
		std::atomic<uint32_t> gen{0};
		std::atomic<int64_t> down_until{0}; // steady_clock ns; no new slabs before this
		std::atomic<uint32_t> used{0};      // slabs this volume holds there
		// ALLOCs chosen for it and not yet answered: placement counts them as load, so
		// threads placing at once do not all pick the donor that looked emptiest.
		std::atomic<uint32_t> placing{0};
		std::atomic<bool> retired{false}; // set_retired(): no new slabs
		std::atomic<bool> outside{false}; // set_outside(): not in the donor set
		std::atomic<bool> closed{false};  // close_idle_server(): disconnected for good
	};
	struct Channel {
		TimedMutex mu;
		unsigned index = 0; // its backup queue and its I/O paths' slot (I/O channels)
		std::byte *buf = nullptr;
		// The maintenance channel's own data paths: one per server, max_servers of them
		// (null until the server is added). I/O channels have none: they share io_paths_.
		std::unique_ptr<std::unique_ptr<DataPath>[]> paths;
		// Requests served and bytes moved (written under `mu`, read by report()).
		SoloCounter reads, writes, read_bytes, write_bytes;
		// Latencies, by whichever thread has this as its usual channel (the request may
		// be served by another, or, for a write, by several): a stripe, so that threads
		// rarely add to the same counters. No lock.
		LatencyHistogram read_latency, write_latency;
	};
	// A data path to one donor shared by the I/O channels (volume_io.cpp, HeldPaths): one
	// thread posts and completes a batch on it at a time, under `mu`.
	struct SharedPath {
		TimedMutex mu;
		std::unique_ptr<DataPath> dp;
	};
	// One donor's shared paths, and the threads waiting for any of them to come free
	// (volume_io.cpp). take() tries every path (starting at `usual`) without blocking,
	// preferring one that is ready() (a free path that is not: only when none is); when
	// all are busy it queues (FIFO, a node on its own stack) until a path is handed to it or
	// `until`. give() unlocks a path and, only if someone waits (`waiters`), locks it again
	// and hands it to the first in the queue, so that threads that keep arriving cannot
	// take the paths again and again while a waiter sleeps (the tail). `m` is taken only by
	// waiters and by a give() that has a waiter: not on an uncontended request.
	struct DonorPaths {
		struct Waiter {
			std::condition_variable cv;
			SharedPath *got = nullptr; // handed over by give(), locked
			Waiter *next = nullptr;
		};
		// `n` of them: npaths_ connections, and over a transport whose paths share a
		// connection (TCP) more paths on them, up to one per channel (open_paths).
		std::unique_ptr<SharedPath[]> path;
		unsigned n = 0;
		std::mutex m;
		Waiter *head = nullptr, *tail = nullptr; // under m
		std::atomic<unsigned> waiters{0};
		// A free path (locked for the caller), or null if none came free by `until`.
		SharedPath *take(unsigned usual, Clock::time_point until);
		void give(SharedPath &p);
	};
	// The shared paths one chunk's round posts to (volume_io.cpp).
	class HeldPaths;
	// A channel held by this thread until destroyed (null if none could be had in time).
	class ChannelRef {
	public:
		ChannelRef() = default;
		explicit ChannelRef(Channel *c) : c_(c) {}
		~ChannelRef() { reset(); }
		ChannelRef(ChannelRef &&o) noexcept : c_(o.c_) { o.c_ = nullptr; }
		ChannelRef &operator=(ChannelRef &&) = delete;
		Channel *operator->() const { return c_; }
		Channel &operator*() const { return *c_; }
		explicit operator bool() const { return c_ != nullptr; }
		void reset()
		{
			if (c_)
				c_->mu.unlock();
			c_ = nullptr;
		}

	private:
		Channel *c_ = nullptr;
	};
	struct Piece {
		uint64_t slab;
		uint64_t off;   // within the slab
		uint32_t len;
		uint32_t pos;   // within the chunk / channel buffer
	};

	// The bound on waiting for a lock or a channel: its holders are inside bounded network
	// waits, at most one per replica tried (a read fails over within one chunk), plus one.
	// A safety net: a slow donor makes them wait about `timeout`, then they fail over.
	// Inside a request (RequestScope), never past the request's own bound on waiting.
	Clock::time_point deadline() const;
	// A request (pread, pwrite, trim, zero) on this thread: every wait of it (channel, locks,
	// paths, and the start of each further chunk, round or allocation) ends by its start +
	// kRequestWaits * timeout, so that the request ends, with data or EIO, within
	// (kRequestWaits + 2) * timeout (docs/architecture.md, "How long each wait can be").
	class RequestScope;
	// The current request's bound (time_point::max() outside a request: maintenance).
	static Clock::time_point request_deadline();
	static bool request_out_of_time() { return Clock::now() >= request_deadline(); }
	// Take `s.maint` by `until`, asking a copy of the slab in progress to give way.
	bool lock_maint(Slab &s, Clock::time_point until);
	// A free data channel: the first one free from this thread's usual one on, else wait for
	// the usual one until the timeout. Null (after a debug log) if none came free in time.
	ChannelRef channel();
	int check_range(uint64_t count, uint64_t offset) const;
	// Length of the chunk starting at `at` with `left` bytes to go.
	uint32_t chunk_len(uint64_t at, uint64_t left) const;
	// Split [offset, offset+len) (len <= buffer_size) into per-slab pieces. Returns count.
	unsigned split(uint64_t offset, uint32_t len, Piece *out) const;
	bool valid(const Replica &r) const;
	unsigned valid_count(const Slab &s) const;
	// backup= holds the slab's current bytes: it may serve it when no replica is valid.
	bool backed(uint64_t slab) const { return backup_ && backup_->trusted(slab); }
	// A copy's source that is the backup file, not a replica (clone(), copy_dirty()).
	static constexpr uint16_t kBackupSource = 0xffff;
	// A replica on `server` missed a write that another replica took, or failed a read that
	// another replica can serve: none of its replicas is read again (they are repaired).
	void invalidate(uint16_t server);
	// `server` failed a call: give it no new slabs (and ask it nothing optional) for a while.
	void mark_down(uint16_t server);
	bool is_down(uint16_t server) const;
	// Choose up to `want` donors for a slab (power of two choices), avoiding `exclude` and
	// donors on cooldown; with `down_too`, donors on cooldown when nothing else has room.
	// Returns how many went to `out`.
	unsigned place(unsigned want, std::span<const uint16_t> exclude, bool down_too,
		       uint16_t *out);
	// Grants for up to `want` new replicas of `slab` (tagged with `epoch`), on donors not in
	// `exclude` (`down_too`: as place()); no lock held (control RPCs). Returns how many went
	// to `out`; `err` is ENOSPC or EIO when it is 0.
	unsigned grant(uint64_t slab, uint64_t epoch, unsigned want, std::span<const uint16_t> exclude,
		       bool down_too, Replica *out, int &err);
	// A fresh grant (tagged epoch 0) for a copy of `slab` on a donor holding none of its
	// replicas and not on cooldown. `maint` (held on entry) is released for the ALLOC (it
	// may wait the timeout on a hung donor, and a degraded write's fence or a trim needs
	// `maint` meanwhile) and taken again. True (`maint` held) if the grant is in `dst` and
	// the slab's replicas (and which of them are valid) are what they were on entry. False
	// if no donor has room, or the slab changed meanwhile (the grant is given back), or
	// `maint` did not come back within the timeout: then the caller leaves the slab alone
	// (`maint` may not be held) until the next pass.
	bool grant_copy(uint64_t slab, std::unique_lock<TimedMutex> &maint, Replica &dst);
	// Give every slab in [first, last] that has no replica its replicas (first writes).
	// Takes each slab's `maint`, no other lock. 0, ENOSPC or EIO.
	int ensure_allocated(uint64_t first, uint64_t last);
	int give_back(uint64_t slab);
	// Return one replica's slab to its server: freed at once if the server is healthy,
	// otherwise forgotten (reclaimed later) so that a hung donor never blocks us.
	// True if the server confirmed it took the slab back (or the session is gone with it).
	// Never called with a slab lock held.
	bool release_replica(const Replica &r);
	// Record `epoch` as the floor of `slab` on every healthy donor not in `skip`. Best
	// effort; a donor that fails is marked down (not asked again meanwhile).
	void record_floor(uint64_t slab, uint64_t epoch, std::span<const uint16_t> skip);
	// Read [at, at+len) into the channel buffer. 0 or EIO.
	int read_chunk(Channel &ch, uint64_t at, uint32_t len);
	// Write the channel buffer's first `len` bytes to [at, at+len). 0, EIO, or EAGAIN when a
	// slab turned out empty (trimmed meanwhile: allocate and write again). Slabs whose write
	// was taken by fewer than `replicas` replicas and that need fencing go to `fence`/`nfence`.
	int write_chunk(Channel &ch, uint64_t at, uint32_t len, uint64_t *fence, unsigned &nfence);
	// Write `count` bytes from `src` (zeros if null) at `offset`: allocating empty slabs
	// first (`allocate`), or skipping them (they read zeros already). 0 or an errno.
	int write_range(const std::byte *src, uint64_t count, uint64_t offset, bool allocate);
	// Take over what the memservers kept for our volume (constructor, bound volumes).
	void recover(unsigned missing);
	// Fencing of a write taken by fewer than `replicas` replicas (bound volumes): the
	// replicas that took it must carry an epoch above every replica that did not, recorded
	// as a floor elsewhere, before the write is acknowledged.
	// fenced(): true if that holds already (slab locked shared by the caller; no wait).
	bool fenced(const Slab &s, uint8_t took) const;
	// The lowest epoch among the replicas in `took` (bit k: rep[k]), and the highest among
	// the others and among all. Caller holds `epoch_mu`.
	struct Epochs {
		uint64_t min_took = UINT64_MAX, max_other = 0, max_all = 0;
		// With no replica in `took` (the backup alone took the write): every replica is
		// below the floor.
		bool fenced(uint64_t floored) const
		{
			if (min_took == UINT64_MAX)
				return max_all < floored;
			return min_took > max_other && floored >= min_took;
		}
	};
	static Epochs epochs(const Slab &s, uint8_t took);
	// fence_slow(): make it hold, with control RPCs, for every replica that is valid now.
	// Those are exactly the replicas that hold the write: one that missed it was invalidated
	// when it failed it (or was invalid already, and stays so), and one added since was
	// copied after the write completed. Caller holds `maint` and no slab lock. 0 or EIO (no
	// valid replica could be marked newest).
	int fence_slow(uint64_t slab);
	// The write path's fence: takes `maint` (bounded), then fence_slow. 0 or EIO.
	int fence_write(uint64_t slab);
	void repair_loop();
	// A volume thread's exception boundary (docs/architecture.md, "Exception boundaries"):
	// runs `loop` until it returns (at stop); an exception it throws is logged once per
	// streak and the loop starts again a moment later, from the volume's state as it is
	// (every lock it took is RAII; a copy it abandoned is started over). Never throws.
	template <typename Loop> void guarded(const char *what, Loop loop) noexcept
	{
		for (bool failing = false; !stop_.load();) {
			try {
				loop();
				return;
			} catch (const std::exception &e) {
				guard_failed(what, e.what(), failing);
			} catch (...) {
				guard_failed(what, "an unknown exception", failing);
			}
			failing = true;
			std::unique_lock lock(repair_mu_);
			repair_cv_.wait_for(lock, repair_interval_, [this] { return stop_.load(); });
		}
	}
	void guard_failed(const char *what, const char *why, bool again) noexcept;
	// Copy slab `slab` from replica `src` to a new replica on `dst` while the slab keeps
	// serving (writes landing meanwhile are copied again), then switch over in a short
	// exclusive section: `replace` (index into rep[] of the replica it replaces) or, if -1, as
	// an added replica. Caller holds `maint`. True if switched.
	// `dst` is a fresh grant (tagged epoch 0); on failure it is given back.
	bool clone(uint64_t slab, Replica src, Replica dst, int replace, Channel &ch,
		   std::atomic<uint64_t> &bytes);
	// Copy the blocks whose dirty bit is set (all of them on the first pass) from `src` to
	// `dst`, pipelined. False on a transfer failure (that donor is marked down) or, with
	// `may_yield`, when another thread waits for the slab's `maint`.
	bool copy_dirty(Slab &s, const Replica &src, const Replica &dst, Channel &ch,
			std::atomic<uint64_t> &bytes, bool may_yield);
	// Give-back: ask every donor which of our slabs it wants back and move them. Returns the
	// number of wanted slabs that could not move.
	uint64_t migrate_wanted(Channel &ch);
	// Move the replica of `slab` held as slab `id` on `server` to another donor (not one
	// holding a copy), then free it. True when moved or nothing is left to move.
	bool migrate(uint64_t slab, uint16_t server, uint32_t id, Channel &ch);
	// Restore the replica count of one slab. Returns true if it changed anything.
	bool repair(uint64_t slab, Channel &ch);

	// max_servers_ slots; the first nservers_ are set (add_server() fills one, then
	// publishes it with a release store).
	std::unique_ptr<std::unique_ptr<Server>[]> servers_;
	std::atomic<size_t> nservers_{0};
	size_t max_servers_ = 0;
	size_t start_holders_ = SIZE_MAX; // VolumeOptions::start_holders (recover())
	std::mutex add_mu_; // add_server() calls, one at a time
	std::unique_ptr<ServerState[]> sstate_;
	const uint64_t size_;
	uint64_t slab_size_ = 0;
	const size_t buffer_size_;
	unsigned replicas_ = 1;
	const std::chrono::milliseconds timeout_;
	const std::chrono::milliseconds repair_interval_;
	const std::chrono::milliseconds down_cooldown_;
	std::unique_ptr<Slab[]> slabs_;
	uint64_t nslabs_ = 0;
	MappedRegion region_; // the channels' buffers (before what points into it)
	std::vector<std::unique_ptr<Channel>> channels_; // I/O channels
	std::unique_ptr<Channel> maint_ch_;              // the maintenance thread's (2 windows)
	// The I/O channels' data paths: max_servers_ slots of DonorPaths (null until the server
	// is added; set before the server is published (nservers_), so whoever got the server's
	// index from a replica or from placement finds them), each on npaths_ connections.
	unsigned npaths_ = 1;
	std::unique_ptr<std::unique_ptr<DonorPaths>[]> io_paths_;
	// Opens npaths_ I/O paths (connections), more paths sharing them where the transport
	// allows (up to one per channel), and the maintenance path to `s` into slot i (setup:
	// allocates, network waits). Throws std::runtime_error.
	void open_paths(size_t i, Server &s);
	CloneJob clone_job_;                             // one copy at a time (maintenance thread)
	std::mutex place_mu_;  // placement (rng, load snapshot): allocation path only
	std::minstd_rand rng_;
	std::unique_ptr<DonorLoad[]> place_loads_; // max_servers_, under place_mu_
	std::atomic<const NeedDonorHook *> need_donor_{nullptr};
	std::atomic<unsigned> need_donor_calls_{0}; // calls of the hook in progress
	void need_donor(); // call the hook, if any
	// An allocation that found no donor with room, with a need-donor hook set, waits once
	// (up to `timeout`) for the hook's owner to finish a pass: `seen` is donors_epoch_ as
	// read before placing. False if the wait ran out.
	bool wait_for_donors(uint64_t seen);
	std::mutex donors_mu_;
	std::condition_variable donors_cv_;
	std::atomic<uint64_t> donors_epoch_{0};
	// Throws std::runtime_error unless `s` can serve this volume (slab size, max_io).
	void check_fits(const Server &s) const;

	bool tagged_ = false; // every server is bound to the volume
	std::atomic<uint64_t> repaired_{0}, repair_bytes_{0}, server_failures_{0};
	std::atomic<uint64_t> epoch_raises_{0}, reattached_{0}, reattach_stale_{0};
	std::atomic<uint64_t> migrated_{0}, migrate_bytes_{0}, migrate_pending_{0}, migrate_ns_{0};
	std::atomic<uint64_t> clone_aborts_{0}, switch_ns_max_{0}, switch_blocks_max_{0};
	// Errors returned to the client (rare: one shared atomic each) and lock timeouts.
	std::array<std::array<std::atomic<uint64_t>, kVolumeErrs>, kVolumeOps> errors_{};
	std::atomic<uint64_t> lock_timeouts_{0};
	// Count `err` (an errno, 0: none) returned by `op`; returns it.
	int count_error(VolumeOp op, int err);
	// The latency stripe of this thread (its usual channel).
	Channel &stripe() const;
	std::mutex repair_mu_;
	std::condition_variable repair_cv_;
	bool repair_kick_ = false;
	std::atomic<bool> stop_{false};
	std::thread repair_thread_;
	// Give-back: a thread of its own asks the donors which slabs they want back (WANTED), so
	// that a hung donor stalls it, never the repair thread; migrate_wanted() takes its lists.
	void poll_loop();
	std::mutex wanted_mu_;
	std::vector<std::vector<uint32_t>> wanted_; // by server (max_servers_), under wanted_mu_
	std::thread poll_thread_;
	// Last: made after recovery, before the threads start; destroyed after they stopped.
	std::unique_ptr<Backup> backup_;
	std::atomic<int64_t> backup_only_logged_{0}; // rate limit of that warning
	// Make backup_ and reconcile it with what recovery found (constructor).
	void open_backup(const VolumeOptions &opts);
};

} // namespace rdmaswap
