// SPDX-License-Identifier: MIT
// The client's view of a memserver: a control path (session, slab grants) and one-sided data
// paths that move bytes between a registered local buffer and a granted remote slab. TCP and
// RDMA implement it (common/transport/tcp, common/transport/rdma); tests implement it in memory.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/wire/protocol.h"

namespace rdmaswap {

// What a memserver granted: a slab of `length` bytes, addressed by id (TCP) or by
// (addr, rkey) (RDMA, valid only on QPs of the session the grant was made in).
struct SlabGrant {
	uint32_t id = 0;
	uint64_t length = 0;
	uint64_t addr = 0;
	uint32_t rkey = 0;
};

// Largest number of operations posted to one DataPath before complete().
inline constexpr unsigned kMaxBatch = 16;

// What a data path did, for accounting (status `rdma_*=` lines, docs/performance.md "RDMA path
// accounting"). Counts since the path was made; a transport that does not count leaves zeros.
struct DataPathCounters {
	uint64_t posts = 0;       // operations handed to the transport (RDMA: work requests)
	uint64_t doorbells = 0;   // calls that handed them over (RDMA: ibv_post_send)
	uint64_t polls = 0;       // completion polls (RDMA: ibv_poll_cq)
	uint64_t polls_empty = 0; // ... of them that found nothing
	uint64_t completions = 0; // completions reaped (RDMA: work completions)
	uint64_t arms = 0;        // completion notifications requested (RDMA: ibv_req_notify_cq)
	uint64_t sleeps = 0;      // waits for a completion in the kernel (RDMA: completion channel)
	uint64_t batches = 0;     // complete() calls

	DataPathCounters &operator+=(const DataPathCounters &o)
	{
		posts += o.posts;
		doorbells += o.doorbells;
		polls += o.polls;
		polls_empty += o.polls_empty;
		completions += o.completions;
		arms += o.arms;
		sleeps += o.sleeps;
		batches += o.batches;
		return *this;
	}
};

// One data connection to one memserver, or (TCP) one thread's share of one
// (Server::share_data_path). Not thread-safe: exactly one thread uses it at a time (the
// volume's channels share a donor's paths, each under a lock held from a batch's first post to
// its complete()); paths that share a connection are used by different threads at once.
// After setup it never allocates memory.
//
// Usage: post up to kMaxBatch reads or writes, then complete() waits for all of them.
// `local` must lie inside the region given to Server::open_data_path. A batch is either all
// reads or all writes. Posted operations are not done until complete() returns 0.
class DataPath {
public:
	virtual ~DataPath() = default;
	DataPath() = default;
	DataPath(const DataPath &) = delete;
	DataPath &operator=(const DataPath &) = delete;

	// Queue a read of remote [off, off+len) of `slab` into `local`. 0 or an errno (EINVAL for a
	// range outside the slab or len > kMaxIo, ENOBUFS when the batch is full, EIO when the
	// connection is down and could not be re-established).
	virtual int post_read(const SlabGrant &slab, uint64_t off, uint32_t len, std::byte *local) = 0;
	// Queue a write of `local` into remote [off, off+len) of `slab`. Same errors.
	virtual int post_write(const SlabGrant &slab, uint64_t off, uint32_t len,
			       const std::byte *local) = 0;
	// Wait (bounded by the timeout the path was made with) for every posted operation.
	// 0 when all succeeded; else the errno of the first failure (EIO for a lost connection or a
	// failed completion, ETIMEDOUT mapped to EIO, EACCES/EINVAL if the server refused), and the
	// batch is discarded. A failed connection is re-established on a later post, with backoff.
	virtual int complete() = 0;
	// Whether a post now could go out: connected, or a reconnect may be tried now (not in a
	// backoff after a failure, not closed). A hint, callable from any thread while another
	// uses the path: Volume prefers a ready path of a donor to a free one that is not, so
	// that one failed connection does not fail requests the donor's others could serve.
	virtual bool ready() const { return true; }
	// What this path did so far. Unlike the rest, callable from any thread while another uses
	// the path (the values may be a moment old). Not for the data path: the status report.
	virtual DataPathCounters counters() const { return {}; }
	// End the connection for good: later posts fail with EIO and nothing reconnects. Only
	// while no thread uses the path (the caller holds the path's lock, and nothing of the
	// volume is on its server: Volume::close_idle_server).
	virtual void close_for_good() {}
};

// Facts a memserver reported in its HELLO reply.
struct ServerInfo {
	uint64_t slab_size = 0;
	uint32_t slabs_total = 0;
	uint32_t slabs_free = 0;
	uint32_t max_io = 0;
	bool rdma = false;
};

// A memserver as the client sees it: one session, shared by all of this process's data paths.
// alloc_slab/free_slab/stats are thread-safe (serialised on the control connection).
class Server {
public:
	virtual ~Server() = default;
	Server() = default;
	Server(const Server &) = delete;
	Server &operator=(const Server &) = delete;

