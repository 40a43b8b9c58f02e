// SPDX-License-Identifier: MIT
// Memserver: accept loop and the per-connection request loop.
#include "memserver/server.h"

#include <arpa/inet.h>
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
#include <fstream>
#include <stdexcept>
#include <vector>

#include "common/log.h"
#include "common/swap_safety.h"
#include "memserver/rdma_service.h"

namespace rdmaswap {

namespace {
// A message that has started must arrive within this time, or the peer is dropped.
constexpr auto kMessageTimeout = std::chrono::seconds(30);
// How often idle connection threads look at the stop flag.
constexpr int kPollMs = 500;
constexpr size_t kScratch = 64 * 1024;

std::string peer_name(const sockaddr_storage &ss)
{
	SockAddr a;
	a.ss = ss;
	return a.str();
}
} // namespace

struct Memserver::Conn {
	explicit Conn(std::span<const std::shared_ptr<const AuthKey>> keys) : auth(keys) {}
	Fd fd;
	AuthServer auth;
	std::chrono::steady_clock::time_point accepted = std::chrono::steady_clock::now();
	std::string peer;
	uint64_t id = random_u64();         // told to the client in the HELLO reply
	std::atomic<uint64_t> session{0};
	std::mutex busy;                     // held while a request is being applied
	std::atomic<bool> fenced{false};     // a reconnect replaced it: apply nothing more
	std::thread thread;
	std::atomic<bool> done{false};
	std::atomic<uint64_t> read_ops{0}, read_bytes{0}, write_ops{0}, write_bytes{0};
};

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
	: opts_(opts), pool_(opts.capacity, opts.slab_size, opts.lock_memory)
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
	    ::listen(fd.get(), 128) < 0) {
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
				 : std::to_string(opts_.auth_keys.size()) + " auth key(s)");
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

void Memserver::leave_session(uint64_t session)
{
	if (!sessions_.leave(session))
		return;
	if (rdma_)
		rdma_->end_session(session); // a detached session's rkeys die with its PD
	if (sessions_.detached(session)) {
		logger("memserver")->info("session {:016x} detached: its slabs are kept for its "
					  "volume's lease",
					  session);
		return;
	}
	const uint32_t n = pool_.release_all(session);
	logger("memserver")->info("session {:016x} ended; {} slabs freed", session, n);
}

void Memserver::expire_leases()
{
	for (const auto &e : sessions_.expire(SessionTable::Clock::now())) {
		const uint32_t n = pool_.release_all(e.id);
		logger("memserver")->info("volume {} (session {:016x}, last client {}): lease "
					  "expired; {} slabs freed",
					  e.name, e.id, e.peer, n);
	}
}

int Memserver::volume_list(uint64_t session, const proto::VolumeListRequest &req,
			   std::vector<std::byte> &out)
{
	if (req.what == proto::ListWhat::Sessions) {
		const auto now = SessionTable::Clock::now();
		std::vector<proto::SessionEntry> v;
		for (const auto &r : sessions_.report(now)) {
			if (v.size() >= proto::kMaxSessionEntries)
				break;
			proto::SessionEntry e;
			e.session = r.id;
			e.slabs = uint32_t(pool_.owned_by(r.id).size());
			e.flags = (r.detached ? proto::kSessionDetached : 0) |
				  (r.rdma ? proto::kSessionRdma : 0) | (r.bound ? proto::kSessionBound : 0);
			e.lease_left_ms = uint64_t(r.lease_left.count());
			e.lease_s = r.lease_s;
			e.connections = r.refs;
			std::memcpy(e.volume.data(), r.name.data(), std::min(r.name.size(), e.volume.size()));
			std::memcpy(e.peer.data(), r.peer.data(),
				    std::min(r.peer.size(), e.peer.size() - 1));
			v.push_back(e);
		}
		const size_t skip = std::min<uint64_t>(req.start, v.size());
		const std::span<const proto::SessionEntry> page(v.data() + skip, v.size() - skip);
		out.resize(4 + page.size() * proto::kSessionEntrySize);
		proto::encode_entries(page, out);
		return 0;
	}
	if (!session)
		return EACCES;
	std::vector<proto::VolumeEntry> v;
	if (req.what == proto::ListWhat::Floors) {
		for (const auto &[chunk, epoch] :
		     sessions_.floors(session, req.start, proto::kMaxVolumeEntries))
			v.push_back(proto::VolumeEntry{proto::kNoSlab, 0, 0, chunk, epoch});
	} else {
		for (uint32_t id : pool_.owned_by(session)) {
			if (id < req.start)
				continue;
			if (v.size() >= proto::kMaxVolumeEntries)
				break;
			const SlabPool::Tag t = pool_.tag(id);
			proto::VolumeEntry e{id, 0, 0, t.chunk, t.epoch};
			if (rdma_ && sessions_.wants_rdma(session))
				if (int err = rdma_->expose_slab(session, id, e.addr, e.rkey))
					return err; // EAGAIN: attach the data QPs first
			v.push_back(e);
		}
	}
	out.resize(4 + v.size() * proto::kVolumeEntrySize);
	proto::encode_entries(v, out);
	return 0;
}

