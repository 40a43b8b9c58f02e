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

// A batch (its sends in post_*, a reconnect they need, and all replies read in complete()) is
// done within `timeout` of its first post, however slowly the memserver answers, or fails with
// EIO and drops the connection (the stream is out of step); a stop request (request_stop())
// ends it at once. No allocation after construction.
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
	// The batch fails (EIO); `cause` (an errno) is logged, and the connection dropped.
	void fail(int cause);

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
	bool in_batch_ = false;  // a post was made since the last complete()
	Deadline deadline_{};    // the current batch's: its first post + timeout_
	uint64_t next_id_ = 1;
	uint64_t conn_id_ = 0; // the server's id for our connection: a reconnect fences it
	Backoff backoff_;
};

} // namespace rdmaswap
