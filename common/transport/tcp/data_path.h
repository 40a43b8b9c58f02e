// SPDX-License-Identifier: MIT
// DataPath over a TCP connection: READ/WRITE messages that the memserver's CPU serves, several
// in flight, answered in any order; several paths (threads) may share one connection.
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>

#include "common/net/socket.h"
#include "common/transport/data_path_base.h"
#include "common/wire/auth.h"
#include "common/wire/protocol.h"

namespace rdmaswap {

// The data connections of one memserver session (opaque): they fence each other (see
// TcpDataPath, "Fencing"). One per session, shared by every TcpDataPath of it.
struct TcpSession;
std::shared_ptr<TcpSession> make_tcp_session();

// A batch (its sends, a reconnect they need, and all replies read in complete()) is done
// within `timeout` of its first post, however slowly the memserver answers, or fails with EIO
// and drops the connection (the stream is out of step); a stop request (request_stop()) ends
// it within 100 ms (a reader's blocking receive slice, below). No allocation after
// construction.
//
// Sharing: a path made with the sharing constructor uses the connection of the path it was
// made from (up to kMaxSharing paths per connection). Each path keeps its own batch and is
// used by one thread at a time as any DataPath; the paths of one connection are used by
// different threads at once, their requests in flight together. Everything the paths of a
// connection share (the socket, the reply stream, reconnecting) is under the connection's
// mutex, never held across a network wait.
//
// Sends: every post goes out at once (one sendmsg of its header, body and WRITE payload),
// whole, under the connection's send lock (taken by the batch's deadline). Not gathered
// until complete(): Volume completes its paths one after another, so a request held back on
// one memserver's path would wait for another memserver's answers first.
//
// Replies: each request has its own request id (naming its path); replies may come in any
// order and are matched by id. Whichever thread of the connection waits in complete() first
// receives for all of them (the reader), until its own batch is done; then it wakes another
// waiting thread to read on. Replies are received into a staging buffer (kStaging bytes) with
// as few recvmsg calls as the peer's pace allows; payload bytes found there are copied out;
// the rest of a payload is received straight into the buffer of the path it belongs to. A
// path is woken when its batch is done. A reply for an id not in flight, a second reply for
// one, a reply with the wrong op or length, or bytes when nothing is in flight are a protocol
// error: the connection is dropped and every batch in flight on it fails with EIO, and that is
// logged. A reply with an error status fails its batch with that errno but keeps the stream
// in step (the connection stays).
//
// Failures: a batch not done by its deadline, a failed send or receive, a protocol error or a
// stop request drop the connection for all its paths (the stream is out of step), and every
// batch in flight on it fails with EIO. No thread returns from complete() while the reader may
// still write into its buffers. The next post on any of its paths reconnects (with that
// path's backoff), fencing the old connection.
//
// Fencing (docs/architecture.md, "A failed write's outcome"): shutting a socket down does not
// take back what it sent. A connection that failed with a WRITE unanswered is *unfenced*: the
// memserver may still apply that WRITE (its bytes are in a socket buffer, or held on the way)
// until it fenced the connection, which a reconnect does (HELLO names the connection it
// replaces; the memserver applies nothing more from it once it answers). So:
// - complete() of a write batch that failed so returns only after the connection was fenced
//   (reconnected at once, ignoring the backoff once per failure, by the batch's deadline
//   plus one more `timeout`), or after that attempt failed;
// - while any connection of the session (TcpSession: every connection of one memserver
//   session, the maintenance thread's too) is unfenced, a post_write on any of them first
//   fences it (within its batch's deadline) and fails with EIO if that fails.
// Hence a write that failed with EIO can land only before its complete() returned, never after
// a newer write to the memserver was sent. A failed batch of writes takes at most 2 * timeout.
//
// Waiting for replies: the reader blocks in recvmsg at once after the send (the answer cannot
// be there yet; one system call per wake-up, not poll + recvmsg: the socket's SO_RCVTIMEO
// slices the wait into 100 ms pieces, checked against the deadline and a stop request, and the
// last piece is a poll), or with busy_poll() spins with non-blocking recvmsg for kBusyPollSpin
// first.
class TcpDataPath final : public DataPathBase {
public:
	// Connects and joins the session at once (throws std::runtime_error if that fails).
	// `session_lost` is set when a reconnect finds the session gone.
	// `key`: the cluster key (null: an --insecure memserver); every (re)connect authenticates.
	// `session`: the session's other data connections (null: a session of its own).
	TcpDataPath(const SockAddr &addr, std::shared_ptr<const AuthKey> key, uint64_t session_id,
		    uint64_t token,
		    std::chrono::milliseconds timeout, std::span<std::byte> region,
		    std::shared_ptr<std::atomic<bool>> session_lost,
		    std::shared_ptr<TcpSession> session = nullptr);
	// A path on the connection of `with` (same memserver, session, timeout and region).
	// Setup only. Throws std::runtime_error when `with`'s connection has kMaxSharing paths.
	explicit TcpDataPath(TcpDataPath &with);
	~TcpDataPath() override;