proto::GiveBackReply Memserver::give_back_status() const
{
	proto::GiveBackReply r;
	r.slabs_withdrawn = pool_.slabs_withdrawn();
	r.slabs_wanted = pool_.slabs_wanted();
	r.slabs_total = pool_.slabs_total();
	return r;
}

proto::GiveBackReply Memserver::give_back(uint64_t bytes)
{
	const uint64_t slabs = bytes / pool_.slab_size() + (bytes % pool_.slab_size() != 0);
	const auto w = pool_.withdraw(uint32_t(std::min<uint64_t>(slabs, pool_.slabs_total())));
	proto::GiveBackReply r = give_back_status();
	r.withdrawn_now = w.now;
	r.wanted_now = w.wanted;
	logger("memserver")->info("give-back of {} bytes: {} free slabs withdrawn now, {} granted "
				  "slabs wanted back from their clients; {} of {} slabs withdrawn, "
				  "{} moves pending",
				  bytes, w.now, w.wanted, r.slabs_withdrawn, r.slabs_total,
				  r.slabs_wanted);
	return r;
}

std::optional<uint64_t> read_mem_available(const std::string &path)
{
	std::ifstream f(path);
	std::string key;
	uint64_t kb = 0;
	std::string unit;
	while (f >> key >> kb) {
		std::getline(f, unit);
		if (key == "MemAvailable:")
			return kb * 1024;
	}
	return std::nullopt;
}

