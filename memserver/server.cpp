// SPDX-License-Identifier: MIT
// Memserver: start, accept loop, connection threads, and the per-connection request loop
// (message deadlines, authentication and session checks, dispatch to the handlers).
#include "memserver/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/log.h"
#include "common/swap_safety.h"
#include "memserver/conn.h"
#include "memserver/rdma_service.h"

namespace rdmaswap {

namespace {
// How often idle connection threads look at the stop flag.
constexpr int kPollMs = 500;
constexpr size_t kScratch = 64 * 1024;
// The accept loop's housekeeping period, and how many connections it accepts between two
// looks at the clock.
constexpr auto kTick = std::chrono::milliseconds(200);
constexpr int kAcceptBatch = 64;
// Refusals of one kind are reported at most this often; idle peers are forgotten this often.
constexpr auto kDropReport = std::chrono::seconds(5);
constexpr auto kPeerSweep = std::chrono::seconds(10);
// The listen backlog (the kernel caps it at net.core.somaxconn): a flood that outpaces the
// accept loop for a moment fills it, not the SYN retries of other clients.
constexpr int kBacklog = 4096;

// Per-session info lines (new, bound, detached, ended, ...) per address.
constexpr unsigned kSessionLogBurst = 20;
constexpr std::chrono::seconds kSessionLogPeriod{10};

PeerTable::Limits peer_limits(const MemserverOptions &o)
{
	PeerTable::Limits l;
	l.connect_rate = o.connect_rate;
	l.max_connections = std::min(o.max_peer_connections, o.max_connections);
	l.max_sessions = o.max_peer_sessions;
	l.log_burst = kSessionLogBurst;
	l.log_period = kSessionLogPeriod;
	return l;
}

std::string peer_name(const sockaddr_storage &ss)
{
	SockAddr a;
	a.ss = ss;
	return a.str();
}
} // namespace

void notify_ready()
{
	const char *path = getenv("NOTIFY_SOCKET");
	if (!path || !*path)
		return;
	sockaddr_un sun{};
	sun.sun_family = AF_UNIX;
	const size_t len = strnlen(path, sizeof sun.sun_path);
	if (len >= sizeof sun.sun_path)
		return;
	std::memcpy(sun.sun_path, path, len);
	if (sun.sun_path[0] == '@')
		sun.sun_path[0] = '\0'; // abstract namespace
	Fd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
	if (!fd)
		return;
	static const char msg[] = "READY=1";
	sendto(fd.get(), msg, sizeof msg - 1, 0, reinterpret_cast<sockaddr *>(&sun),
	       socklen_t(offsetof(sockaddr_un, sun_path) + len));
}

Memserver::Memserver(const MemserverOptions &opts)
	: opts_(opts), pool_(opts.capacity, opts.slab_size, opts.lock_memory),
	  sessions_(opts.max_floors), peers_(peer_limits(opts))
{
	auto log = logger("memserver");
	if (opts_.auth_keys.empty() && !opts_.insecure)
		throw std::runtime_error("no --auth-key FILE given: every memserver and client of a "
					 "cluster needs the same key (make one with: openssl rand "
					 "-hex 32 > FILE; chmod 600 FILE), or run without "
					 "authentication with --insecure (trusted networks only)");
	if (!opts_.auth_keys.empty() && opts_.insecure)
		throw std::runtime_error("--auth-key and --insecure exclude each other");
	if (opts_.auth_keys.size() > 2)
		throw std::runtime_error("at most two --auth-key files (the old and the new key "
					 "during a rotation)");
	if (!opts_.admin_keys.empty() && opts_.insecure)
		throw std::runtime_error("--admin-key needs authentication, which --insecure turns "
					 "off (with --insecure every peer may use the admin ops)");
	if (opts_.admin_keys.size() > 2)
		throw std::runtime_error("at most two --admin-key files (the old and the new key "
					 "during a rotation)");
	for (const auto &a : opts_.admin_keys)
		for (const auto &k : opts_.auth_keys)
			if (a->id() == k->id())
				throw std::runtime_error("--admin-key is the same key as --auth-key: "
							 "every cluster-key holder would be an admin; "
							 "make a separate key (openssl rand -hex 32)");
	keys_ = opts_.auth_keys;
	keys_.insert(keys_.end(), opts_.admin_keys.begin(), opts_.admin_keys.end());
	if (opts_.insecure)
		log->warn("--insecure: authentication is OFF; anyone who can reach port {} can take "
			  "slabs and read or write them",
			  opts_.port);
	Endpoint ep{opts_.listen, opts_.port};
	addrinfo hints{};
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	addrinfo *res = nullptr;
	const std::string port = std::to_string(opts_.port);
	if (int rc = getaddrinfo(opts_.listen.c_str(), port.c_str(), &hints, &res))
		throw std::runtime_error("cannot resolve listen address " + opts_.listen + ": " +
					 gai_strerror(rc));
	Fd fd(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
	const int one = 1;
	if (fd)
		setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (!fd || ::bind(fd.get(), res->ai_addr, res->ai_addrlen) < 0 ||
	    ::listen(fd.get(), kBacklog) < 0 ||
	    fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) | O_NONBLOCK) < 0) {
		const int err = errno;
		freeaddrinfo(res);
		throw std::runtime_error("cannot listen on " + ep.str() + ": " + std::strerror(err));
	}
	freeaddrinfo(res);
	sockaddr_storage ss{};
	socklen_t sl = sizeof ss;
	getsockname(fd.get(), reinterpret_cast<sockaddr *>(&ss), &sl);
	port_ = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in *>(&ss)->sin_port
					      : reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port);
	listen_fd_ = std::move(fd);

	if (opts_.transport == TransportKind::Rdma ||
	    (opts_.transport == TransportKind::Auto && RdmaService::devices_present())) {
		try {
			rdma_ = std::make_unique<RdmaService>(opts_.listen, port_, pool_, sessions_,
							      *this, !opts_.insecure);
		} catch (const std::exception &e) {
			if (opts_.transport == TransportKind::Rdma)
				throw;
			log->warn("RDMA not available ({}); serving TCP only", e.what());
		}
	} else if (opts_.transport == TransportKind::Auto) {
		log->info("no RDMA device found; serving TCP only");
	}
	log->info("listening on {}:{} ({}), capacity {} bytes in {} slabs of {} bytes, memory {}, "
		  "{}",
		  opts_.listen, port_, rdma_ ? "tcp+rdma" : "tcp", pool_.capacity(),
		  pool_.slabs_total(), pool_.slab_size(), opts_.lock_memory ? "locked" : "not locked",
		  opts_.insecure ? "NO authentication"
				 : fmt::format("{} auth key(s), {} admin key(s)",
					       opts_.auth_keys.size(), opts_.admin_keys.size()));
}

