// SPDX-License-Identifier: MIT
// TCP data path: pipelined READ/WRITE requests, responses read in order in complete(); a
// batch is bounded by one deadline from its first post.
#include "common/tcp/tcp_data_path.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/log.h"
#include "common/tcp/rpc.h"

namespace rdmaswap {

TcpDataPath::TcpDataPath(const SockAddr &addr, std::shared_ptr<const AuthKey> key,
			 uint64_t session_id, uint64_t token, std::chrono::milliseconds timeout,
			 std::span<std::byte> region, std::shared_ptr<std::atomic<bool>> session_lost)
	: addr_(addr), key_(std::move(key)), session_id_(session_id), token_(token), timeout_(timeout), region_(region),
	  session_lost_(std::move(session_lost))
{
	int err = 0;
	fd_ = join_session(addr_, deadline_after(timeout_), key_.get(), session_id_, token_, false,
			   0, conn_id_, err);
	if (!fd_)
		throw std::runtime_error("tcp data connection to " + addr_.str() + ": " +
					 connect_error_text(err));
}

void TcpDataPath::fail(int cause)
{
	if (!error_)
		error_ = EIO;
	if (fd_) {
		// Shutting down (a stop request) is no failure of the memserver: say so quietly.
		if (cause == ECANCELED)
			logger("tcp")->debug("data connection to {} closed: stopping", addr_.str());
		else
			logger("tcp")->warn("data connection to {} failed: {}", addr_.str(),
					    cause == ETIMEDOUT ? "no complete answer within the timeout"
							       : std::strerror(cause));
		fd_.reset();
		backoff_.failed(Backoff::clock::now());
	}
}

int TcpDataPath::ensure_connected()
{
	if (fd_)
		return 0;
	if (session_lost_->load())
		return EIO;
	const auto now = Backoff::clock::now();
	if (!backoff_.may_try(now))
		return EIO;
	// Fence the old connection: a write it still had in flight must not land after ours. The
	// handshake counts against the batch's deadline.
	int err = 0;
	fd_ = join_session(addr_, deadline_, key_.get(), session_id_, token_, false, conn_id_,
			   conn_id_, err);
	if (fd_) {
		logger("tcp")->warn("data connection to {} re-established", addr_.str());
		backoff_.succeeded();
		return 0;
	}
	if (err == ENOENT) {
		logger("tcp")->error("memserver {} no longer knows our session: its slabs are lost",
				     addr_.str());
		session_lost_->store(true);
	} else if (err != ECANCELED) {
		logger("tcp")->warn("data connection to {}: reconnect failed: {}", addr_.str(),
				    connect_error_text(err));
	}
	backoff_.failed(now);
	return EIO;
}

int TcpDataPath::check(const SlabGrant &slab, uint64_t off, uint32_t len,
		       const std::byte *local) const
{
	if (len == 0 || len > proto::kMaxIo || off > slab.length || slab.length - off < len)
		return EINVAL;
	if (local < region_.data() || local + len > region_.data() + region_.size())
		return EINVAL;
	if (npending_ == kMaxBatch)
		return ENOBUFS;
	return 0;
}

int TcpDataPath::send_request(bool read, const SlabGrant &slab, uint64_t off, uint32_t len,
			      const std::byte *local)
{
	if (int r = check(slab, off, len, local)) {
		if (!error_)
			error_ = r;
		return r;
	}
	// A batch is all reads or all writes (see DataPath); mixing could fill both socket
	// directions at once and deadlock, so refuse it.
	if (npending_ && pending_[0].read != read) {
		if (!error_)
			error_ = EINVAL;
		return EINVAL;
	}
	if (error_)
		return error_;
	if (!in_batch_) {
		// The batch's clock starts at its first post: its sends and all its replies, and a
		// reconnect if one is needed, are done by then or the batch fails.
		in_batch_ = true;
		deadline_ = deadline_after(timeout_);
	}
	if (int r = ensure_connected()) {
		fail(r);
		return r;
	}
	std::array<std::byte, proto::kHeaderSize + proto::kIoRequestSize> msg;
	proto::Header h;
	h.op = read ? proto::Op::Read : proto::Op::Write;
	h.body_len = uint32_t(proto::kIoRequestSize + (read ? 0 : len));
	h.request_id = next_id_++;
	proto::encode_header(h, std::span(msg).first<proto::kHeaderSize>());
	proto::encode(proto::IoRequest{slab.id, len, off}, std::span(msg).subspan(proto::kHeaderSize));
	iovec iov[2] = {{msg.data(), msg.size()}, {const_cast<std::byte *>(local), len}};
	if (int r = sendv_all_until(fd_.get(), iov, read ? 1 : 2, deadline_)) {
		fail(r);
		return EIO;
	}
	pending_[npending_++] = Pending{read, len, const_cast<std::byte *>(local), h.request_id};
	return 0;
}

int TcpDataPath::post_read(const SlabGrant &slab, uint64_t off, uint32_t len, std::byte *local)
{
	return send_request(true, slab, off, len, local);
}

int TcpDataPath::post_write(const SlabGrant &slab, uint64_t off, uint32_t len,
			    const std::byte *local)
{
	return send_request(false, slab, off, len, local);
}

int TcpDataPath::complete()
{
	for (unsigned i = 0; i < npending_ && fd_; i++) {
		const Pending &p = pending_[i];
		std::array<std::byte, proto::kHeaderSize> hdr;
		if (int r = recv_all_until(fd_.get(), hdr.data(), hdr.size(), deadline_)) {
			fail(r);
			break;
		}
		proto::Header h;
		const auto st = proto::decode_header(hdr, h);
		if (!st.ok || !h.is_response() || h.request_id != p.id ||
		    h.op != (p.read ? proto::Op::Read : proto::Op::Write)) {
			logger("tcp")->error("malformed response from {}: {}", addr_.str(),
					     st.ok ? "out of order" : st.error);
			fail(EPROTO);
			break;
		}
		if (h.status) {
			if (!error_)
				error_ = int(h.status);
			continue;
		}
		if (h.body_len != (p.read ? p.len : 0)) {
			logger("tcp")->error("response from {} has the wrong length", addr_.str());
			fail(EPROTO);
			break;
		}
		if (p.read) {
			if (int r = recv_all_until(fd_.get(), p.local, p.len, deadline_)) {
				fail(r);
				break;
			}
		}
	}
	const int r = error_;
	npending_ = 0;
	error_ = 0;
	in_batch_ = false;
	return r;
}

} // namespace rdmaswap
