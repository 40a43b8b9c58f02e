// SPDX-License-Identifier: MIT
// TCP data path: several READ/WRITE requests in flight, from one or several paths (threads)
// sharing a connection; replies matched by request id and received by whichever waiting
// thread reads for all; a batch is bounded by one deadline from its first post.
#include "common/transport/tcp/data_path.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "common/obs/log.h"
#include "common/transport/control_client.h"
#include "common/util/backoff.h"
#include "common/util/err_text.h"

namespace rdmaswap {

namespace {
// Request ids: (sequence number << 8) | the path's slot on its connection.
constexpr unsigned kSlotBits = 8;
static_assert(TcpDataPath::kMaxSharing <= (1u << kSlotBits));

// The reader waits for replies in blocking recvmsg calls of at most this long each
// (recv_some_until's `slice`: one system call, not poll + recvmsg, per wake-up); a stop request
// ends a wait within one slice. 0 on a connection whose SO_RCVTIMEO could not be set: poll.
constexpr std::chrono::milliseconds kRecvSlice{100};

std::chrono::milliseconds recv_slice(const Fd &fd)
{
	return set_recv_slice(fd.get(), kRecvSlice) == 0 ? kRecvSlice : std::chrono::milliseconds{0};
}
} // namespace

// Every data connection of one memserver session, so that a write can fence the others first
// (TcpDataPath, "Fencing"). `links` grows only at setup (a path made on a new connection);
// `unfenced` counts the connections that failed with a WRITE unanswered and were not
// reconnected since (changed under the connection's own mutex).
struct TcpSession {
	std::mutex mu;
	std::vector<std::weak_ptr<TcpDataPath::Link>> links; // under mu
	std::atomic<unsigned> unfenced{0};
};

std::shared_ptr<TcpSession> make_tcp_session()
{
	return std::make_shared<TcpSession>();
}

// What the paths of one connection share. Everything here is under `mu`; `fd` is used outside
// it only by the one sender (`sending`) and the one reader (`reading`), and replaced only when
// there is neither (reconnect). `dst` is written outside it by the reader only.
struct TcpDataPath::Link {
	Link(const SockAddr &a, std::shared_ptr<const AuthKey> k, uint64_t sid, uint64_t tok,
	     std::chrono::milliseconds t, std::shared_ptr<TcpSession> s)
		: addr(a), key(std::move(k)), session_id(sid), token(tok), timeout(t),
		  session(std::move(s)), staging(std::make_unique<std::byte[]>(kStaging))
	{
	}

	const SockAddr addr;
	const std::shared_ptr<const AuthKey> key;
	const uint64_t session_id;
	const uint64_t token;
	const std::chrono::milliseconds timeout;
	const std::shared_ptr<TcpSession> session;

	std::mutex mu;
	Fd fd;
	bool up = false;         // fd is connected and its stream in step
	bool closed = false;     // close_for_good(): never again
	bool connecting = false; // a path reconnects (outside mu)
	// When a post may use it (steady_clock ns): 0 while up, the backoff's end while down,
	// never once closed. Written under mu, read by ready() without it.
	std::atomic<int64_t> usable_at{0};
	uint64_t gen = 1;        // changed by every failure and every reconnect
	uint64_t conn_id = 0;    // the server's id for the connection: a reconnect fences it
	std::chrono::milliseconds slice{0}; // fd's SO_RCVTIMEO (kRecvSlice), 0: not set
	Backoff backoff;
	bool sending = false;  // a path sends on fd (outside mu)
	bool reading = false;  // a path receives on fd (outside mu) ...
	uint64_t read_gen = 0; // ... on this generation
	// sending, reading or connecting went false.
	std::condition_variable idle;
	std::array<TcpDataPath *, kMaxSharing> paths{};
	uint64_t seq = 0;         // the last request's sequence number
	unsigned outstanding = 0; // requests of this generation registered and not answered
	unsigned writes_out = 0;  // ... of them WRITEs
	// Failed with a WRITE unanswered, not reconnected since: counted in session->unfenced.
	bool unfenced = false;
	uint64_t fence_tried = 0; // the failed generation complete() last tried to fence at once