Memserver::~Memserver()
{
	stop_.store(true);
	reap(true);
	rdma_.reset();
}

proto::StatsReply Memserver::stats() const
{
	proto::StatsReply r;
	r.capacity = pool_.capacity();
	r.slab_size = pool_.slab_size();
	r.slabs_total = pool_.slabs_total();
	r.slabs_free = pool_.slabs_free();
	r.sessions = sessions_.count();
	r.rdma_sessions = sessions_.rdma_count();
	r.rdma_qps = rdma_ ? rdma_->qps() : 0;
	std::lock_guard lock(conns_mu_);
	r.tcp_read_ops = closed_read_ops_;
	r.tcp_read_bytes = closed_read_bytes_;
	r.tcp_write_ops = closed_write_ops_;
	r.tcp_write_bytes = closed_write_bytes_;
	for (auto &c : conns_) {
		r.tcp_read_ops += c->read_ops.load(std::memory_order_relaxed);
		r.tcp_read_bytes += c->read_bytes.load(std::memory_order_relaxed);
		r.tcp_write_ops += c->write_ops.load(std::memory_order_relaxed);
		r.tcp_write_bytes += c->write_bytes.load(std::memory_order_relaxed);
		r.connections += !c->done.load();
	}
	return r;
}

void Memserver::warn_peer(PeerEvent kind, const std::string &what)
{
	uint64_t suppressed = 0;
	if (!peer_log_[size_t(kind)].allow(suppressed))
		return;
	if (suppressed)
		logger("memserver")->warn("{} ({} similar messages suppressed)", what, suppressed);
	else
		logger("memserver")->warn("{}", what);
}

