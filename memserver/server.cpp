// SPDX-License-Identifier: MIT
// Memserver: start, accept loop (connections handed to the event loops, memserver/loop.cpp),
// stats, fencing, and the end of connections.
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

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/obs/log.h"
#include "common/util/err_text.h"
#include "common/util/swap_safety.h"
#include "memserver/conn.h"
#include "memserver/metrics_http.h"
#include "memserver/rdma_service.h"

namespace rdmaswap {

namespace {
// The accept loop's housekeeping period, and how many connections it accepts between two
// looks at the clock.
constexpr auto kTick = std::chrono::milliseconds(200);
constexpr int kAcceptBatch = 64;
// Refusals of one kind are reported at most this often; idle peers are forgotten this often.
constexpr auto kDropReport = std::chrono::seconds(5);
constexpr auto kPeerSweep = std::chrono::seconds(10);
// A thread that carries on after a failure starts again after this pause.
constexpr auto kRestartPause = std::chrono::milliseconds(1000);
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
	  sessions_(opts.max_floors), peers_(peer_limits(opts)),
	  owner_window_(opts.max_peer_owners,
			std::max(std::chrono::seconds(opts.max_lease_s), std::chrono::seconds(3600)))
{
	pool_.set_owner_limit(
		owner_slab_limit(pool_.slabs_total(), opts.max_owner_slabs, opts.max_owner_share));
	auto log = logger("memserver");
	if (const char *v = getenv("RDMASWAP_TEST_THROW"); v && *v) {
		const std::string hooks = std::string(",") + v + ",";
		test_throw_loop_ = hooks.find(",loop,") != std::string::npos;
		test_throw_lease_ = hooks.find(",lease,") != std::string::npos ? 3 : 0;
	}
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
		throw std::runtime_error("cannot listen on " + ep.str() + ": " + err_text(err));
	}
	freeaddrinfo(res);
	sockaddr_storage ss{};
	socklen_t sl = sizeof ss;
	getsockname(fd.get(), reinterpret_cast<sockaddr *>(&ss), &sl);
	port_ = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in *>(&ss)->sin_port
					      : reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port);
	listen_fd_ = std::move(fd);

	// Before the RDMA service, which hands its connect requests to the workers.
	workers_ = std::make_unique<WorkerPool>(std::max(1u, opts_.workers));
	if (opts_.transport == TransportKind::Rdma ||
	    (opts_.transport == TransportKind::Auto && RdmaService::devices_present())) {
		try {
			rdma_ = std::make_unique<RdmaService>(opts_.listen, port_, pool_, sessions_,
							      *this, *workers_, !opts_.insecure);
		} catch (const std::exception &e) {
			if (opts_.transport == TransportKind::Rdma)
				throw;
			log->warn("RDMA not available ({}); serving TCP only", e.what());
		}
	} else if (opts_.transport == TransportKind::Auto) {
		log->info("no RDMA device found; serving TCP only");
	}
	loop_counters_ = std::make_unique<LoopCounters[]>(loop_threads());
	log->info("listening on {}:{} ({}), capacity {} bytes in {} slabs of {} bytes, memory {}, "
		  "{}",
		  opts_.listen, port_, rdma_ ? "tcp+rdma" : "tcp", pool_.capacity(),
		  pool_.slabs_total(), pool_.slab_size(), opts_.lock_memory ? "locked" : "not locked",
		  opts_.insecure ? "NO authentication"
				 : fmt::format("{} auth key(s), {} admin key(s)",
					       opts_.auth_keys.size(), opts_.admin_keys.size()));
	// Last: its thread reads what is made above.
	if (!opts_.metrics_listen.empty()) {
		const auto at = parse_listen_addr(opts_.metrics_listen);
		try {
			if (!at)
				throw std::runtime_error("--metrics-listen '" + opts_.metrics_listen +
							 "' is not ADDR:PORT (examples: "
							 "127.0.0.1:9471, [::1]:9471)");
			metrics_ = std::make_unique<MetricsServer>(*at,
								   [this] { return metrics_text(); });
		} catch (...) {
			shutdown(); // no destructor runs for a constructor that throws
			throw;
		}
	}
}

