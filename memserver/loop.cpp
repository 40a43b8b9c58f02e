// SPDX-License-Identifier: MIT
// Memserver event loops: each serves its TCP connections as state machines over preallocated
// buffers with edge-triggered epoll; READ, WRITE and the cheap control ops are applied here,
// the blocking ones on the worker pool. Nothing here allocates per request.
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "common/obs/log.h"
#include "common/util/err_text.h"
#include "common/util/swap_safety.h"
#include "memserver/conn.h"
#include "memserver/unchecked.h"

namespace rdmaswap {

namespace {
// Deadlines are checked this often; the loop sleeps no longer.
constexpr auto kTick = std::chrono::milliseconds(100);
// Events taken from epoll per wake-up.
constexpr int kEvents = 64;
// Replies gathered into one sendmsg (3 pieces each at most).
constexpr int kMaxIov = 64;
// A WRITE payload this large (or what is left of it) is received straight into the slab
// rather than through the receive buffer.
constexpr uint32_t kDirect = 8 * 1024;
// Rounds of (read requests, send replies) for one connection before the others get a turn.
constexpr unsigned kPasses = 8;

long long ms(std::chrono::milliseconds t)
{
	return static_cast<long long>(t.count());
}

// A header with our magic and another protocol version: a client of another rdmaswap release.
bool peer_of_other_version(std::span<const std::byte> h)
{
	const uint32_t magic = uint32_t(h[0]) | uint32_t(h[1]) << 8 | uint32_t(h[2]) << 16 |
			       uint32_t(h[3]) << 24;
	return magic == proto::kMagic && uint8_t(h[4]) != proto::kVersion;
}
} // namespace

Memserver::Loop::Loop(Memserver &m, unsigned index)
	: m_(m), index_(index), io_(m.loop_counters_[index])
{
	ep_.reset(epoll_create1(EPOLL_CLOEXEC));
	ev_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
	if (!ep_ || !ev_)
		throw std::runtime_error(std::string("cannot create an event loop: ") +
					 err_text(errno));
	epoll_event e{};
	e.events = EPOLLIN;
	e.data.ptr = nullptr;
	if (epoll_ctl(ep_.get(), EPOLL_CTL_ADD, ev_.get(), &e) < 0)
		throw std::runtime_error(std::string("epoll_ctl: ") + err_text(errno));
	conns_.reserve(64);
	std::snprintf(name_, sizeof name_, "event loop %u", index_);
	thread_ = std::thread([this] {
		prefault_stack();
		char name[16];
		snprintf(name, sizeof name, "rdmaswap-loop%u", index_);
		pthread_setname_np(pthread_self(), name);
		// The thread's exception boundary: its connections cannot be served any more, so
		// the memserver stops (a clean shutdown, exit status 1). The loop first runs once
		// more, stopping: it closes its connections as at any stop.
		unsigned failures = 0;
		guarded_thread("memserver", name_, Memserver::kStops, [this] { run(); },
			       [this, &failures](const char *) {
				       m_.thread_failed(name_);
				       return ++failures == 1 ? AfterFailure::Again : AfterFailure::End;
			       });
	});
}

Memserver::Loop::~Loop()
{
	join();
}

void Memserver::Loop::join()
{
	if (!thread_.joinable())
		return;
	{
		std::lock_guard lock(mu_);
		const uint64_t one = 1;
		[[maybe_unused]] auto n = ::write(ev_.get(), &one, sizeof one);
	}
	thread_.join();
}

void Memserver::Loop::adopt(std::shared_ptr<Conn> c)
{
	c->loop = this;
	load_.fetch_add(1, std::memory_order_relaxed);
	std::lock_guard lock(mu_); // with the write: the loop cannot end before it
	adopted_.push_back(std::move(c));
	const uint64_t one = 1;
	[[maybe_unused]] auto n = ::write(ev_.get(), &one, sizeof one);
}

void Memserver::Loop::wake(std::shared_ptr<Conn> c)
{
	std::lock_guard lock(mu_); // with the write: the loop cannot end before it
	woken_.push_back(std::move(c));
	const uint64_t one = 1;
	[[maybe_unused]] auto n = ::write(ev_.get(), &one, sizeof one);
}

void Memserver::Loop::take_handovers()
{
	if (m_.test_throw_loop_.load(std::memory_order_relaxed) && m_.test_throw_loop_.exchange(false))
		throw std::runtime_error("test fault (RDMASWAP_TEST_THROW=loop)");
	uint64_t v;
	[[maybe_unused]] auto n = ::read(ev_.get(), &v, sizeof v);
	{
		std::lock_guard lock(mu_);
		handover_.swap(adopted_);
	}
	for (auto &cp : handover_) {
		Conn &c = *cp;
		c.rx = std::make_unique<std::byte[]>(Conn::kRxBuf);
		c.authed = m_.opts_.insecure;
		c.admin = m_.opts_.insecure;
		c.index = conns_.size();
		epoll_event e{};
		e.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
		e.data.ptr = &c;
		conns_.push_back(cp);
		if (epoll_ctl(ep_.get(), EPOLL_CTL_ADD, c.fd.get(), &e) < 0) {
			logger("memserver")->warn("{}: cannot watch the connection: {}", c.peer,
						  err_text(errno));
			finish(c);
			continue;
		}
		logger("memserver")->debug("connection from {} (loop {})", c.peer, index_);
		serve(c); // a request may be waiting already
	}
	handover_.clear();
	{
		std::lock_guard lock(mu_);
		handover_.swap(woken_);
	}
	for (auto &cp : handover_) {
		Conn &c = *cp;
		if (c.done.load() || (c.fd.get() < 0 && !c.cut))
			continue; // closed meanwhile
		if (c.parked) {
			if (!c.ctl_done.load(std::memory_order_acquire))
				continue; // a fence's hand-over: the worker's own comes later
			unpark(c);
		}
		if (c.cut) { // finished while parked: its socket is closed already
			finish(c);
			continue;
		}
		if (c.fenced.load()) { // replaced by a reconnect: apply nothing more
			logger("memserver")->debug("{}: closing a fenced connection", c.peer);
			finish(c, true);
			continue;
		}
		serve(c);
	}
	handover_.clear();
}

void Memserver::Loop::run()
{
	epoll_event ev[kEvents];
	auto next_tick = Clock::now() + kTick;
	// No deadline runs (check_deadlines) and no event came since: sleep until the next one.
	bool quiet = false;
	for (;;) {
		if (m_.stop_.load()) {
			// Close every connection; a parked one (its socket closed, its replies'
			// slab accesses ended) leaves the list once its worker hands it back.
			for (size_t i = conns_.size(); i-- > 0;)
				finish(*conns_[i]);
			if (conns_.empty()) {
				std::lock_guard lock(mu_);
				if (adopted_.empty() && woken_.empty())
					break;
			}
		}
		const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_tick -
											Clock::now());
		const int n = epoll_wait(ep_.get(), ev, kEvents,
					 !again_.empty() ? 0
					 : quiet	 ? -1
							 : int(std::clamp<long long>(wait.count(), 0,
										     ms(kTick))));
		now_ = Clock::now();
		if (quiet) {
			// Woken by an event after a sleep without ticks: the deadlines run from now.
			quiet = false;
			next_tick = now_ + kTick;
		}
		if (n < 0 && errno != EINTR) {
			logger("memserver")->error("epoll_wait: {}", err_text(errno));
			std::this_thread::sleep_for(kTick); // not a spin
		}
		for (int i = 0; i < n; i++) {
			auto *c = static_cast<Conn *>(ev[i].data.ptr);
			if (!c) {
				take_handovers();
				continue;
			}
			if (c->fd.get() < 0)
				continue; // closed earlier in this batch
			const uint32_t e = ev[i].events;
			if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
				c->readable = true;
			if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR))
				c->writable = true;
			if (!c->parked)
				serve(*c);
			else
				flush_parked(*c);
		}
		// Connections that had more to do than their turn allowed.
		retry_.swap(again_);
		for (auto &cp : retry_)
			if (!cp->parked && cp->fd.get() >= 0)
				serve(*cp);
		retry_.clear();
		dead_.clear();
		if (now_ >= next_tick) {
			quiet = n == 0 && again_.empty() && !check_deadlines();
			dead_.clear();
			next_tick = now_ + kTick;
		}
	}
	dead_.clear();
}