void Memserver::fence(uint64_t session, uint64_t id)
{
	std::shared_ptr<Conn> old;
	{
		std::lock_guard lock(conns_mu_);
		for (auto &c : conns_)
			if (c->id == id && c->session.load() == session)
				old = c;
	}
	if (!old) {
		logger("memserver")->info("connection {:016x} replaced by a reconnect of its client "
					  "(already closed)",
					  id);
		return;
	}
	old->fenced.store(true);
	std::lock_guard wait(old->busy); // let a request it is applying finish
	::shutdown(old->fd.get(), SHUT_RDWR);
	logger("memserver")->info("connection {:016x} ({}) replaced by a reconnect of its client "
				  "(fenced)",
				  id, old->peer);
}

void Memserver::reap(bool all)
{
	std::list<std::shared_ptr<Conn>> dead;
	{
		std::lock_guard lock(conns_mu_);
		for (auto it = conns_.begin(); it != conns_.end();) {
			if (all && !(*it)->done.load())
				::shutdown((*it)->fd.get(), SHUT_RDWR);
			if (all || (*it)->done.load()) {
				dead.splice(dead.end(), conns_, it++);
			} else {
				++it;
			}
		}
	}
	for (auto &c : dead) {
		if (c->thread.joinable())
			c->thread.join();
		std::lock_guard lock(conns_mu_);
		closed_read_ops_ += c->read_ops;
		closed_read_bytes_ += c->read_bytes;
		closed_write_ops_ += c->write_ops;
		closed_write_bytes_ += c->write_bytes;
	}
}

void Memserver::run()
{
	if (opts_.reserve)
		reserve_thread_ = std::thread([this] { reserve_loop(); });
	lease_thread_ = std::thread([this] { lease_loop(); });
	notify_ready();
	accept_loop();
	reap(true);
	if (reserve_thread_.joinable())
		reserve_thread_.join();
	lease_thread_.join();
	logger("memserver")->info("stopped");
}

void Memserver::accept_loop()
{
	// Accepting comes first: the periodic work runs between batches, at most every kTick,
	// and lease expiry (which frees and zeroes slabs) has a thread of its own.
	auto next_tick = Clock::now();
	while (!stop_.load()) {
		auto now = Clock::now();
		if (now >= next_tick) {
			accept_housekeeping(now);
			next_tick = now + kTick;
		}
		const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - now);
		pollfd p{listen_fd_.get(), POLLIN, 0};
		if (::poll(&p, 1, int(std::max<long long>(1, wait.count()))) <= 0)
			continue;
		for (int i = 0; i < kAcceptBatch && !stop_.load(); i++)
			if (!accept_one())
				break;
	}
}

bool Memserver::accept_one()
{
	sockaddr_storage ss{};
	socklen_t sl = sizeof ss;
	// The listening socket is non-blocking; the accepted one is not (accept4 does not
	// inherit O_NONBLOCK) and every wait on it is bounded by its own deadline.
	Fd fd(::accept4(listen_fd_.get(), reinterpret_cast<sockaddr *>(&ss), &sl, SOCK_CLOEXEC));
	if (!fd) {
		const int err = errno;
		if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
			warn_peer(PeerEvent::Limit, std::string("cannot accept connections: ") +
				  std::strerror(err));
			std::this_thread::sleep_for(std::chrono::milliseconds(10)); // not a spin
			return false;
		}
		return err != EAGAIN && err != EWOULDBLOCK;
	}
	// Per dropped connection: no allocation, no log line (a refusal is counted, and
	// accept_housekeeping reports the counts), one lookup in the peer table.
	const PeerAddr addr = PeerAddr::from(ss);
	std::unique_lock lock(conns_mu_);
	bool full = conns_.size() >= opts_.max_connections;
	if (full) { // ended connections may not be reaped yet
		lock.unlock();
		reap(false);
		lock.lock();
		full = conns_.size() >= opts_.max_connections;
	}
	lock.unlock();
	if (peers_.admit(addr, Clock::now(), full) != PeerTable::Verdict::Ok) {
		// Closed at once with a reset: a flood holds no thread, no memory and no socket in
		// a closing state.
		const linger reset{1, 0};
		setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
		return true;
	}
	const int one = 1;
	setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	// A client host that died without closing its sockets is noticed within about
	// 20 s (keepalive probes on an idle connection; TCP_USER_TIMEOUT for unacknowledged
	// data), so its session detaches and a restarted client can take its volume over.
	const int idle = 5, intvl = 3, cnt = 5, user_timeout_ms = 20000;
	setsockopt(fd.get(), SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
	setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
	setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
	setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
	setsockopt(fd.get(), IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms,
		   sizeof user_timeout_ms);
	auto c = std::make_shared<Conn>(keys_);
	c->fd = std::move(fd);
	c->peer = peer_name(ss);
	c->addr = addr;
	Conn &ref = *c;
	lock.lock();
	conns_.push_back(std::move(c));
	ref.thread = std::thread([this, &ref] {
		prefault_stack();
		serve(ref);
		peers_.closed(ref.addr);
		ref.done.store(true);
	});
	return true;
}