void Memserver::reserve_loop()
{
	auto log = logger("memserver");
	const uint64_t slab = pool_.slab_size();
	const uint64_t reserve = opts_.reserve;
	// Take memory back only when MemAvailable is this far above the reserve (and never more
	// than would bring it back below that), so that the pool does not flap.
	const uint64_t hysteresis = std::max<uint64_t>(2 * slab, reserve / 4);
	// After acting, wait for the kernel's accounting and the clients' moves to show.
	const auto settle = 3 * opts_.reserve_interval;
	auto next_action = std::chrono::steady_clock::now();
	uint32_t mine = 0; // slabs withdrawn (or wanted back) by this loop and not yet restored
	bool warned_read = false, warned_empty = false;
	while (!stop_.load()) {
		for (auto end = std::chrono::steady_clock::now() + opts_.reserve_interval;
		     !stop_.load() && std::chrono::steady_clock::now() < end;)
			std::this_thread::sleep_for(std::chrono::milliseconds(50));
		if (stop_.load())
			break;
		const auto avail = read_mem_available(opts_.meminfo);
		if (!avail) {
			if (!warned_read)
				log->warn("--reserve: cannot read MemAvailable from {}", opts_.meminfo);
			warned_read = true;
			continue;
		}
		warned_read = false;
		const auto now = std::chrono::steady_clock::now();
		if (now < next_action)
			continue;
		// Slabs already wanted back will be freed: count them as given.
		const uint64_t pending = uint64_t(pool_.slabs_wanted()) * slab;
		if (*avail + pending < reserve) {
			const uint64_t need = reserve - *avail - pending;
			const auto w = pool_.withdraw(uint32_t(
				std::min<uint64_t>((need + slab - 1) / slab, pool_.slabs_total())));
			if (w.now + w.wanted == 0) {
				if (!warned_empty)
					log->warn("--reserve: MemAvailable {} is below the reserve of {} "
						  "bytes, and every slab is already given back or wanted "
						  "back",
						  *avail, reserve);
				warned_empty = true;
				continue;
			}
			mine += w.now + w.wanted;
			next_action = now + settle;
			log->info("--reserve: MemAvailable {} below {}: {} free slabs withdrawn, {} "
				  "granted slabs wanted back ({} withdrawn in all)",
				  *avail, reserve, w.now, w.wanted, pool_.slabs_withdrawn());
		} else if (mine > 0 && *avail > reserve + hysteresis + slab) {
			warned_empty = false;
			const uint64_t room = (*avail - reserve - hysteresis) / slab;
			const uint32_t n = pool_.restore(uint32_t(std::min<uint64_t>(mine, room)));
			if (n == 0)
				continue;
			mine -= n;
			next_action = now + settle;
			log->info("--reserve: MemAvailable {} is well above {}: {} slabs taken back "
				  "({} still withdrawn)",
				  *avail, reserve, n, pool_.slabs_withdrawn());
		} else {
			warned_empty = false;
		}
	}
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
	notify_ready();
	accept_loop();
	reap(true);
	if (reserve_thread_.joinable())
		reserve_thread_.join();
	logger("memserver")->info("stopped");
}