void Memserver::Loop::serve(Conn &c)
{
	for (unsigned pass = 0;; pass++) {
		if (c.parked || c.fd.get() < 0)
			return;
		const bool held_back = process_input(c);
		flush(c);
		if (c.fd.get() < 0)
			return;
		// The peer is gone: nothing queued can reach it. A graceful close waits for the
		// queue.
		if (c.eof || (c.closing && c.tx_count == 0)) {
			finish(c);
			return;
		}
		// Input stopped only because the replies filled the queue, and the peer took
		// some: serve on, but after kPasses give the other connections their turn first.
		if (!held_back || c.tx_count >= Conn::kTxSlots)
			return;
		if (pass + 1 == kPasses) {
			again_.push_back(conns_[c.index]);
			return;
		}
	}
}

bool Memserver::Loop::fill(Conn &c)
{
	if (c.rx_begin == c.rx_end)
		c.rx_begin = c.rx_end = 0;
	else if (c.rx_begin > Conn::kRxBuf / 2 || c.rx_end == Conn::kRxBuf) {
		std::memmove(c.rx.get(), c.rx.get() + c.rx_begin, c.rx_end - c.rx_begin);
		c.rx_end -= c.rx_begin;
		c.rx_begin = 0;
	}
	if (!c.readable || c.eof)
		return false;
	const size_t want = Conn::kRxBuf - c.rx_end;
	const ssize_t n = ::recv(c.fd.get(), c.rx.get() + c.rx_end, want, MSG_DONTWAIT);
	if (n > 0) {
		c.rx_end += size_t(n);
		// A short read emptied the socket: the next bytes bring a new edge.
		if (size_t(n) < want)
			c.readable = false;
		return true;
	}
	if (n < 0 && errno == EINTR)
		return true;
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
		c.readable = false;
		return false;
	}
	if (n < 0 && errno != ECONNRESET)
		m_.warn_peer(PeerEvent::Protocol,
			     c.peer + ": receive failed: " + err_text(errno));
	c.eof = true; // closed by the peer (or broken)
	return false;
}

