// SPDX-License-Identifier: MIT
// What the TCP and RDMA data paths share: the checks every post makes, the batch's first-error
// latch, reconnecting with backoff, and the process-wide busy-poll decision.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/transport/transport.h"
#include "common/util/backoff.h"

namespace rdmaswap {

// --- Busy-polling (the plugin's busy-poll=). When on, a data path that waits for its peer
// first spins for kBusyPollSpin (non-blocking recv on TCP, ibv_poll_cq on RDMA) and only then
// sleeps (poll on the socket, or the CQ's completion channel); when off it sleeps at once.
// Spinning trades a core for a wake-up per wait, which pays only where a core is spare.
inline constexpr std::chrono::microseconds kBusyPollSpin{50};
// busy-poll=auto turns it on when the process may run on at least this many CPUs.
inline constexpr unsigned kBusyPollMinCpus = 8;

// Set once at start (before any data path waits); read by every wait. Default off.
void set_busy_poll(bool on);
bool busy_poll();
// The number of CPUs in this process's affinity set (sched_getaffinity), at least 1.
unsigned affinity_cpus();

// The base of TcpDataPath and RdmaDataPath: the DataPath contract's argument checks and
// batch bookkeeping, and reconnecting with backoff (Backoff: 100 ms doubling to 5 s). Used
// by one thread at a time like any DataPath; allocates nothing after construction.
class DataPathBase : public DataPath {
protected:
	// `name` names the connection in logs ("data connection to HOST:PORT"); `log` is the
	// logger's name. `session_lost` is set when a reconnect finds the session gone (and,
	// once set, no reconnect is tried).
	DataPathBase(const char *log, std::string name, std::span<std::byte> region,
		     std::shared_ptr<std::atomic<bool>> session_lost);

	// The checks every post makes, in this order: len in 1..kMaxIo and [off, off+len) inside
	// the slab, [local, local+len) inside the region (EINVAL); the batch already holds
	// kMaxBatch operations (ENOBUFS); a read in a batch of writes or the reverse (EINVAL:
	// over TCP, mixing could fill both directions of the socket at once and deadlock); an
	// error latched earlier in this batch (that error). Returns 0, and then the caller queues
	// the operation as number batch_size() and calls queued(); or the errno, latched.
	int admit(bool read, const SlabGrant &slab, uint64_t off, uint32_t len,
		  const std::byte *local);
	void queued() { n_++; }
	// Operations queued in this batch, and whether they are reads (meaningful when > 0).
	unsigned batch_size() const { return n_; }
	bool batch_reads() const { return read_; }

	// Latch `err` as the batch's error unless one is latched already (the first one wins).
	// Returns `err`.
	int latch(int err)
	{
		if (!error_)
			error_ = err;
		return err;
	}
	int latched() const { return error_; }
	// Ends the batch: returns its latched error (0: none) and starts an empty one.
	int end_batch()
	{
		const int r = error_;
		error_ = 0;
		n_ = 0;
		return r;
	}

	// 0 if connected(). Else EIO without trying when the session is lost, a stop was
	// requested or the backoff says not yet (unless `eager`: RDMA's fence right after a
	// failed write); else reconnect() once: 0 (the backoff is reset, and that is logged), or
	// EIO (ENOENT from reconnect() sets the session lost; the backoff grows).
	int ensure_connected(bool eager = false);
	// The connection failed: disconnect() and grow the backoff. The caller logs why and
	// latches the error.
	void drop();

	// Disconnects; later posts fail with EIO (ensure_connected never reconnects).
	void close_for_good() override
	{
		closed_ = true;
		disconnect();
	}

	// Implemented by the transport.
	virtual bool connected() const = 0;
	// Connect again and rejoin the session. 0; ENOENT when the memserver no longer knows
	// the session; ECANCELED for a stop request; else an errno, after logging why.
	virtual int reconnect() = 0;
	// Close the connection now: nothing may land in the caller's buffers after this.
	virtual void disconnect() = 0;

	const char *const log_;
	const std::string name_;
	const std::span<std::byte> region_;
	const std::shared_ptr<std::atomic<bool>> session_lost_;

private:
	unsigned n_ = 0;
	bool read_ = false;
	int error_ = 0;
	bool closed_ = false; // close_for_good() (by the path's owner: no atomic needed)
	Backoff backoff_;
};

} // namespace rdmaswap