	// Reply staging: bytes [beg, end) are received and not yet consumed. While a payload is
	// partly received (rest > 0: `rest` bytes due at `dst`, in the buffer of a request of
	// `rest_path`), the staging buffer is empty.
	std::unique_ptr<std::byte[]> staging;
	size_t beg = 0, end = 0;
	std::byte *dst = nullptr;
	size_t rest = 0;
	TcpDataPath *rest_path = nullptr;

	// The connection fails: every batch on it fails (EIO), the socket is shut down (which
	// ends a reader's or sender's wait; it is closed when replaced), and `cause` is logged.
	// With a WRITE unanswered it is unfenced until a reconnect.
	void fail(const std::string &name, int cause)
	{
		if (!up)
			return;
		if (cause == ECANCELED) // a stop request is no failure of the memserver
			logger("tcp")->debug("{} closed: stopping", name);
		else
			logger("tcp")->warn("{} failed: {}{}", name,
					    cause == ETIMEDOUT ? "no complete answer within the timeout"
							       : err_text(cause),
					    writes_out ? " (with writes in flight: fencing it)" : "");
		up = false;
		gen++;
		backoff.failed(Backoff::clock::now());
		usable_at.store(closed ? INT64_MAX : ns(backoff.next()), std::memory_order_relaxed);
		::shutdown(fd.get(), SHUT_RDWR);
		if (writes_out && !unfenced && !closed) {
			unfenced = true;
			session->unfenced.fetch_add(1);
		}
		outstanding = 0;
		writes_out = 0;
		beg = end = 0;
		dst = nullptr;
		rest = 0;
		rest_path = nullptr;
		for (TcpDataPath *p : paths)
			if (p)
				p->cv_.notify_one();
		idle.notify_all();
	}

	static int64_t ns(Backoff::clock::time_point t)
	{
		return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch())
			.count();
	}

	// The reader (under mu) received one of `p`'s replies whole; wakes `p` when that ends its
	// batch (the reader's own batch needs no waking).
	void answered(TcpDataPath *p, TcpDataPath *reader, bool write)
	{
		p->nanswered_++;
		outstanding--;
		writes_out -= write;
		if (p != reader && p->nanswered_ == p->nsent_)
			p->cv_.notify_one();
	}

	// Connect again and rejoin the session by `until`, fencing the connection this one
	// replaces (the memserver applies nothing more from it). Another path at it meanwhile:
	// its outcome serves. `eager`: ignore the backoff (a write batch's fence right after the
	// failure). 0, or ETIMEDOUT, ECANCELED (closed for good), EAGAIN (backoff), or the
	// handshake's errno (ENOENT: the session is gone), logged by the caller.
	int reconnect(Clock::time_point until, bool eager)
	{
		std::unique_lock lock(mu);
		if (!idle.wait_until(lock, until, [&] { return !connecting; }))
			return ETIMEDOUT;
		if (up)
			return 0;
		if (closed)
			return ECANCELED;
		if (!eager && !backoff.may_try(Backoff::clock::now()))
			return EAGAIN; // another path's attempt failed a moment ago
		// The old socket is shut down: whoever still sends or reads on it stops at once.
		if (!idle.wait_until(lock, until, [&] { return !sending && !reading; }))
			return ETIMEDOUT;
		connecting = true;
		const uint64_t replaces = conn_id;
		lock.unlock();
		int err = 0;
		uint64_t id = 0;
		Fd nfd = join_session(addr, until, key.get(), session_id, token, false, replaces, id,
				      err);
		lock.lock();
		connecting = false;
		if (nfd) {
			slice = recv_slice(nfd);
			fd = std::move(nfd);
			conn_id = id;
			up = true;
			gen++;
			backoff.succeeded();
			usable_at.store(0, std::memory_order_relaxed);
			if (unfenced) {
				unfenced = false;
				session->unfenced.fetch_sub(1);
			}
		} else {
			backoff.failed(Backoff::clock::now());
			usable_at.store(ns(backoff.next()), std::memory_order_relaxed);
		}
		idle.notify_all();
		return up ? 0 : (err ? err : EIO);
	}
};