bool Memserver::Loop::process_input(Conn &c)
{
	bool held_back = false;
	while (!c.parked && !c.closing && !c.eof && c.fd.get() >= 0) {
		if (c.payload.active) {
			if (!pump_payload(c))
				break;
			continue;
		}
		// Back-pressure: a peer that does not take its replies gets no more served.
		if (c.tx_count >= Conn::kTxSlots) {
			held_back = true;
			break;
		}
		const size_t avail = c.rx_end - c.rx_begin;
		if (avail < proto::kHeaderSize) {
			if (!fill(c))
				break;
			continue;
		}
		const auto hb = std::span<const std::byte>(c.rx.get() + c.rx_begin, proto::kHeaderSize);
		proto::Header h;
		const auto st = proto::decode_header(hb.first<proto::kHeaderSize>(), h);
		if (!st.ok || h.is_response()) {
			m_.warn_peer(PeerEvent::Protocol, c.peer + ": malformed message (" +
				     (st.ok ? "unexpected response" : st.error) + "); disconnecting");
			if (!st.ok && peer_of_other_version(hb)) {
				// Tell it: an error response of our version, which its decoder refuses
				// as an unsupported version (a clear protocol error on its side).
				proto::Header r;
				r.op = proto::Op(uint8_t(hb[5]));
				for (int i = 0; i < 8; i++)
					r.request_id |= uint64_t(hb[16 + size_t(i)]) << (8 * i);
				queue_reply(c, r, EPROTONOSUPPORT);
			}
			close_after_flush(c);
			break;
		}
		const size_t fixed = size_t(proto::request_body_size(h.op));
		if (avail < proto::kHeaderSize + fixed) {
			if (!fill(c))
				break;
			continue;
		}
		const auto body = std::span<const std::byte>(
			c.rx.get() + c.rx_begin + proto::kHeaderSize, fixed);
		c.rx_begin += proto::kHeaderSize + fixed; // the bytes stay put until the next fill
		c.msg_since = {};
		dispatch(c, h, body);
	}
	// A message that has started must arrive whole within the message timeout.
	const bool partial = c.payload.active || c.rx_end > c.rx_begin;
	if (!partial)
		c.msg_since = {};
	else if (c.msg_since == Clock::time_point{})
		c.msg_since = now_;
	return held_back;
}

