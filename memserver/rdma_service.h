// SPDX-License-Identifier: MIT
// The memserver's RDMA side: a librdmacm listener that accepts data QPs into client sessions,
// one protection domain per session, and an MR per granted slab in that PD. After setup the
// memserver's CPU does nothing per page: clients READ and WRITE the slabs one-sidedly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace rdmaswap {

class Memserver;
class SessionTable;
class SlabPool;
class WorkerPool;

class RdmaService {
public:
	// Binds and listens on listen:port with librdmacm and starts the event thread, which
	// hands connect requests to `workers` (they must outlive stop_events()). With
	// `check_attach`, a connect must carry the MAC under its session's attach key (auth.h).
	// Throws std::runtime_error naming the failed step.
	RdmaService(const std::string &listen, uint16_t port, SlabPool &pool,
		    SessionTable &sessions, Memserver &owner, WorkerPool &workers,
		    bool check_attach);
	// stop_events(), then every QP is disconnected and every MR and PD dropped.
	~RdmaService();
	// End the event thread: no more connect requests go to the workers. Idempotent.
	void stop_events();
	RdmaService(const RdmaService &) = delete;
	RdmaService &operator=(const RdmaService &) = delete;

	// Register slab `id` (already granted to `session`) in the session's PD. 0, EAGAIN if the
	// session has no QP yet (so no PD), or an errno from ibv_reg_mr.
	int expose_slab(uint64_t session, uint32_t id, uint64_t &addr, uint32_t &rkey);
	// Deregister it: afterwards no QP can reach it. Call before the slab is zeroed and freed.
	void unexpose_slab(uint64_t session, uint32_t id);
	// Drop every MR and the PD of a session that has no connection left.
	void end_session(uint64_t session);
	uint32_t qps() const;

	// True if libibverbs sees at least one RDMA device.
	static bool devices_present();

private:
	struct Impl;
	std::unique_ptr<Impl> impl_;
};

} // namespace rdmaswap
