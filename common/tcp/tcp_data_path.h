// SPDX-License-Identifier: MIT
// DataPath over a TCP connection: READ/WRITE messages that the memserver's CPU serves, several
// in flight, answered in any order.
#pragma once

#include <sys/uio.h>

#include <array>
#include <climits>
#include <atomic>
#include <chrono>
#include <memory>
#include <span>

#include "common/auth.h"
#include "common/data_path_base.h"
#include "common/protocol.h"
#include "common/tcp/socket.h"

namespace rdmaswap {

// A batch (its sends, a reconnect they need, and all replies read in complete()) is done
// within `timeout` of its first post, however slowly the memserver answers, or fails with EIO
// and drops the connection (the stream is out of step); a stop request (request_stop()) ends
// it at once. No allocation after construction.
//
// Sends: every post goes out at once (one sendmsg of its header, body and WRITE payload). Not
// gathered until complete(): Volume completes its paths one after another, so a request held
// back on one memserver's path would wait for another memserver's answers first (a hung
// replica's whole timeout, which then leaves it no time of its own: test-reattach-stale).
//
// Replies: each request has its own request id; replies may come in any order and are matched
// by id. They are received into a staging buffer (kStaging bytes) with as few recvmsg calls as
// the peer's pace allows: one typically brings the header and payload of one or several
// replies. Payload bytes found in the staging buffer are copied out; the rest of a payload is
// received straight into the caller's buffer (with the staging buffer as a second iovec for
// what follows it). A reply for an id not in flight, a second reply for one, a reply with the
// wrong op or length, or bytes after the batch's last reply are a protocol error: the batch
// fails with EIO, the connection is dropped, and that is logged. A reply with an error status
// fails the batch with that errno but keeps the stream in step (the connection stays).
//
// Waiting for replies: poll at once after the send (the answer cannot be there yet), or with
// busy_poll() spin with non-blocking recvmsg for kBusyPollSpin first.
class TcpDataPath final : public DataPathBase {
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

	// Size of the reply staging buffer.
	static constexpr size_t kStaging = 64 * 1024;

private:
	static constexpr size_t kMsgSize = proto::kHeaderSize + proto::kIoRequestSize;
	static_assert(2 * kMaxBatch <= IOV_MAX);

	struct Pending {
		std::byte *local = nullptr;
		uint32_t len = 0;
		bool answered = false; // its reply's header was seen
	};

	bool connected() const override { return bool(fd_); }
	int reconnect() override;
	void disconnect() override { fd_.reset(); }

	int post(bool read, const SlabGrant &slab, uint64_t off, uint32_t len,
		 const std::byte *local);
	// Reads the replies of the nsent_ requests on the wire; on a failure, fail()s.
	void receive_replies();
	// Consumes the complete replies (and a payload's start) in the staging buffer. False
	// after a protocol error (logged).
	bool parse();
	// The batch fails (EIO); `cause` (an errno) is logged, and the connection dropped.
	void fail(int cause);
	// Forget the batch's wire state (sent, staged and partial replies).
	void reset_batch();

	const SockAddr addr_;
	const std::shared_ptr<const AuthKey> key_;
	const uint64_t session_id_;
	const uint64_t token_;
	const std::chrono::milliseconds timeout_;

	Fd fd_;
	uint64_t next_id_ = 1;
	uint64_t conn_id_ = 0; // the server's id for our connection: a reconnect fences it
	bool in_batch_ = false; // a post was made since the last complete()
	Deadline deadline_{};   // the current batch's: its first post + timeout_

	// The batch: request i has id first_id_ + i.
	std::array<Pending, kMaxBatch> pending_{};
	uint64_t first_id_ = 0;
	unsigned nsent_ = 0;     // requests on the wire (the first nsent_ of the batch)
	unsigned nanswered_ = 0; // replies received whole
	// Headers and fixed bodies of the batch's requests.
	std::array<std::byte, kMaxBatch * kMsgSize> msgs_{};

	// Reply staging: bytes [beg_, end_) are received and not yet consumed. While a payload
	// is partly received (rest_ > 0: `rest_` bytes still due at `dst_`), the staging buffer
	// is empty.
	std::unique_ptr<std::byte[]> staging_;
	size_t beg_ = 0, end_ = 0;
	std::byte *dst_ = nullptr;
	size_t rest_ = 0;
};

} // namespace rdmaswap
