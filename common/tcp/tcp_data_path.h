// SPDX-License-Identifier: MIT
// DataPath over a TCP connection: READ/WRITE messages that the memserver's CPU serves.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <span>

#include "common/auth.h"
#include "common/backoff.h"
#include "common/tcp/socket.h"
#include "common/transport.h"

namespace rdmaswap {

class TcpDataPath final : public DataPath {
public:
	// Connects and joins the session at once (throws std::runtime_error if that fails).
	// `session_lost` is set when a reconnect finds the session gone.
	// `key`: the cluster key (null: an --insecure memserver); every (re)connect authenticates.
	TcpDataPath(const SockAddr &addr, std::shared_ptr<const AuthKey> key, uint64_t session_id,
		    uint64_t token,
		    std::chrono::milliseconds timeout, std::span<std::byte> region,
		    std::shared_ptr<std::atomic<bool>> session_lost);

	int post_read(const SlabGrant &slab, uint64_t off, uint32_t len, std::byte *local) override;
	int post_write(const SlabGrant &slab, uint64_t off, uint32_t len,
		       const std::byte *local) override;
	int complete() override;

private:
	struct Pending {
		bool read = false;
		uint32_t len = 0;
		std::byte *local = nullptr;
		uint64_t id = 0;
	};
	int check(const SlabGrant &slab, uint64_t off, uint32_t len, const std::byte *local) const;
	int ensure_connected();
	int send_request(bool read, const SlabGrant &slab, uint64_t off, uint32_t len,
			 const std::byte *local);
	void fail(int err);

	const SockAddr addr_;
	const std::shared_ptr<const AuthKey> key_;
	const uint64_t session_id_;
	const uint64_t token_;
	const std::chrono::milliseconds timeout_;
	const std::span<std::byte> region_;
	std::shared_ptr<std::atomic<bool>> session_lost_;

	Fd fd_;
	std::array<Pending, kMaxBatch> pending_{};
	unsigned npending_ = 0;
	int error_ = 0; // first error of the current batch
	uint64_t next_id_ = 1;
	uint64_t conn_id_ = 0; // the server's id for our connection: a reconnect fences it
	Backoff backoff_;
};

} // namespace rdmaswap