void Memserver::accept_housekeeping(Clock::time_point now)
{
	reap(false);
	using V = PeerTable::Verdict;
	for (V v : {V::Rate, V::Connections, V::ServerFull, V::TableFull}) {
		auto &last = drop_reported_[size_t(v)];
		if (now - last < kDropReport)
			continue;
		const PeerTable::Dropped d = peers_.drop_report(v);
		if (!d.total)
			continue;
		// Counted since the last report of this kind; the first one is reported at once.
		const auto in = last == Clock::time_point{}
					? std::string()
					: fmt::format(" in the last {} s",
						      std::chrono::duration_cast<std::chrono::seconds>(
							      now - last).count());
		last = now;
		std::string why;
		switch (v) {
		case V::Rate:
			why = fmt::format("over --connect-rate {}/s (burst {})", opts_.connect_rate,
					  2 * opts_.connect_rate);
			break;
		case V::Connections:
			why = fmt::format("over --max-peer-connections {} open at once",
					  std::min(opts_.max_peer_connections, opts_.max_connections));
			break;
		case V::ServerFull:
			why = fmt::format("over --max-connections {} open at once",
					  opts_.max_connections);
			break;
		default:
			break;
		}
		if (v == V::TableFull)
			warn_peer(PeerEvent::Limit,
				  fmt::format("refused {} connections from new addresses{}: the table of "
					      "peers is full of active addresses",
					      d.total, in));
		else
			warn_peer(PeerEvent::Limit,
				  fmt::format("refused {} connections from {}{}: {}{}; closed at once",
					      d.worst_count, d.worst.str(), in, why,
					      d.addresses > 1
						      ? fmt::format(" ({} more from {} other addresses)",
								    d.total - d.worst_count,
								    d.addresses - 1)
						      : std::string()));
	}
	for (const auto &[addr, n] : peers_.log_suppressed(now))
		logger("memserver")->info("{} more session messages about clients at {} suppressed "
					  "(at most {} per {} s per address)",
					  n, addr.str(), kSessionLogBurst, kSessionLogPeriod.count());
	if (now >= next_sweep_) {
		peers_.sweep(now);
		next_sweep_ = now + kPeerSweep;
	}
}

namespace {

long long ms(std::chrono::milliseconds t)
{
	return static_cast<long long>(t.count());
}

// A header with our magic and another protocol version: a client of another rdmaswap release.
bool peer_of_other_version(std::span<const std::byte, proto::kHeaderSize> h)
{
	const uint32_t magic = uint32_t(h[0]) | uint32_t(h[1]) << 8 | uint32_t(h[2]) << 16 |
			       uint32_t(h[3]) << 24;
	return magic == proto::kMagic && uint8_t(h[4]) != proto::kVersion;
}

// The answer to it before the connection is closed: an error response of our version, which
// its header decoder refuses as an unsupported version (a clear protocol error on its side,
// rather than a connection reset).
std::array<std::byte, proto::kHeaderSize>
version_refusal(std::span<const std::byte, proto::kHeaderSize> h)
{
	proto::Header r;
	r.op = proto::Op(uint8_t(h[5]));
	r.flags = proto::kFlagResponse;
	r.status = EPROTONOSUPPORT;
	for (int i = 0; i < 8; i++)
		r.request_id |= uint64_t(h[16 + size_t(i)]) << (8 * i);
	std::array<std::byte, proto::kHeaderSize> out;
	proto::encode_header(r, out);
	return out;
}

} // namespace

