// SPDX-License-Identifier: MIT
// TCP data path: several READ/WRITE requests in flight, sent with few sendmsg calls, replies
// matched by request id and received through a staging buffer; a batch is bounded by one
// deadline from its first post.
#include "common/tcp/tcp_data_path.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/log.h"
#include "common/tcp/rpc.h"

namespace rdmaswap {

TcpDataPath::TcpDataPath(const SockAddr &addr, std::shared_ptr<const AuthKey> key,
			 uint64_t session_id, uint64_t token, std::chrono::milliseconds timeout,
			 std::span<std::byte> region, std::shared_ptr<std::atomic<bool>> session_lost)
	: DataPathBase("tcp", "data connection to " + addr.str(), region, std::move(session_lost)),
	  addr_(addr), key_(std::move(key)), session_id_(session_id), token_(token),
	  timeout_(timeout), staging_(std::make_unique<std::byte[]>(kStaging))
{
	int err = 0;
	fd_ = join_session(addr_, deadline_after(timeout_), key_.get(), session_id_, token_, false,
			   0, conn_id_, err);
	if (!fd_)
		throw std::runtime_error("tcp data connection to " + addr_.str() + ": " +
					 connect_error_text(err));
}

int TcpDataPath::reconnect()
{
	// Fence the old connection: a write it still had in flight must not land after ours. The
	// handshake counts against the batch's deadline.
	int err = 0;
	fd_ = join_session(addr_, deadline_, key_.get(), session_id_, token_, false, conn_id_,
			   conn_id_, err);
	if (fd_)
		return 0;
	if (err != ENOENT && err != ECANCELED)
		logger("tcp")->warn("{}: reconnect failed: {}", name_, connect_error_text(err));
	return err ? err : EIO;
}

void TcpDataPath::fail(int cause)
{
	latch(EIO);
	if (fd_) {
		// Shutting down (a stop request) is no failure of the memserver: say so quietly.
		if (cause == ECANCELED)
			logger("tcp")->debug("{} closed: stopping", name_);
		else
			logger("tcp")->warn("{} failed: {}", name_,
					    cause == ETIMEDOUT ? "no complete answer within the timeout"
							       : std::strerror(cause));
		drop();
	}
}

void TcpDataPath::reset_batch()
{
	in_batch_ = false;
	nsent_ = nanswered_ = 0;
	beg_ = end_ = 0;
	dst_ = nullptr;
	rest_ = 0;
}

int TcpDataPath::post(bool read, const SlabGrant &slab, uint64_t off, uint32_t len,
		      const std::byte *local)
{
	if (int r = admit(read, slab, off, len, local))
		return r;
	if (!in_batch_) {
		// The batch's clock starts at its first post: its sends and all its replies, and a
		// reconnect if one is needed, are done by then or the batch fails.
		in_batch_ = true;
		deadline_ = deadline_after(timeout_);
	}
	if (int r = ensure_connected()) {
		fail(r);
		return EIO;
	}
	const unsigned i = batch_size();
	std::byte *msg = msgs_.data() + i * kMsgSize;
	proto::Header h;
	h.op = read ? proto::Op::Read : proto::Op::Write;
	h.body_len = uint32_t(proto::kIoRequestSize + (read ? 0 : len));
	h.request_id = next_id_++;
	proto::encode_header(h, std::span<std::byte, proto::kHeaderSize>(msg, proto::kHeaderSize));
	proto::encode(proto::IoRequest{slab.id, len, off},
		      std::span<std::byte>(msg + proto::kHeaderSize, proto::kIoRequestSize));
	if (i == 0)
		first_id_ = h.request_id;
	pending_[i] = Pending{const_cast<std::byte *>(local), len, false};
	queued();
	// Out at once (see the header): a request never waits for complete().
	iovec iov[2] = {{msg, kMsgSize}, {const_cast<std::byte *>(local), len}};
	if (int r = sendv_all_until(fd_.get(), iov, read ? 1 : 2, deadline_)) {
		fail(r);
		return EIO;
	}
	nsent_ = i + 1;
	return 0;
}

int TcpDataPath::post_read(const SlabGrant &slab, uint64_t off, uint32_t len, std::byte *local)
{
	return post(true, slab, off, len, local);
}

int TcpDataPath::post_write(const SlabGrant &slab, uint64_t off, uint32_t len,
			    const std::byte *local)
{
	return post(false, slab, off, len, local);
}

bool TcpDataPath::parse()
{
	const char *why = nullptr;
	const bool reads = batch_reads();
	while (rest_ == 0 && end_ - beg_ >= proto::kHeaderSize) {
		proto::Header h;
		const auto st = proto::decode_header(
			std::span<const std::byte, proto::kHeaderSize>(staging_.get() + beg_,
								       proto::kHeaderSize),
			h);
		if (!st.ok) {
			why = st.error;
			break;
		}
		const uint64_t i = h.request_id - first_id_; // wraps for ids below the batch's
		if (!h.is_response() || h.request_id < first_id_ || i >= nsent_) {
			why = "a reply for a request not in flight";
			break;
		}
		Pending &p = pending_[i];
		if (p.answered) {
			why = "a second reply for one request";
			break;
		}
		if (h.op != (reads ? proto::Op::Read : proto::Op::Write)) {
			why = "a reply of the wrong op";
			break;
		}
		beg_ += proto::kHeaderSize;
		p.answered = true;
		if (h.status) {
			// Refused by the server (decode_header checked it is an errno with no
			// body): the batch fails with it, the stream stays in step.
			latch(int(h.status));
			nanswered_++;
			continue;
		}
		if (h.body_len != (reads ? p.len : 0)) {
			why = "a reply of the wrong length";
			break;
		}
		const size_t have = std::min(end_ - beg_, size_t(h.body_len));
		if (have)
			std::memcpy(p.local, staging_.get() + beg_, have);
		beg_ += have;
		if (have == h.body_len) {
			nanswered_++;
		} else {
			dst_ = p.local + have; // the rest goes straight into the caller's buffer
			rest_ = h.body_len - have;
		}
	}
	if (beg_ == end_)
		beg_ = end_ = 0;
	if (why) {
		logger("tcp")->error("{}: malformed response: {}", name_, why);
		return false;
	}
	return true;
}

void TcpDataPath::receive_replies()
{
	bool first = true;
	const auto spin = busy_poll() ? std::chrono::nanoseconds(kBusyPollSpin)
				      : std::chrono::nanoseconds(0);
	while (nanswered_ < nsent_) {
		if (!parse()) {
			fail(EPROTO);
			return;
		}
		if (nanswered_ == nsent_)
			break;
		iovec iov[2];
		int n = 0;
		if (rest_) {
			iov[n++] = {dst_, rest_}; // the staging buffer is empty meanwhile
		} else if (beg_) {
			// A reply's start at the end of the buffer: move it to the front.
			std::memmove(staging_.get(), staging_.get() + beg_, end_ - beg_);
			end_ -= beg_;
			beg_ = 0;
		}
		iov[n++] = {staging_.get() + end_, kStaging - end_};
		size_t got = 0;
		// Right after the send the answer cannot be there yet: wait before the first try.
		if (int r = recv_some_until(fd_.get(), iov, n, deadline_, first, spin, got)) {
			fail(r);
			return;
		}
		first = false;
		if (rest_) {
			const size_t k = std::min(got, rest_);
			dst_ += k;
			rest_ -= k;
			got -= k;
			if (rest_ == 0)
				nanswered_++;
		}
		end_ += got;
	}
	if (end_ != beg_) {
		logger("tcp")->error("{}: malformed response: bytes after the batch's last reply",
				     name_);
		fail(EPROTO);
	}
}

int TcpDataPath::complete()
{
	if (fd_ && nanswered_ < nsent_)
		receive_replies();
	reset_batch();
	return end_batch();
}

} // namespace rdmaswap