void Memserver::Loop::dispatch(Conn &c, const proto::Header &h, std::span<const std::byte> body)
{
	const Handlers::Entry &op = Handlers::of(h.op);
	const bool io_op = h.op == proto::Op::Read || h.op == proto::Op::Write;
	if (!op.fn && !io_op) { // decode_header lets no such op through
		m_.warn_peer(PeerEvent::Protocol, c.peer + ": no handler for op " +
			     std::to_string(unsigned(h.op)) + "; disconnecting");
		close_after_flush(c);
		return;
	}
	if (!c.authed && !op.before_auth) {
		// Nothing (no slab, no rkey, no stats) before the peer proved it has the key.
		m_.warn_peer(PeerEvent::Auth, c.peer + ": " + proto::op_name(h.op) +
			     " before authentication; refused, disconnecting");
		queue_reply(c, h, EACCES);
		close_after_flush(c);
		return;
	}
	if (op.admin && !c.admin) {
		m_.warn_peer(PeerEvent::Auth,
			     fmt::format("{}: {} refused: it needs the admin key (--admin-key)", c.peer,
					 proto::op_name(h.op)));
		queue_reply(c, h, EPERM); // fixed body: the stream is in step
		return;
	}
	if (op.needs_session && c.session.load(std::memory_order_relaxed) == 0) {
		// Before HELLO: refused, with the stream kept in step (a WRITE's payload dropped).
		if (h.op == proto::Op::Write) {
			c.payload = Conn::Payload{h, nullptr, proto::kNoSlab,
						  uint32_t(h.body_len - body.size()),
						  uint32_t(h.body_len - body.size()), EACCES, true};
			return;
		}
		queue_reply(c, h, EACCES);
		return;
	}
	if (c.fenced.load()) { // a reconnect of our client replaced us: apply nothing more
		logger("memserver")->debug("{}: dropping a request on a fenced connection", c.peer);
		finish(c);
		return;
	}
	if (io_op) {
		io(c, h, body);
		return;
	}
	if (op.blocking) {
		park(c, h, body);
		return;
	}
	std::unique_lock<std::mutex> none;
	Request r{c, h, body, none};
	const Next next = op.fn(m_, r);
	if (r.replied)
		queue_reply(c, h, r.status, std::span(r.small).first(r.small_len), std::move(r.big));
	if (next == Next::Malformed)
		m_.warn_peer(PeerEvent::Protocol,
			     fmt::format("{}: malformed {} ({}); disconnecting", c.peer,
					 proto::op_name(h.op), r.malformed ? r.malformed : "bad request"));
	if (next != Next::Continue)
		close_after_flush(c);
}

// The data path: no allocation, no lock but the connection's own, nothing logged unless the
// peer misbehaves.
void Memserver::Loop::io(Conn &c, const proto::Header &h, std::span<const std::byte> body)
{
	proto::IoRequest req;
	const bool write = h.op == proto::Op::Write;
	const auto st = proto::decode(body, req);
	const char *bad = st.ok ? nullptr : st.error;
	if (!bad && write && h.body_len - body.size() != req.length)
		bad = "WRITE length does not match its payload";
	if (bad) {
		m_.warn_peer(PeerEvent::Protocol, fmt::format("{}: malformed {} ({}); disconnecting",
							      c.peer, proto::op_name(h.op), bad));
		close_after_flush(c);
		return;
	}
	std::byte *mem = m_.pool_.begin_access(req.slab_id, c.session.load(std::memory_order_relaxed),
					       req.offset, req.length);
	if (!mem)
		io_.refused.add();
	if (!write) {
		if (!mem) {
			queue_reply(c, h, EACCES);
			return;
		}
		// The access is open until the reply is taken, which is bounded by the message
		// timeout: a slow reader cannot hold a release() of the slab for longer.
		queue_reply(c, h, 0, {}, {}, mem, req.length, req.slab_id);
		io_.read_ops.add();
		io_.read_bytes.add(req.length);
		return;
	}
	c.payload = Conn::Payload{h,
				  mem,
				  mem ? req.slab_id : proto::kNoSlab,
				  req.length,
				  req.length,
				  mem ? 0u : uint32_t(EACCES),
				  true};
}