Memserver::Next Memserver::Handlers::reply(Memserver &m, Request &r, uint32_t status,
					   std::span<const std::byte> body,
					   const std::byte *payload, uint32_t payload_len)
{
	std::array<std::byte, proto::kHeaderSize> hdr;
	proto::Header h;
	h.op = r.h.op;
	h.flags = proto::kFlagResponse;
	h.status = status;
	h.request_id = r.h.request_id;
	h.body_len = status ? 0 : uint32_t(body.size() + payload_len);
	proto::encode_header(h, hdr);
	iovec iov[3];
	int n = 0;
	iov[n++] = {hdr.data(), hdr.size()};
	if (!status && !body.empty())
		iov[n++] = {const_cast<std::byte *>(body.data()), body.size()};
	if (!status && payload_len)
		iov[n++] = {const_cast<std::byte *>(payload), payload_len};
	// The reply has its own deadline: a peer that does not read it (while a READ's slab
	// access stays open) is dropped after the message timeout.
	const int err = sendv_all_until(r.c.fd.get(), iov, n,
					std::chrono::steady_clock::now() + m.opts_.message_timeout);
	if (err == 0)
		return Next::Continue;
	if (err == ETIMEDOUT)
		m.warn_peer(PeerEvent::Slow, fmt::format("{}: {} reply not taken within {} ms (slow "
							 "reader); disconnecting",
							 r.c.peer, proto::op_name(r.h.op),
							 ms(m.opts_.message_timeout)));
	return Next::Close;
}

Memserver::Next Memserver::Handlers::receive(Memserver &m, Request &r, void *buf, size_t len)
{
	const int err = recv_all_until(r.c.fd.get(), buf, len, r.deadline);
	if (err == 0)
		return Next::Continue;
	if (err == ETIMEDOUT)
		m.warn_peer(PeerEvent::Slow, fmt::format("{}: {} not received whole within {} ms "
							 "(slow sender); disconnecting",
							 r.c.peer, proto::op_name(r.h.op),
							 ms(m.opts_.message_timeout)));
	else if (err != ECONNRESET)
		m.warn_peer(PeerEvent::Protocol, fmt::format("{}: truncated {} request: {}", r.c.peer,
							     proto::op_name(r.h.op),
							     std::strerror(err)));
	return Next::Close;
}

Memserver::Next Memserver::Handlers::skip_payload(Memserver &m, Request &r)
{
	auto &scratch = r.c.scratch;
	for (size_t left = r.h.body_len - r.body.size(); left;) {
		const size_t n = std::min(left, scratch.size());
		if (Next got = receive(m, r, scratch.data(), n); got != Next::Continue)
			return got;
		left -= n;
	}
	return Next::Continue;
}