void Memserver::accept_loop()
{
	while (!stop_.load()) {
		pollfd p{listen_fd_.get(), POLLIN, 0};
		const int rc = ::poll(&p, 1, 200);
		reap(false);
		expire_leases();
		if (rc <= 0)
			continue;
		sockaddr_storage ss{};
		socklen_t sl = sizeof ss;
		Fd fd(::accept4(listen_fd_.get(), reinterpret_cast<sockaddr *>(&ss), &sl,
				SOCK_CLOEXEC));
		if (!fd)
			continue;
		std::unique_lock lock(conns_mu_);
		if (conns_.size() >= opts_.max_connections) {
			const size_t n = conns_.size();
			lock.unlock();
			fd.reset(); // closed at once: a flood holds no thread and no memory
			warn_peer(PeerEvent::Limit, "refusing connection from " + peer_name(ss) + ": " +
				  std::to_string(n) + " connections already (--max-connections)");
			continue;
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
		set_io_timeout(fd.get(), std::chrono::duration_cast<std::chrono::milliseconds>(
						 kMessageTimeout));
		auto c = std::make_shared<Conn>(opts_.auth_keys);
		c->fd = std::move(fd);
		c->peer = peer_name(ss);
		Conn &ref = *c;
		conns_.push_back(std::move(c));
		ref.thread = std::thread([this, &ref] {
			prefault_stack();
			serve(ref);
			ref.done.store(true);
		});
	}
}

namespace {

// Reply helpers on the connection's socket. Return false if the peer is gone.
bool send_reply(int fd, const proto::Header &req, uint32_t status,
		std::span<const std::byte> body, const std::byte *payload = nullptr,
		uint32_t payload_len = 0)
{
	std::array<std::byte, proto::kHeaderSize> hdr;
	proto::Header h;
	h.op = req.op;
	h.flags = proto::kFlagResponse;
	h.status = status;
	h.request_id = req.request_id;
	h.body_len = status ? 0 : uint32_t(body.size() + payload_len);
	proto::encode_header(h, hdr);
	iovec iov[3];
	int n = 0;
	iov[n++] = {hdr.data(), hdr.size()};
	if (!status && !body.empty())
		iov[n++] = {const_cast<std::byte *>(body.data()), body.size()};
	if (!status && payload_len)
		iov[n++] = {const_cast<std::byte *>(payload), payload_len};
	return sendv_all(fd, iov, n) == 0;
}

} // namespace

void Memserver::serve(Conn &c)
{
	auto log = logger("memserver");
	const int fd = c.fd.get();
	std::vector<std::byte> scratch(kScratch); // to drain refused WRITE payloads
	uint64_t session = 0;
	bool authed = opts_.insecure;
	const auto handshake_end = c.accepted + opts_.handshake_timeout;
	log->debug("connection from {}", c.peer);

	while (!stop_.load()) {
		// Until HELLO, every byte must arrive before the handshake deadline.
		const bool handshake = session == 0;
		int wait_ms = kPollMs;
		if (handshake) {
			const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
				handshake_end - std::chrono::steady_clock::now());
			if (left.count() <= 0) {
				warn_peer(PeerEvent::Slow, c.peer + ": handshake not finished within " +
					  std::to_string(opts_.handshake_timeout.count()) +
					  " ms; disconnecting");
				break;
			}
			wait_ms = int(std::min<long long>(wait_ms, left.count() + 1));
		}
		pollfd p{fd, POLLIN, 0};
		const int rc = ::poll(&p, 1, wait_ms);
		if (rc == 0)
			continue;
		if (rc < 0 && errno == EINTR)
			continue;
		auto recv_msg = [&](void *buf, size_t len) {
			return handshake ? recv_all_until(fd, buf, len, handshake_end)
					 : recv_all(fd, buf, len);
		};
		std::array<std::byte, proto::kHeaderSize> hdr;
		int err = rc < 0 ? errno : recv_msg(hdr.data(), hdr.size());
		if (err) {
			if (err == ETIMEDOUT)
				warn_peer(PeerEvent::Slow, c.peer + ": handshake not finished in time (slow sender); "
						   "disconnecting");
			else if (err != ECONNRESET)
				warn_peer(PeerEvent::Protocol, c.peer + ": receive failed: " + std::strerror(err));
			break;
		}
		proto::Header h;
		const auto st = proto::decode_header(hdr, h);
		if (!st.ok || h.is_response()) {
			warn_peer(PeerEvent::Protocol, c.peer + ": malformed message (" +
				  (st.ok ? "unexpected response" : st.error) + "); disconnecting");
			break;
		}
		std::array<std::byte, proto::kMaxFixedBody> body;
		const size_t fixed = size_t(proto::request_body_size(h.op));
		if ((err = recv_msg(body.data(), fixed))) {
			warn_peer(PeerEvent::Protocol, c.peer + ": truncated " + proto::op_name(h.op) + " request: " +
				  std::strerror(err));
			break;
		}
		const std::span<const std::byte> b(body.data(), fixed);
		if (!authed && h.op != proto::Op::Auth && h.op != proto::Op::AuthProof) {
			// Nothing (no slab, no rkey, no stats) before the peer proved it has the key.
			warn_peer(PeerEvent::Auth, c.peer + ": " + proto::op_name(h.op) +
				  " before authentication; refused, disconnecting");
			send_reply(fd, h, EACCES, {});
			break;
		}
		bool ok = true;
		// Apply the request only if no reconnect of our client has fenced this connection.
		std::unique_lock busy(c.busy);
		if (c.fenced.load()) {
			log->debug("{}: dropping a request on a fenced connection", c.peer);
			break;
		}
		switch (h.op) {
		case proto::Op::Auth: {
			if (opts_.insecure) {
				ok = send_reply(fd, h, EOPNOTSUPP, {});
				break;
			}
			proto::AuthRequest req;
			proto::AuthReply r;
			if (auto s = proto::decode(b, req); !s.ok) {
				warn_peer(PeerEvent::Protocol, c.peer + ": malformed AUTH (" + s.error + "); disconnecting");
				ok = false;
			} else if (!c.auth.challenge(req.client_nonce, req.key_id, r.server_nonce,
						     r.server_mac)) {
				warn_peer(PeerEvent::Auth, fmt::format("{}: authentication failed: {}; disconnecting",
						      c.peer,
						      authed ? "AUTH after authentication"
							     : fmt::format("unknown key (id {:016x})",
									   req.key_id)));
				send_reply(fd, h, EACCES, {});
				ok = false;
			} else {
				std::array<std::byte, proto::kAuthReplySize> out;
				proto::encode(r, out);
				ok = send_reply(fd, h, 0, out);
			}
			break;
		}
		case proto::Op::AuthProof: {
			if (opts_.insecure) {
				ok = send_reply(fd, h, EOPNOTSUPP, {});
				break;
			}
			proto::AuthProofRequest req;
			if (auto s = proto::decode(b, req); !s.ok) {
				warn_peer(PeerEvent::Protocol, c.peer + ": malformed AUTH_PROOF (" + s.error +
					  "); disconnecting");
				ok = false;
			} else if (authed || !c.auth.verify(req.client_mac)) {
				warn_peer(PeerEvent::Auth, c.peer + ": authentication failed: " +
					  (authed ? "AUTH_PROOF after authentication"
						  : "wrong proof (another key?)") +
					  "; disconnecting");
				send_reply(fd, h, EACCES, {});
				ok = false;
			} else {
				authed = true;
				log->debug("{}: authenticated", c.peer);
				ok = send_reply(fd, h, 0, {});
			}
			break;
		}
		case proto::Op::Hello: {
			proto::HelloRequest req;
			if (auto s = proto::decode(b, req); !s.ok) {
				warn_peer(PeerEvent::Protocol, c.peer + ": malformed HELLO (" + s.error + "); disconnecting");
				ok = false;
				break;
			}
			if (session) {
				ok = send_reply(fd, h, EINVAL, {});
				break;
			}
			if (req.want_rdma && !rdma_) {
				ok = send_reply(fd, h, EPROTONOSUPPORT, {});
				break;
			}
			SessionTable::Creds cr{req.session_id, req.token};
			if (req.session_id == 0) {
				cr = sessions_.create(req.want_rdma, c.auth.attach_key());
				sessions_.set_peer(cr.id, c.peer);
				log->info("{}: new session {:016x}{}", c.peer, cr.id,
					  req.want_rdma ? " (rdma)" : "");
			} else if (!sessions_.join(req.session_id, req.token)) {
				warn_peer(PeerEvent::Auth, c.peer + ": HELLO for an unknown session or with a wrong token");
				ok = send_reply(fd, h, ENOENT, {});
				break;
			}
			session = cr.id;
			c.session.store(session);
			if (req.replaces) {
				busy.unlock(); // fence() may wait for another connection's request
				fence(session, req.replaces);
				busy.lock();
			}
			proto::HelloReply r;
			r.session_id = cr.id;
			r.token = cr.token;
			r.slab_size = pool_.slab_size();
			r.slabs_total = pool_.slabs_total();
			r.slabs_free = pool_.slabs_free();
			r.max_io = proto::kMaxIo;
			r.server_flags = rdma_ ? proto::kServerRdma : 0;
			r.conn_id = c.id;
			std::array<std::byte, proto::kHelloReplySize> out;
			proto::encode(r, out);
			ok = send_reply(fd, h, 0, out);
			break;
		}
		case proto::Op::AllocTagged: // ALLOC that also sets the slab's tag
		case proto::Op::Alloc: {
			if (!session) {
				ok = send_reply(fd, h, EACCES, {});
				break;
			}
			proto::AllocTaggedRequest tag;
			if (h.op == proto::Op::AllocTagged)
				if (auto s = proto::decode(b, tag); !s.ok) {
					warn_peer(PeerEvent::Protocol, c.peer + ": malformed ALLOC_TAGGED (" +
						  s.error + "); disconnecting");
					ok = false;
					break;
				}
			const auto id = pool_.allocate(session);
			if (!id) {
				ok = send_reply(fd, h, ENOSPC, {});
				break;
			}
			if (h.op == proto::Op::AllocTagged)
				pool_.set_tag(*id, session, {tag.chunk, tag.epoch});
			proto::AllocReply r;
			r.slab_id = *id;
			r.length = pool_.slab_size();
			r.slabs_free = pool_.slabs_free();
			if (rdma_ && sessions_.wants_rdma(session)) {
				if (int e = rdma_->expose_slab(session, *id, r.addr, r.rkey)) {
					pool_.release(*id, session);
					log->warn("{}: cannot register slab {} for RDMA: {}", c.peer,
						  *id, std::strerror(e));
					ok = send_reply(fd, h, e, {});
					break;
				}
			}
			log->debug("{}: granted slab {}", c.peer, *id);
			std::array<std::byte, proto::kAllocReplySize> out;
			proto::encode(r, out);
			ok = send_reply(fd, h, 0, out);
			break;
		}
		case proto::Op::Free: {
			proto::FreeRequest req;
			if (auto s = proto::decode(b, req); !s.ok) {
				warn_peer(PeerEvent::Protocol, c.peer + ": malformed FREE (" + s.error + "); disconnecting");
				ok = false;
				break;
			}
			if (!session || !pool_.owns(req.slab_id, session)) {
				ok = send_reply(fd, h, EACCES, {});
				break;
			}
			if (rdma_)
				rdma_->unexpose_slab(session, req.slab_id);
			pool_.release(req.slab_id, session);
			log->debug("{}: freed slab {}", c.peer, req.slab_id);
			ok = send_reply(fd, h, 0, {});
			break;
		}
		case proto::Op::Read:
		case proto::Op::Write: {
			proto::IoRequest req;
			const bool write = h.op == proto::Op::Write;
			auto s = proto::decode(b, req);
			if (s.ok && write && h.body_len - fixed != req.length)
				s = proto::Status::fail("WRITE length does not match its payload");
			if (!s.ok) {
				warn_peer(PeerEvent::Protocol, c.peer + ": malformed " + proto::op_name(h.op) + " (" +
					  s.error + "); disconnecting");
				ok = false;
				break;
			}
			std::byte *mem = pool_.begin_access(req.slab_id, session, req.offset,
							    req.length);
			if (!mem) {
				if (write) { // keep the stream in step: consume the payload
					for (uint32_t left = req.length; left && ok;) {
						const uint32_t n = std::min<uint32_t>(left, kScratch);
						ok = recv_all(fd, scratch.data(), n) == 0;
						left -= n;
					}
				}
				ok = ok && send_reply(fd, h, EACCES, {});
				break;
			}
			if (write) {
				ok = recv_all(fd, mem, req.length) == 0;
				pool_.end_access(req.slab_id);
				ok = ok && send_reply(fd, h, 0, {});
				c.write_ops.fetch_add(1, std::memory_order_relaxed);
				c.write_bytes.fetch_add(req.length, std::memory_order_relaxed);
			} else {
				ok = send_reply(fd, h, 0, {}, mem, req.length);
				pool_.end_access(req.slab_id);
				c.read_ops.fetch_add(1, std::memory_order_relaxed);
				c.read_bytes.fetch_add(req.length, std::memory_order_relaxed);
			}
			break;
		}
		case proto::Op::List: {
			if (!session) {
				ok = send_reply(fd, h, EACCES, {});
				break;
			}
			// Control path: the reply is built in a per-connection buffer.
			const std::vector<uint32_t> ids = pool_.owned_by(session);
			std::vector<std::byte> out(4 + 4 * ids.size());
			proto::encode_list(ids, out);
			ok = send_reply(fd, h, 0, out);
			break;
		}
		case proto::Op::Bind: {
			proto::BindRequest req;
			if (auto s = proto::decode(b, req); !s.ok) {
				warn_peer(PeerEvent::Protocol, c.peer + ": malformed BIND (" + s.error + "); disconnecting");
				ok = false;
				break;
			}
			if (!session) {
				ok = send_reply(fd, h, EACCES, {});
				break;
			}
			const std::string name(req.name.data(), strnlen(req.name.data(), req.name.size()));
			// Scoped to the key the peer proved it holds: another key never matches.
			const std::string scoped = fmt::format("{:016x}/{}", c.auth.key_id(), name);
			const auto r = sessions_.bind(session, scoped, name, req.lease_s);
			if (r.err == EBUSY) {
				log->warn("{}: volume {} refused: session of {} still has live connections "
					  "(never two owners)",
					  c.peer, name, r.other_peer);
				ok = send_reply(fd, h, EBUSY, {});
				break;
			}
			if (r.err) {
				ok = send_reply(fd, h, r.err, {});
				break;
			}
			proto::BindReply rep;
			if (r.took_over) {
				rep.reattached = 1;
				rep.slabs = pool_.reassign(r.took_over, session);
				rep.detached_ms = uint64_t(r.detached_for.count());
				log->info("{}: volume {} reattached: session {:016x} took over {} slabs "
					  "of session {:016x} (detached {} ms)",
					  c.peer, name, session, rep.slabs, r.took_over, rep.detached_ms);
			} else {
				log->info("{}: session {:016x} bound to volume {} (lease {} s)", c.peer,
					  session, name, req.lease_s);
			}
			std::array<std::byte, proto::kBindReplySize> out;
			proto::encode(rep, out);
			ok = send_reply(fd, h, 0, out);
			break;
		}
		case proto::Op::SetTag: {
			proto::SetTagRequest req;
			if (auto s = proto::decode(b, req); !s.ok) {
				warn_peer(PeerEvent::Protocol, c.peer + ": malformed SET_TAG (" + s.error + "); disconnecting");
				ok = false;
				break;
			}
			int status = 0;
			if (!session)
				status = EACCES;
			else if (req.slab_id == proto::kNoSlab)
				status = sessions_.set_floor(session, req.chunk, req.epoch);
			else if (!pool_.set_tag(req.slab_id, session, {req.chunk, req.epoch}))
				status = EACCES;
			ok = send_reply(fd, h, uint32_t(status), {});
			break;
		}
		case proto::Op::VolumeList: {
			proto::VolumeListRequest req;
			if (auto s = proto::decode(b, req); !s.ok) {
				warn_peer(PeerEvent::Protocol, c.peer + ": malformed VOLUME_LIST (" + s.error + "); disconnecting");
				ok = false;
				break;
			}
			std::vector<std::byte> out; // control path
			const int status = volume_list(session, req, out);
			ok = send_reply(fd, h, uint32_t(status), out);
			break;
		}
		case proto::Op::GiveBack: {
			proto::GiveBackRequest req;
			if (auto s = proto::decode(b, req); !s.ok) {
				warn_peer(PeerEvent::Protocol, c.peer + ": malformed GIVEBACK (" + s.error + "); disconnecting");
				ok = false;
				break;
			}
			log->info("{}: asked to give back {} bytes", c.peer, req.bytes);
			std::array<std::byte, proto::kGiveBackReplySize> out;
			proto::encode(give_back(req.bytes), out);
			ok = send_reply(fd, h, 0, out);
			break;
		}
		case proto::Op::GiveBackStatus: {
			std::array<std::byte, proto::kGiveBackReplySize> out;
			proto::encode(give_back_status(), out);
			ok = send_reply(fd, h, 0, out);
			break;
		}
		case proto::Op::Wanted: {
			if (!session) {
				ok = send_reply(fd, h, EACCES, {});
				break;
			}
			// Control path (every client polls it twice a second): when nothing is wanted
			// back, as in steady state, it allocates nothing (tests/alloc counts the whole
			// memserver).
			std::vector<uint32_t> ids = pool_.wanted_by(session);
			if (ids.empty()) {
				std::array<std::byte, 4> none{};
				proto::encode_list({}, none);
				ok = send_reply(fd, h, 0, none);
				break;
			}
			if (ids.size() > proto::kMaxListIds)
				ids.resize(proto::kMaxListIds);
			std::vector<std::byte> out(4 + 4 * ids.size());
			proto::encode_list(ids, out);
			ok = send_reply(fd, h, 0, out);
			break;
		}
		case proto::Op::Stats: {
			const proto::StatsReply r = stats();
			std::array<std::byte, proto::kStatsReplySize> out;
			proto::encode(r, out);
			ok = send_reply(fd, h, 0, out);
			break;
		}
		}
		if (!ok)
			break;
	}
	log->debug("{}: connection closed", c.peer);
	if (session)
		leave_session(session);
}

} // namespace rdmaswap