bool Memserver::Loop::pump_payload(Conn &c)
{
	Conn::Payload &p = c.payload;
	{
		// Under `busy`, checked for a fence: once fence() holds it, no byte of this
		// connection lands in a slab any more.
		std::lock_guard busy(c.busy);
		if (c.fenced.load()) {
			logger("memserver")->debug("{}: dropping a WRITE on a fenced connection", c.peer);
			finish(c);
			return false;
		}
		while (p.left) {
			const size_t avail = c.rx_end - c.rx_begin;
			if (avail) {
				const uint32_t n = uint32_t(std::min<size_t>(avail, p.left));
				if (p.dst) {
					UncheckedSlabBytes unchecked;
					std::memcpy(p.dst + (p.len - p.left), c.rx.get() + c.rx_begin, n);
				}
				c.rx_begin += n;
				p.left -= n;
				continue;
			}
			if (!p.dst || p.left < kDirect) {
				if (!fill(c))
					return false;
				continue;
			}
			if (!c.readable || c.eof)
				return false;
			ssize_t n;
			{
				UncheckedSlabBytes unchecked;
				n = ::recv(c.fd.get(), p.dst + (p.len - p.left), p.left, MSG_DONTWAIT);
			}
			if (n > 0) {
				if (uint32_t(n) < p.left)
					c.readable = false;
				p.left -= uint32_t(n);
				continue;
			}
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
				c.readable = false;
				return false;
			}
			if (n < 0 && errno != ECONNRESET)
				m_.warn_peer(PeerEvent::Protocol, fmt::format("{}: truncated WRITE "
									      "request: {}",
									      c.peer,
									      err_text(errno)));
			c.eof = true;
			return false;
		}
	}
	if (p.slab != proto::kNoSlab) {
		m_.pool_.end_access(p.slab);
		io_.write_ops.add();
		io_.write_bytes.add(p.len);
	}
	p.active = false;
	p.slab = proto::kNoSlab;
	c.msg_since = {};
	queue_reply(c, p.h, p.status);
	return true;
}

void Memserver::Loop::queue_reply(Conn &c, const proto::Header &req, uint32_t status,
				  std::span<const std::byte> body, std::vector<std::byte> big,
				  const std::byte *payload, uint32_t payload_len, uint32_t slab)
{
	// The callers checked for room (back-pressure); a full queue here is a bug: drop the
	// connection rather than an answer.
	if (c.tx_count >= Conn::kTxSlots) {
		if (slab != proto::kNoSlab)
			m_.pool_.end_access(slab);
		logger("memserver")->error("{}: reply queue overflow; disconnecting", c.peer);
		c.eof = true;
		return;
	}
	Conn::Tx &t = c.tx[(c.tx_head + c.tx_count) % Conn::kTxSlots];
	c.tx_count++;
	proto::Header h;
	h.op = req.op;
	h.flags = proto::kFlagResponse;
	h.status = status;
	h.request_id = req.request_id;
	if (status)
		body = {}, big.clear(), payload = nullptr, payload_len = 0;
	h.body_len = uint32_t(body.size() + big.size() + payload_len);
	proto::encode_header(h, std::span(t.head).first<proto::kHeaderSize>());
	if (!body.empty())
		std::memcpy(t.head.data() + proto::kHeaderSize, body.data(),
			    std::min(body.size(), Conn::kSmallReply));
	t.head_len = uint32_t(proto::kHeaderSize + std::min(body.size(), Conn::kSmallReply));
	t.big = std::move(big);
	t.payload = payload;
	t.payload_len = payload_len;
	t.slab = slab;
	t.queued = now_;
}