Memserver::~Memserver()
{
	shutdown();
}

void Memserver::shutdown()
{
	metrics_.reset(); // it reads the rest
	stop_.store(true);
	loops_.clear();
	if (rdma_)
		rdma_->stop_events(); // no more work for the workers
	workers_.reset();
	reap();
	rdma_.reset();
	// (run() joins them; not if it left early by an exception: a joinable thread's
	// destructor would call std::terminate.)
	if (reserve_thread_.joinable())
		reserve_thread_.join();
	if (lease_thread_.joinable())
		lease_thread_.join();
}

void Memserver::thread_failed(const char *thread) noexcept
{
	if (!failing_.test_and_set()) {
		std::snprintf(failed_thread_.data(), failed_thread_.size(), "%s", thread);
		failed_.store(true, std::memory_order_release);
	}
	stop_.store(true);
}

AfterFailure Memserver::again_after(std::chrono::milliseconds pause) noexcept
{
	for (auto end = Clock::now() + pause; !stop_.load() && Clock::now() < end;)
		std::this_thread::sleep_for(std::chrono::milliseconds(50));
	return stop_.load() ? AfterFailure::End : AfterFailure::Again;
}

unsigned Memserver::loop_threads() const
{
	if (opts_.threads)
		return opts_.threads;
	const unsigned cpus = std::thread::hardware_concurrency();
	return std::clamp(cpus, 1u, 16u);
}

bool Memserver::room_for_connection() const
{
	const unsigned qps = rdma_ ? rdma_->qps() : 0;
	return tcp_open_.load() + qps < opts_.max_connections;
}

MemserverSnapshot Memserver::snapshot() const
{
	MemserverSnapshot r;
	r.capacity = pool_.capacity();
	r.slab_size = pool_.slab_size();
	r.slabs = pool_.counts();
	r.sessions = sessions_.counts();
	r.connections = tcp_open_.load(std::memory_order_relaxed);
	r.rdma = rdma_ != nullptr;
	r.rdma_qps = rdma_ ? rdma_->qps() : 0;
	r.accepted = accepted_.get();
	for (size_t i = 0; i < r.refused.size(); i++)
		r.refused[i] = refused_[i].get();
	for (size_t i = 0; i < r.peer_events.size(); i++)
		r.peer_events[i] = peer_events_[i].load(std::memory_order_relaxed);
	for (unsigned i = 0; i < loop_threads(); i++) {
		const LoopCounters &l = loop_counters_[i];
		r.tcp_read_ops += l.read_ops.get();
		r.tcp_read_bytes += l.read_bytes.get();
		r.tcp_write_ops += l.write_ops.get();
		r.tcp_write_bytes += l.write_bytes.get();
		r.tcp_refused += l.refused.get();
	}
	return r;
}

proto::StatsReply Memserver::stats() const
{
	const MemserverSnapshot s = snapshot();
	proto::StatsReply r;
	r.capacity = s.capacity;
	r.slab_size = s.slab_size;
	r.slabs_total = s.slabs.total;
	r.slabs_free = s.slabs.free;
	r.sessions = s.sessions.sessions;
	r.rdma_sessions = s.sessions.rdma;
	r.rdma_qps = s.rdma_qps;
	r.tcp_read_ops = s.tcp_read_ops;
	r.tcp_read_bytes = s.tcp_read_bytes;
	r.tcp_write_ops = s.tcp_write_ops;
	r.tcp_write_bytes = s.tcp_write_bytes;
	r.connections = s.connections;
	return r;
}

void Memserver::warn_peer(PeerEvent kind, const std::string &what)
{
	peer_events_[size_t(kind)].fetch_add(1, std::memory_order_relaxed);
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
	{
		// Let a request it is applying finish (a WRITE's payload lands under `busy` and
		// checks the flag first): from here on nothing of it reaches a slab.
		std::lock_guard wait(old->busy);
	}
	old->loop->wake(old); // its loop closes it
	logger("memserver")->info("connection {:016x} ({}) replaced by a reconnect of its client "
				  "(fenced)",
				  id, old->peer);
}