	int post_read(const SlabGrant &slab, uint64_t off, uint32_t len, std::byte *local) override;
	int post_write(const SlabGrant &slab, uint64_t off, uint32_t len,
		       const std::byte *local) override;
	int complete() override;
	// Ends the connection for good, for all its paths.
	void close_for_good() override;
	// The connection is up, or its reconnect backoff has passed.
	bool ready() const override;

	// Size of the reply staging buffer (one per connection).
	static constexpr size_t kStaging = 64 * 1024;
	// Most paths on one connection. With Volume's at most kMaxPieces (8) requests per batch,
	// 4 paths keep a connection within the 32 replies a memserver queues per connection
	// before it stops reading it (memserver/conn.h, kTxSlots): so a thread sending never
	// waits for replies that nobody reads.
	static constexpr unsigned kMaxSharing = 4;

	struct Link;

private:
	friend struct TcpSession;
	static constexpr size_t kMsgSize = proto::kHeaderSize + proto::kIoRequestSize;
	static_assert(2 * kMaxBatch <= IOV_MAX);

	struct Pending {
		uint64_t id = 0;
		std::byte *local = nullptr;
		uint32_t len = 0;
		bool read = false;
		bool answered = false; // its reply's header was seen
	};

	bool connected() const override;
	int reconnect() override;
	void disconnect() override;

	int post(bool read, const SlabGrant &slab, uint64_t off, uint32_t len,
		 const std::byte *local);
	// With the link's mutex held (`lock`), being the reader: receive until this batch is done
	// or the connection fails.
	void read_for_all(std::unique_lock<std::mutex> &lock);
	// The reader, under the link's mutex: consumes the complete replies (and a payload's
	// start) in the staging buffer, for whichever path they belong to. False after a
	// protocol error (logged).
	bool parse();
	// Forget the batch's wire state.
	void reset_batch();
	// Before a write goes out: fence every unfenced connection of the session (by the
	// batch's deadline). 0 or EIO.
	int fence_session();

	const std::shared_ptr<Link> link_;
	unsigned slot_ = 0; // this path's index on the link (in every request id)

	bool in_batch_ = false; // a post was made since the last complete()
	Deadline deadline_{};   // the current batch's: its first post + the timeout

	// The batch, under the link's mutex once a request of it is registered.
	std::array<Pending, kMaxBatch> pending_{};
	uint64_t gen_ = 0;       // the link's generation the batch's requests went out on
	unsigned nsent_ = 0;     // requests registered (and sent, or the link failed)
	unsigned nanswered_ = 0; // replies received whole
	int reply_err_ = 0;      // the first error status a reply of the batch had
	bool waiting_ = false;   // in complete(), not the reader
	std::condition_variable cv_; // its batch is done, its link failed, or it may read now
	// Headers and fixed bodies of the batch's requests.
	std::array<std::byte, kMaxBatch * kMsgSize> msgs_{};
};

} // namespace rdmaswap