void Memserver::Loop::flush(Conn &c)
{
	while (c.tx_count && c.writable && !c.eof && c.fd.get() >= 0) {
		iovec iov[kMaxIov];
		int n = 0;
		size_t total = 0, skip = c.tx_off;
		for (unsigned i = 0; i < c.tx_count && n + 3 <= kMaxIov; i++) {
			Conn::Tx &t = c.tx[(c.tx_head + i) % Conn::kTxSlots];
			const std::pair<const std::byte *, size_t> parts[3] = {
				{t.head.data(), t.head_len},
				{t.big.data(), t.big.size()},
				{t.payload, t.payload_len}};
			for (const auto &[p, len] : parts) {
				if (len <= skip) {
					skip -= len;
					continue;
				}
				iov[n++] = {const_cast<std::byte *>(p) + skip, len - skip};
				total += len - skip;
				skip = 0;
			}
		}
		msghdr msg{};
		msg.msg_iov = iov;
		msg.msg_iovlen = size_t(n);
		ssize_t sent;
		{
			UncheckedSlabBytes unchecked; // READ replies point into slabs
			sent = ::sendmsg(c.fd.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
		}
		if (sent < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				c.writable = false;
				break;
			}
			c.eof = true; // the peer is gone: nothing queued can reach it
			break;
		}
		if (size_t(sent) < total)
			c.writable = false; // the socket is full: EPOLLOUT brings a new edge
		size_t done = c.tx_off + size_t(sent);
		while (c.tx_count) {
			Conn::Tx &t = c.tx[c.tx_head];
			const size_t len = t.head_len + t.big.size() + t.payload_len;
			if (done < len)
				break;
			done -= len;
			if (t.slab != proto::kNoSlab)
				m_.pool_.end_access(t.slab);
			t.slab = proto::kNoSlab;
			t.payload = nullptr;
			if (!t.big.empty())
				std::vector<std::byte>().swap(t.big); // control path: give it back
			c.tx_head = (c.tx_head + 1) % Conn::kTxSlots;
			c.tx_count--;
		}
		c.tx_off = done;
	}
}

void Memserver::Loop::flush_parked(Conn &c)
{
	// Only the replies queued before the control request: nothing more is read (the next
	// request is applied after it), and the worker touches none of this.
	flush(c);
	if (c.eof)
		finish(c); // gone: its replies dropped now, the socket closed once handed back
}

void Memserver::Loop::drop_replies(Conn &c)
{
	for (; c.tx_count; c.tx_count--, c.tx_head = (c.tx_head + 1) % Conn::kTxSlots) {
		Conn::Tx &t = c.tx[c.tx_head];
		if (t.slab != proto::kNoSlab)
			m_.pool_.end_access(t.slab);
		t = {};
	}
	c.tx_off = 0;
}

void Memserver::Loop::park(Conn &c, const proto::Header &h, std::span<const std::byte> body)
{
	c.parked = true;
	c.ctl_h = h;
	if (!body.empty())
		std::memcpy(c.ctl_body.data(), body.data(), body.size());
	c.ctl_len = body.size();
	std::shared_ptr<Conn> cp = conns_[c.index];
	// A client's handshake (DONOR_PROOF, HELLO, then BIND) never queues behind other control
	// work.
	const WorkerPool::Lane lane = h.op == proto::Op::DonorProof || h.op == proto::Op::Hello ||
						      h.op == proto::Op::Bind
					      ? WorkerPool::Lane::Handshake
					      : WorkerPool::Lane::Control;
	m_.workers_->submit(lane, [&m = m_, cp = std::move(cp)]() mutable {
		Conn &k = *cp;
		std::unique_lock busy(k.busy);
		Request r{k, k.ctl_h, std::span<const std::byte>(k.ctl_body.data(), k.ctl_len),
			  busy};
		Next next;
		if (k.fenced.load()) {
			logger("memserver")->debug("{}: dropping a request on a fenced connection",
						   k.peer);
			next = Next::Close;
		} else {
			next = Handlers::of(k.ctl_h.op).fn(m, r);
		}
		if (busy.owns_lock())
			busy.unlock();
		k.ctl_next = next;
		k.ctl_replied = r.replied;
		k.ctl_status = r.status;
		if (r.replied && r.big.empty())
			k.ctl_reply.assign(r.small.begin(), r.small.begin() + long(r.small_len));
		else
			k.ctl_reply = std::move(r.big);
		if (next == Next::Malformed)
			m.warn_peer(PeerEvent::Protocol,
				    fmt::format("{}: malformed {} ({}); disconnecting", k.peer,
						proto::op_name(k.ctl_h.op),
						r.malformed ? r.malformed : "bad request"));
		Loop *loop = k.loop;
		k.ctl_done.store(true, std::memory_order_release);
		loop->wake(std::move(cp));
	});
}