TcpDataPath::TcpDataPath(const SockAddr &addr, std::shared_ptr<const AuthKey> key,
			 uint64_t session_id, uint64_t token, std::chrono::milliseconds timeout,
			 std::span<std::byte> region, std::shared_ptr<std::atomic<bool>> session_lost,
			 std::shared_ptr<TcpSession> session)
	: DataPathBase("tcp", "data connection to " + addr.str(), region, std::move(session_lost)),
	  link_(std::make_shared<Link>(addr, std::move(key), session_id, token, timeout,
				       session ? std::move(session) : make_tcp_session()))
{
	Link &l = *link_;
	int err = 0;
	l.fd = join_session(l.addr, deadline_after(timeout), l.key.get(), session_id, token, false,
			    0, l.conn_id, err);
	if (!l.fd)
		throw std::runtime_error("tcp data connection to " + addr.str() + ": " +
					 connect_error_text(err));
	l.slice = recv_slice(l.fd);
	l.up = true;
	l.paths[0] = this;
	TcpSession &s = *l.session;
	std::lock_guard lock(s.mu);
	std::erase_if(s.links, [](const std::weak_ptr<Link> &w) { return w.expired(); });
	s.links.push_back(link_);
}

TcpDataPath::TcpDataPath(TcpDataPath &with)
	: DataPathBase("tcp", with.name_, with.region_, with.session_lost_), link_(with.link_)
{
	std::lock_guard lock(link_->mu);
	unsigned s = 0;
	while (s < kMaxSharing && link_->paths[s])
		s++;
	if (s == kMaxSharing)
		throw std::runtime_error(name_ + ": already shared by " +
					 std::to_string(kMaxSharing) + " paths");
	slot_ = s;
	link_->paths[s] = this;
}

TcpDataPath::~TcpDataPath()
{
	std::lock_guard lock(link_->mu);
	link_->paths[slot_] = nullptr;
}

bool TcpDataPath::connected() const
{
	std::lock_guard lock(link_->mu);
	return link_->up;
}

int TcpDataPath::reconnect()
{
	const int err = link_->reconnect(deadline_, false);
	if (err && err != ENOENT && err != ECANCELED && err != EAGAIN)
		logger("tcp")->warn("{}: reconnect failed: {}", name_, connect_error_text(err));
	return err;
}

int TcpDataPath::fence_session()
{
	TcpSession &s = *link_->session;
	for (size_t i = 0; s.unfenced.load(); i++) {
		std::shared_ptr<Link> k;
		{
			std::lock_guard lock(s.mu);
			if (i >= s.links.size())
				break;
			k = s.links[i].lock();
		}
		if (!k)
			continue;
		bool unfenced;
		{
			std::lock_guard lock(k->mu);
			unfenced = k->unfenced;
		}
		if (!unfenced)
			continue;
		if (int err = k->reconnect(deadline_, false)) {
			logger("tcp")->debug("{}: a write waits for another connection of the session "
					     "to be fenced, which failed: {}",
					     name_, connect_error_text(err));
			return EIO;
		}
	}
	return 0;
}

void TcpDataPath::disconnect()
{
	// A failure ends the connection for all its paths (Link::fail), and nothing lands in a
	// path's buffers once its complete() returned: nothing to do for this path alone.
}

bool TcpDataPath::ready() const
{
	return link_->usable_at.load(std::memory_order_relaxed) <=
	       Link::ns(Backoff::clock::now());
}

void TcpDataPath::close_for_good()
{
	DataPathBase::close_for_good();
	std::lock_guard lock(link_->mu);
	link_->closed = true;
	link_->fail(name_, ECANCELED);
	link_->usable_at.store(INT64_MAX, std::memory_order_relaxed);
}

