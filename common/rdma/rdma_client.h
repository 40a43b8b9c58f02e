// SPDX-License-Identifier: MIT
// The client's RDMA side: one device context and protection domain per process, the channel
// buffers registered once as one MR, and a DataPath per (channel, server) with its own RC QP
// and CQ doing one-sided RDMA READ/WRITE.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "common/auth.h"
#include "common/config.h"
#include "common/transport.h"

namespace rdmaswap::rdma {

// Number of RDMA devices libibverbs lists (0 on error).
int device_count();
inline bool devices_present() { return device_count() > 0; }

// Whether an RDMA device on this host can reach `ep` (rdma_resolve_addr + route succeed within
// `timeout`). On false, `why` says what failed.
bool can_reach(const Endpoint &ep, std::chrono::milliseconds timeout, std::string &why);

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
	// first call registers `region` (later calls must pass the same one).
	// Throws std::runtime_error on failure.
	std::unique_ptr<DataPath> open_data_path(const Endpoint &ep, uint64_t session_id,
						 uint64_t token, const Mac &attach_key,
						 std::chrono::milliseconds timeout,
						 std::span<std::byte> region,
						 std::shared_ptr<std::atomic<bool>> session_lost);

	struct Impl;

private:
	std::unique_ptr<Impl> impl_;
};

} // namespace rdmaswap::rdma