void Memserver::serve(Conn &c)
{
	auto log = logger("memserver");
	const int fd = c.fd.get();
	c.scratch.resize(kScratch);
	c.authed = opts_.insecure;
	c.admin = opts_.insecure;
	const auto handshake_end = c.accepted + opts_.handshake_timeout;
	log->debug("connection from {}", c.peer);

	while (!stop_.load()) {
		// Idle: wait for a message to start, as long as it takes (until HELLO, no longer
		// than the handshake deadline).
		const bool handshake = c.session.load() == 0;
		int wait_ms = kPollMs;
		if (handshake) {
			const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
				handshake_end - Clock::now());
			if (left.count() <= 0) {
				warn_peer(PeerEvent::Slow, c.peer + ": handshake not finished within " +
					  std::to_string(ms(opts_.handshake_timeout)) +
					  " ms; disconnecting");
				break;
			}
			wait_ms = int(std::min<long long>(wait_ms, left.count() + 1));
		}
		pollfd p{fd, POLLIN, 0};
		const int rc = ::poll(&p, 1, wait_ms);
		if (rc == 0 || (rc < 0 && errno == EINTR))
			continue;
		// A message has started: all of it (header, fixed body, payload) must arrive by
		// `deadline`, however its bytes trickle in.
		auto deadline = Clock::now() + opts_.message_timeout;
		const bool by_handshake = handshake && handshake_end < deadline;
		if (by_handshake)
			deadline = handshake_end;
		auto slow = [&](const char *what) {
			if (by_handshake)
				warn_peer(PeerEvent::Slow, c.peer + ": handshake not finished in time (slow "
							     "sender); disconnecting");
			else
				warn_peer(PeerEvent::Slow,
					  fmt::format("{}: {} not received whole within {} ms (slow "
						      "sender); disconnecting",
						      c.peer, what, ms(opts_.message_timeout)));
		};
		std::array<std::byte, proto::kHeaderSize> hdr;
		int err = rc < 0 ? errno : recv_all_until(fd, hdr.data(), hdr.size(), deadline);
		if (err) {
			if (err == ETIMEDOUT)
				slow("message header");
			else if (err != ECONNRESET)
				warn_peer(PeerEvent::Protocol,
					  c.peer + ": receive failed: " + std::strerror(err));
			break;
		}
		proto::Header h;
		const auto st = proto::decode_header(hdr, h);
		if (!st.ok || h.is_response()) {
			warn_peer(PeerEvent::Protocol, c.peer + ": malformed message (" +
				  (st.ok ? "unexpected response" : st.error) + "); disconnecting");
			if (!st.ok && peer_of_other_version(hdr)) // tell it: it reports EPROTO
				send_all_until(fd, version_refusal(hdr).data(), proto::kHeaderSize,
					       deadline);
			break;
		}
		std::array<std::byte, proto::kMaxFixedBody> body;
		const size_t fixed = size_t(proto::request_body_size(h.op));
		if ((err = recv_all_until(fd, body.data(), fixed, deadline))) {
			if (err == ETIMEDOUT)
				slow(proto::op_name(h.op));
			else if (err != ECONNRESET)
				warn_peer(PeerEvent::Protocol, c.peer + ": truncated " +
					  proto::op_name(h.op) + " request: " + std::strerror(err));
			break;
		}
		std::unique_lock<std::mutex> busy(c.busy, std::defer_lock);
		Request r{c, h, std::span<const std::byte>(body.data(), fixed), deadline, busy};
		const Handlers::Entry &op = Handlers::of(h.op);
		if (!op.fn) { // decode_header lets no such op through
			warn_peer(PeerEvent::Protocol, c.peer + ": no handler for op " +
				  std::to_string(unsigned(h.op)) + "; disconnecting");
			break;
		}
		if (!c.authed && !op.before_auth) {
			// Nothing (no slab, no rkey, no stats) before the peer proved it has the key.
			warn_peer(PeerEvent::Auth, c.peer + ": " + proto::op_name(h.op) +
				  " before authentication; refused, disconnecting");
			Handlers::reply(*this, r, EACCES);
			break;
		}
		Next next;
		if (op.admin && !c.admin) {
			warn_peer(PeerEvent::Auth,
				  fmt::format("{}: {} refused: it needs the admin key (--admin-key)",
					      c.peer, proto::op_name(h.op)));
			next = Handlers::reply(*this, r, EPERM); // fixed body: the stream is in step
		} else if (op.needs_session && r.session() == 0) {
			// Before HELLO: refused, with the stream kept in step.
			next = Handlers::skip_payload(*this, r);
			if (next == Next::Continue)
				next = Handlers::reply(*this, r, EACCES);
		} else {
			// Apply the request only if no reconnect of our client fenced this connection.
			busy.lock();
			if (c.fenced.load()) {
				log->debug("{}: dropping a request on a fenced connection", c.peer);
				break;
			}
			next = op.fn(*this, r);
			busy.unlock();
		}
		if (next == Next::Malformed)
			warn_peer(PeerEvent::Protocol,
				  fmt::format("{}: malformed {} ({}); disconnecting", c.peer,
					      proto::op_name(h.op),
					      r.malformed ? r.malformed : "bad request"));
		if (next != Next::Continue)
			break;
	}
	log->debug("{}: connection closed", c.peer);
	if (const uint64_t session = c.session.load())
		leave_session(session);
}

} // namespace rdmaswap