void TcpDataPath::reset_batch()
{
	in_batch_ = false;
	nsent_ = nanswered_ = 0;
	reply_err_ = 0;
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
		deadline_ = deadline_after(link_->timeout);
	}
	if (ensure_connected())
		return latch(EIO);
	// No write goes out while another connection of the session may still apply an older one.
	if (!read && link_->session->unfenced.load() && fence_session())
		return latch(EIO);
	Link &l = *link_;
	const unsigned i = batch_size();
	std::byte *msg = msgs_.data() + i * kMsgSize;
	std::unique_lock lock(l.mu);
	// One sender at a time: a message goes out whole.
	if (!l.idle.wait_until(lock, deadline_, [&] { return !l.sending && !l.connecting; }))
		return latch(EIO); // the sender in the way fails the connection at its deadline
	if (!l.up || (nsent_ && gen_ != l.gen))
		return latch(EIO); // the connection failed under this batch
	gen_ = l.gen;
	proto::Header h;
	h.op = read ? proto::Op::Read : proto::Op::Write;
	h.body_len = uint32_t(proto::kIoRequestSize + (read ? 0 : len));
	h.request_id = (++l.seq << kSlotBits) | slot_;
	proto::encode_header(h, std::span<std::byte, proto::kHeaderSize>(msg, proto::kHeaderSize));
	proto::encode(proto::IoRequest{slab.id, len, off},
		      std::span<std::byte>(msg + proto::kHeaderSize, proto::kIoRequestSize));
	pending_[i] = Pending{h.request_id, const_cast<std::byte *>(local), len, read, false};
	nsent_ = i + 1;
	l.outstanding++;
	l.writes_out += !read;
	queued();
	l.sending = true;
	const int fd = l.fd.get();
	lock.unlock();
	// Out at once (see the header): a request never waits for complete().
	iovec iov[2] = {{msg, kMsgSize}, {const_cast<std::byte *>(local), len}};
	const int r = sendv_all_until(fd, iov, read ? 1 : 2, deadline_);
	lock.lock();
	l.sending = false;
	l.idle.notify_all();
	if (r) {
		if (gen_ == l.gen)
			l.fail(name_, r);
		return latch(EIO);
	}
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
	Link &l = *link_;
	std::byte *const st = l.staging.get();
	const char *why = nullptr;
	while (l.rest == 0 && l.end - l.beg >= proto::kHeaderSize) {
		proto::Header h;
		const auto s = proto::decode_header(
			std::span<const std::byte, proto::kHeaderSize>(st + l.beg, proto::kHeaderSize),
			h);
		if (!s.ok) {
			why = s.error;
			break;
		}
		const uint64_t slot = h.request_id & ((1u << kSlotBits) - 1);
		TcpDataPath *p = slot < kMaxSharing ? l.paths[slot] : nullptr;
		unsigned i = kMaxBatch;
		if (h.is_response() && p && p->gen_ == l.gen)
			for (unsigned k = 0; k < p->nsent_ && i == kMaxBatch; k++)
				if (p->pending_[k].id == h.request_id)
					i = k;
		if (i == kMaxBatch) {
			why = "a reply for a request not in flight";
			break;
		}
		Pending &q = p->pending_[i];
		if (q.answered) {
			why = "a second reply for one request";
			break;
		}
		if (h.op != (q.read ? proto::Op::Read : proto::Op::Write)) {
			why = "a reply of the wrong op";
			break;
		}
		l.beg += proto::kHeaderSize;
		q.answered = true;
		if (h.status) {
			// Refused by the server (decode_header checked it is an errno with no
			// body): that batch fails with it, the stream stays in step.
			if (!p->reply_err_)
				p->reply_err_ = int(h.status);
			l.answered(p, this, !q.read);
			continue;
		}
		if (h.body_len != (q.read ? q.len : 0)) {
			why = "a reply of the wrong length";
			break;
		}
		const size_t have = std::min(l.end - l.beg, size_t(h.body_len));
		if (have)
			std::memcpy(q.local, st + l.beg, have);
		l.beg += have;
		if (have == h.body_len) {
			l.answered(p, this, !q.read);
		} else {
			l.dst = q.local + have; // the rest goes straight into that path's buffer
			l.rest = h.body_len - have;
			l.rest_path = p;
		}
	}
	if (l.beg == l.end)
		l.beg = l.end = 0;
	if (!why && l.rest == 0 && l.end > l.beg && l.outstanding == 0)
		why = "bytes after the last reply";
	if (why) {
		logger("tcp")->error("{}: malformed response: {}", name_, why);
		return false;
	}
	return true;
}