	virtual const ServerInfo &info() const = 0;
	// Free slabs on the server as last reported (placement uses it); racy by nature.
	virtual uint32_t slabs_free() const { return info().slabs_free; }
	virtual const std::string &name() const = 0;
	// Grant a fresh, zeroed slab to this session. 0, ENOSPC when the server has none, EIO.
	virtual int alloc_slab(SlabGrant &out) = 0;
	// Give a slab back (the server zeroes it before anyone else gets it). 0 or errno.
	virtual int free_slab(uint32_t id) = 0;
	// Give a slab back without waiting on the server (it may be hung): the grant is dropped
	// here and the slab is returned at the next successful exchange with the server (or when
	// the session ends). Never blocks.
	virtual void forget_slab(uint32_t id) { (void)id; }
	// Background upkeep (called from the volume's repair thread, never from I/O): settle
	// anything left uncertain, e.g. give back slabs forgotten by forget_slab. May block up to
	// the timeout.
	virtual void housekeeping() {}
	// The slabs of this session the server wants back (give-back), into `ids` (control path,
	// from the repair thread; may block up to the timeout). 0 or errno.
	virtual int wanted_slabs(std::vector<uint32_t> &ids)
	{
		ids.clear();
		return 0;
	}
	// Refresh the free-slab count that slabs_free() reports, if it is older than a few
	// seconds (the server's own rate; others fill and empty it too). Same thread and bounds
	// as wanted_slabs. 0 (also when it was fresh enough) or errno.
	virtual int refresh_hint() { return 0; }
	virtual int stats(proto::StatsReply &out) = 0;
	// Make a data path whose posts may use local buffers inside `region`. Setup only (may
	// allocate, may block up to the connect timeout). Throws std::runtime_error on failure.
	virtual std::unique_ptr<DataPath> open_data_path(std::span<std::byte> region) = 0;
	// Paths sharing one connection, each with its own batch, in flight at once from different
	// threads (TCP; not RDMA): how many one connection may carry (1: the transport does not
	// share), and a new path on the connection of `with` (a path this server opened; its
	// region). Null when the transport does not share or the connection carries that many.
	// Setup only.
	virtual unsigned path_sharing() const { return 1; }
	virtual std::unique_ptr<DataPath> share_data_path(DataPath &with)
	{
		(void)with;
		return nullptr;
	}
	// False once the server lost this session (it restarted or dropped us): its slabs are gone.
	virtual bool session_alive() const = 0;

	// --- Reattach (volume=, lease=; docs/replication.md "Restart"). The defaults describe a
	// server whose session is not bound to a volume: nothing survives it.
	// True if the session is bound to a volume (tags and epochs matter).
	virtual bool bound() const { return false; }
	// True if binding took over a detached session of the volume (its slabs are ours now).
	virtual bool reattached() const { return false; }
	// alloc_slab, with the slab tagged (chunk, epoch) in the same exchange.
	virtual int alloc_tagged(uint64_t chunk, uint64_t epoch, SlabGrant &out)
	{
		(void)chunk, (void)epoch;
		return alloc_slab(out);
	}
	// Set the tag of slab `id` we hold. 0 or errno.
	virtual int set_tag(uint32_t id, uint64_t chunk, uint64_t epoch)
	{
		(void)id, (void)chunk, (void)epoch;
		return EOPNOTSUPP;
	}
	// Record on this server that some replica of `chunk` reached `epoch` (0: remove). 0 or errno.
	virtual int set_floor(uint64_t chunk, uint64_t epoch)
	{
		(void)chunk, (void)epoch;
		return EOPNOTSUPP;
	}
	// What this server kept of our volume: every slab the session holds, with its tag and
	// (RDMA) its addr/rkey for our QPs, and the floors. Call after the data paths are open.
	// The slabs listed count as granted from then on. 0 or errno.
	virtual int list_volume(std::vector<proto::VolumeEntry> &slabs,
				std::vector<proto::VolumeEntry> &floors)
	{
		slabs.clear();
		floors.clear();
		return 0;
	}

	// --- Idle donors (Membership, idle-disconnect=). Close the session's connections if it
	// holds nothing of ours: no slab (none granted, none of unknown outcome, none kept from
	// an earlier run and not listed yet) and no floor (none recorded, none kept). True:
	// closed for good (later calls fail with ENOTCONN, session_alive() and the data paths'
	// posts fail; the server keeps the empty session for the volume's lease); false: it holds
	// something or may, and nothing changed. The data paths are closed by their owners
	// (Volume::close_idle_server). Control path: may wait for a control call in progress.
	virtual bool close_if_idle() { return false; }
};

} // namespace rdmaswap