void Memserver::Loop::unpark(Conn &c)
{
	c.parked = false;
	c.ctl_done.store(false, std::memory_order_relaxed);
	if (c.ctl_replied) {
		if (c.ctl_reply.size() <= Conn::kSmallReply)
			queue_reply(c, c.ctl_h, c.ctl_status, c.ctl_reply);
		else
			queue_reply(c, c.ctl_h, c.ctl_status, {}, std::move(c.ctl_reply));
	}
	c.ctl_reply.clear();
	c.ctl_replied = false;
	if (c.ctl_next != Next::Continue)
		close_after_flush(c);
}

void Memserver::Loop::finish(Conn &c, bool reset)
{
	if (c.fd.get() >= 0) {
		if (reset) {
			// Dropped for being slow: a reset, so that what it did not take (megabytes
			// of READ replies) is not kept sending at its pace after the close.
			const linger l{1, 0};
			setsockopt(c.fd.get(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
		}
		if (c.payload.active && c.payload.slab != proto::kNoSlab)
			m_.pool_.end_access(c.payload.slab);
		c.payload = {};
		drop_replies(c);
		epoll_ctl(ep_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
		c.fd.reset();
		c.rx.reset();
		logger("memserver")->debug("{}: connection closed", c.peer);
	} else if (!c.cut) {
		return; // finished already
	}
	if (c.parked) {
		// A worker applies its control request (which may wait for these very accesses,
		// or for its reply to be taken): its socket is closed and its accesses ended now,
		// and the rest waits until the worker hands it back (take_handovers()).
		c.cut = true;
		c.closing = true;
		c.eof = true;
		return;
	}
	c.cut = false;
	// Out of the list (the last one takes its place); kept alive until the end of the batch.
	const size_t i = c.index;
	dead_.push_back(std::move(conns_[i]));
	if (i + 1 != conns_.size()) {
		conns_[i] = std::move(conns_.back());
		conns_[i]->index = i;
	}
	conns_.pop_back();
	load_.fetch_sub(1, std::memory_order_relaxed);
	m_.connection_closed(dead_.back());
}

bool Memserver::Loop::check_deadlines()
{
	const auto &o = m_.opts_;
	bool running = false;
	for (size_t i = conns_.size(); i-- > 0;) {
		Conn &c = *conns_[i];
		// A parked connection: a worker applies its control request (its waits are
		// bounded), and nothing is read meanwhile, so only the replies queued before it
		// are checked: they hold slab accesses. Its worker hands it back with an event.
		if (c.parked && (c.cut || !c.tx_count))
			continue;
		if (c.parked) {
			if (now_ >= c.tx[c.tx_head].queued + o.message_timeout)
				slow_reader(c);
			else
				running = true;
			continue;
		}
		if (c.session.load(std::memory_order_relaxed) == 0 &&
		    now_ >= c.accepted + o.handshake_timeout) {
			m_.warn_peer(PeerEvent::Slow, fmt::format("{}: handshake not finished within "
								  "{} ms; disconnecting",
								  c.peer, ms(o.handshake_timeout)));
			finish(c, true);
		} else if (c.msg_since != Clock::time_point{} && now_ >= c.msg_since + o.message_timeout) {
			m_.warn_peer(PeerEvent::Slow,
				     fmt::format("{}: {} not received whole within {} ms (slow sender); "
						 "disconnecting",
						 c.peer,
						 c.payload.active ? proto::op_name(c.payload.h.op)
								  : "message",
						 ms(o.message_timeout)));
			finish(c, true);
		} else if (c.tx_count && now_ >= c.tx[c.tx_head].queued + o.message_timeout) {
			slow_reader(c);
		} else if (c.fd.get() >= 0 && (c.session.load(std::memory_order_relaxed) == 0 ||
					       c.msg_since != Clock::time_point{} || c.tx_count)) {
			running = true;
		}
	}
	return running;
}

void Memserver::Loop::slow_reader(Conn &c)
{
	// Every reply is taken whole within the message timeout of its queueing: a READ's
	// access to its slab stays open no longer, parked or not.
	const auto op = proto::Op(uint8_t(c.tx[c.tx_head].head[5]));
	m_.warn_peer(PeerEvent::Slow,
		     fmt::format("{}: {} reply not taken within {} ms (slow reader); disconnecting",
				 c.peer, proto::op_name(op), ms(m_.opts_.message_timeout)));
	finish(c, true);
}

} // namespace rdmaswap