void TcpDataPath::read_for_all(std::unique_lock<std::mutex> &lock)
{
	Link &l = *link_;
	const uint64_t g = l.gen;
	l.reading = true;
	l.read_gen = g;
	std::byte *const st = l.staging.get();
	bool first = true;
	const auto spin = busy_poll() ? std::chrono::nanoseconds(kBusyPollSpin)
				      : std::chrono::nanoseconds(0);
	for (;;) {
		if (!parse()) {
			l.fail(name_, EPROTO);
			break;
		}
		if (nanswered_ == nsent_)
			break;
		iovec iov[2];
		int n = 0;
		if (l.rest) {
			iov[n++] = {l.dst, l.rest}; // the staging buffer is empty meanwhile
		} else if (l.beg) {
			// A reply's start at the end of the buffer: move it to the front.
			std::memmove(st, st + l.beg, l.end - l.beg);
			l.end -= l.beg;
			l.beg = 0;
		}
		iov[n++] = {st + l.end, kStaging - l.end};
		const int fd = l.fd.get();
		const auto slice = l.slice;
		// Right after a send the answer cannot be there yet: wait before the first try.
		const bool wait_first = first && l.end == 0 && l.rest == 0;
		first = false;
		lock.unlock();
		size_t got = 0;
		const int r = recv_some_until(fd, iov, n, deadline_, wait_first, spin, got, slice);
		lock.lock();
		if (l.gen != g)
			break; // failed meanwhile (a path's deadline, a send): what came is void
		if (r) {
			l.fail(name_, r);
			break;
		}
		if (l.rest) {
			const size_t k = std::min(got, l.rest);
			l.dst += k;
			l.rest -= k;
			got -= k;
			if (l.rest == 0) {
				TcpDataPath *p = l.rest_path;
				l.rest_path = nullptr;
				l.dst = nullptr;
				l.answered(p, this, false); // (only a READ's reply has a payload)
			}
		}
		l.end += got;
	}
	l.reading = false;
	l.idle.notify_all();
	if (l.gen != g)
		return; // fail() woke every path
	// Hand the reading on to a path that waits for its replies.
	for (TcpDataPath *p : l.paths)
		if (p && p != this && p->waiting_ && p->gen_ == g && p->nanswered_ < p->nsent_) {
			p->cv_.notify_one();
			break;
		}
}

int TcpDataPath::complete()
{
	if (nsent_) {
		Link &l = *link_;
		std::unique_lock lock(l.mu);
		for (;;) {
			if (gen_ != l.gen) {
				// The connection failed under the batch. Its reader may still be
				// receiving into our buffers: not before it stopped.
				l.idle.wait(lock, [&] { return !l.reading || l.read_gen != gen_; });
				latch(EIO);
				// Our writes may still land until the memserver fenced the connection:
				// not before it did (or could not be asked to), see the header.
				if (!batch_reads() && l.unfenced && l.fence_tried != l.gen) {
					l.fence_tried = l.gen;
					lock.unlock();
					// (by the batch's deadline + one timeout: the fences of a
					// chunk's donors, done one after another, all end by then)
					if (int err = l.reconnect(deadline_ + l.timeout, true))
						logger("tcp")->warn("{}: could not fence it after the failure "
								    "({}): no write goes to this memserver "
								    "until it is",
								    name_, connect_error_text(err));
					lock.lock();
				}
				break;
			}
			if (nanswered_ == nsent_)
				break;
			if (!l.reading) {
				read_for_all(lock);
				continue;
			}
			waiting_ = true;
			const auto st = cv_.wait_until(lock, deadline_);
			waiting_ = false;
			if (st == std::cv_status::timeout && gen_ == l.gen && nanswered_ < nsent_ &&
			    Clock::now() >= deadline_)
				l.fail(name_, ETIMEDOUT);
		}
		if (reply_err_)
			latch(reply_err_);
		reset_batch();
	} else {
		in_batch_ = false; // (nothing registered: nothing the reader looks at changes)
	}
	return end_batch();
}

} // namespace rdmaswap
