// SPDX-License-Identifier: MIT
// The client's RDMA side: one device context and protection domain per process, the channel
// buffers registered once as one MR, and a DataPath per (channel, server) with its own RC QP
// and CQ doing one-sided RDMA READ/WRITE.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/transport/transport.h"
#include "common/util/config.h"
#include "common/util/result.h"
#include "common/wire/auth.h"

namespace rdmaswap::rdma {

// Whether an RDMA device on this host can reach `ep` (rdma_resolve_addr + route succeed within
// `timeout`); if not, the failure says what failed.
Result<Ok> can_reach(const Endpoint &ep, std::chrono::milliseconds timeout);

// The data QPs of one memserver session (every RdmaDataPath of it: the channels' and the repair
// thread's), which fence each other (docs/architecture.md, "A failed write's outcome"). A QP
// whose batch with a WRITE failed after it was posted is *unfenced*: the memserver's side of it
// may still execute that WRITE's packets (delayed on the way) until the memserver moved it to
// the error state, which a connect naming it in ConnectData::replaces does. This list holds the
// memserver's numbers of those QPs until a connect naming them was accepted. Thread-safe: a
// mutex for the list (never held across a network wait), an atomic count for the data path's
// check. Each path adds at most one entry between two connects of its own (it names its own
// old QP first), so room for one per path, reserved when the path is made, is enough: nothing
// allocates after setup.
class RdmaSession {
public:
	// A path joins: room for its entry (setup; allocates).
	void add_path();
	// The memserver's QP `qpn` may still execute a failed write. If there were no room (which
	// add_path rules out), every later write of the session fails instead (poisoned()).
	void unfenced(uint32_t qpn);
	// How many QPs are unfenced (a write batch fences first while this is not 0).
	unsigned unfenced_count() const { return count_.load(); }
	// An entry was lost for want of room: no write of the session may go out again.
	bool poisoned() const { return poisoned_.load(); }
	// The QPs a connect should name, into `out`: `first` if it is still unfenced, then others,
	// at most out.size(). Returns how many.
	unsigned to_name(uint32_t first, std::span<uint32_t> out) const;
	// A connect naming `qpns` was accepted: they are fenced.
	void fenced(std::span<const uint32_t> qpns);

private:
	mutable std::mutex mu_;
	std::vector<uint32_t> list_; // under mu_; capacity reserved by add_path()
	size_t room_ = 0;            // under mu_: paths joined
	std::atomic<unsigned> count_{0};
	std::atomic<bool> poisoned_{false};
};

std::shared_ptr<RdmaSession> make_rdma_session();

class ClientContext {
public:
	// Opens the device that routes to `probe` (address resolution) and allocates the PD.
	// Throws std::runtime_error naming the failed step.
	ClientContext(const Endpoint &probe, std::chrono::milliseconds timeout);
	~ClientContext();
	ClientContext(const ClientContext &) = delete;
	ClientContext &operator=(const ClientContext &) = delete;

	// Connect an RC QP to the memserver at `ep`, joining session (id, token) via the CM
	// private data, which also carries a MAC under the session's attach key (auth.h). The
	// first call registers `region` (later calls must pass the same one). `session`: the
	// session's other data paths, which this one fences and is fenced by (null: a session of
	// its own). Throws std::runtime_error on failure.
	//
	// The path's batches (complete()) end within `timeout` of complete()'s start, a reconnect
	// (on a post, with backoff) within `timeout` too. Fencing (RdmaSession): when a batch with
	// a WRITE fails after it was posted, its QP is unfenced; complete() reconnects at once
	// (ignoring the backoff, within one more `timeout`) naming it, and returns EIO only after
	// that, whether it worked or not; while any QP of the session is unfenced, a batch with a
	// WRITE on any path of it first reconnects that path naming them (its own QP has nothing
	// in flight then) and fails with EIO, posting nothing, if that fails. Reads go on. So a
	// write that failed with EIO can land only before its complete() returned, never after a
	// newer write to the memserver was posted. A failed batch of writes takes at most
	// 2 * timeout.
	std::unique_ptr<DataPath> open_data_path(const Endpoint &ep, uint64_t session_id,
						 uint64_t token, const Mac &attach_key,
						 std::chrono::milliseconds timeout,
						 std::span<std::byte> region,
						 std::shared_ptr<std::atomic<bool>> session_lost,
						 std::shared_ptr<RdmaSession> session = nullptr);

	struct Impl;

private:
	std::unique_ptr<Impl> impl_;
};

// The number of the memserver's QP behind `path` (an RDMA data path), for tests: 0 if it is
// another kind of path, not connected, or the memserver did not say (version 2).
uint32_t remote_qp_num(const DataPath &path);

} // namespace rdmaswap::rdma