void Memserver::reap()
{
	std::lock_guard lock(conns_mu_);
	for (auto it = conns_.begin(); it != conns_.end();) {
		const Conn &c = **it;
		if (!c.done.load()) {
			++it;
			continue;
		}
		it = conns_.erase(it);
	}
}

void Memserver::connection_closed(const std::shared_ptr<Conn> &c)
{
	peers_.closed(c->addr);
	tcp_open_.fetch_sub(1);
	if (const uint64_t session = c->session.load())
		workers_->submit([this, session] { leave_session(session); });
	c->done.store(true);
}

void Memserver::run()
{
	const unsigned n = loop_threads();
	for (unsigned i = 0; i < n; i++)
		loops_.push_back(std::make_unique<Loop>(*this, i));
	// The lease and reserve threads carry on after a failure (a second later): the memserver
	// serves without them meanwhile.
	if (opts_.reserve)
		reserve_thread_ = std::thread([this] {
			guarded_thread("memserver", "the reserve thread", "it starts again in 1 s",
				       [this] { reserve_loop(); },
				       [this](const char *) { return again_after(kRestartPause); });
		});
	lease_thread_ = std::thread([this] {
		guarded_thread(
			"memserver", "the lease thread",
			"it starts again in 1 s (detached sessions expire only while it runs)",
			[this] {
				if (test_throw_lease_.load() > 0 && test_throw_lease_.fetch_sub(1) > 0)
					throw std::runtime_error("test fault (RDMASWAP_TEST_THROW=lease)");
				lease_loop();
			},
			[this](const char *) { return again_after(kRestartPause); });
	});
	logger("memserver")->info("serving TCP with {} event loop(s) and {} worker(s) (+1 for "
				  "handshakes only)",
				  n, workers_->threads());
	notify_ready();
	guarded_thread("memserver", "the accept loop", kStops, [this] { accept_loop(); },
		       stop_on_failure("the accept loop"));
	// Every loop closes its connections; then the workers finish what they were given
	// (sessions left by those connections), and only then do the loops go.
	for (auto &l : loops_)
		l->join();
	if (rdma_)
		rdma_->stop_events(); // no more connect requests for the workers
	workers_.reset();
	loops_.clear();
	reap();
	if (reserve_thread_.joinable())
		reserve_thread_.join();
	lease_thread_.join();
	if (failed_.load(std::memory_order_acquire))
		throw std::runtime_error(fmt::format("stopped because {} failed (see the error "
						     "above)",
						     failed_thread_.data()));
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
	// Both the listening socket and the accepted one are non-blocking: a loop never waits
	// on a connection.
	Fd fd(::accept4(listen_fd_.get(), reinterpret_cast<sockaddr *>(&ss), &sl,
			SOCK_CLOEXEC | SOCK_NONBLOCK));
	if (!fd) {
		const int err = errno;
		if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
			warn_peer(PeerEvent::Limit, std::string("cannot accept connections: ") +
				  err_text(err));
			std::this_thread::sleep_for(std::chrono::milliseconds(10)); // not a spin
			return false;
		}
		return err != EAGAIN && err != EWOULDBLOCK;
	}
	// Per dropped connection: no allocation, no log line (a refusal is counted, and
	// accept_housekeeping reports the counts), one lookup in the peer table.
	const PeerAddr addr = PeerAddr::from(ss);
	// --max-connections counts RDMA QPs too.
	const bool full = !room_for_connection();
	if (const auto v = peers_.admit(addr, Clock::now(), full); v != PeerTable::Verdict::Ok) {
		refused_[size_t(v)].add();
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
	accepted_.add();
	auto c = std::make_shared<Conn>(keys_);
	c->fd = std::move(fd);
	c->peer = peer_name(ss);
	c->addr = addr;
	tcp_open_.fetch_add(1);
	{
		std::lock_guard lock(conns_mu_);
		conns_.push_back(c);
	}
	Loop *loop = loops_.front().get();
	for (auto &l : loops_)
		if (l->load() < loop->load())
			loop = l.get();
	loop->adopt(std::move(c));
	return true;
}

void Memserver::accept_housekeeping(Clock::time_point now)
{
	reap();
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

} // namespace rdmaswap
