// SPDX-License-Identifier: MIT
// The memserver: slab pool + sessions + TCP control/data service (+ the RDMA service when
// enabled). One thread accepts and hands each TCP connection to one of a few event loops
// (--threads); a loop serves its connections as non-blocking state machines, and a small
// worker pool does the blocking work (registration, session transitions; handshakes in a lane
// of their own), so the thread count does not grow with the connections and a slow or hostile
// client holds only its own connection. Released slabs are zeroed by the pool's scrubber
// thread, never by a worker. A connection must authenticate (AUTH, AUTH_PROOF) before any other request,
// and finish the handshake (through HELLO) within a time bound; a message that has started
// must arrive whole, and a reply be taken whole, within --message-timeout.
// docs/architecture.md ("Concurrency model: memserver") has the threads and the lock order.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/net/socket.h"
#include "common/obs/guarded_main.h"
#include "common/obs/log.h"
#include "common/util/config.h"
#include "common/util/counters.h"
#include "common/wire/auth.h"
#include "common/wire/protocol.h"
#include "memserver/peers.h"
#include "memserver/quota.h"
#include "memserver/sessions.h"
#include "memserver/slab_pool.h"
#include "memserver/workers.h"

namespace rdmaswap {

class RdmaService;
class MetricsServer;
class SigningKey; // common/wire/donor_cert.h

struct MemserverOptions {
	std::string listen = "0.0.0.0";
	uint16_t port = kDefaultPort;         // 0: pick a free port (tests)
	uint64_t capacity = uint64_t(1) << 30;
	uint64_t slab_size = uint64_t(256) << 20;
	TransportKind transport = TransportKind::Auto;
	// TCP connections and RDMA QPs open at once; one more is closed (TCP) or rejected (RDMA).
	unsigned max_connections = 1024;
	// --threads: event loops serving the TCP connections (0: one per CPU, at most 16). More
	// loops than CPUs answer sooner where clients share the CPUs; fewer cost the clients
	// fewer wake-ups (docs/performance.md, "Issue 28": 8 is the compromise measured).
	unsigned threads = 8;
	// --workers: threads for the blocking requests (ALLOC, FREE, HELLO, BIND, lists, ...);
	// one more takes handshakes only (WorkerPool::Lane).
	unsigned workers = 4;
	bool lock_memory = true;
	// One key, or two during a key rotation. Empty only with `insecure` (no authentication).
	std::vector<std::shared_ptr<const AuthKey>> auth_keys;
	// --admin-key: a connection that authenticates with one of these (instead of a cluster
	// key) may also use the admin ops (GIVEBACK, LEND, every session in VOLUME_LIST). One
	// key, or two during a rotation; none: no admin ops over the network. With `insecure`
	// there is no authentication and every peer may use them.
	std::vector<std::shared_ptr<const AuthKey>> admin_keys;
	bool insecure = false;
	// --donor-key, --donor-cert (docs/security.md, "Roles"): this donor's signing key and
	// its certificate (donor_cert.h's encoding), proved to plugins in DONOR_PROOF. Null and
	// empty: DONOR_PROOF is answered ENOENT (plugins with donor-ca= refuse this memserver).
	std::shared_ptr<const SigningKey> donor_key;
	std::vector<std::byte> donor_cert;
	// From accept to a finished HELLO (AUTH + AUTH_PROOF + HELLO); slower peers are dropped.
	std::chrono::milliseconds handshake_timeout{5000};
	// A message whose first byte has arrived must arrive whole (header, body, payload) within
	// this time, and a reply must be taken whole within it; slower peers are dropped. An idle
	// connection (no message started) may wait as long as it likes.
	std::chrono::milliseconds message_timeout{10000};
	// --reserve: keep at least this many bytes of MemAvailable on the host by withdrawing
	// slabs (0: off). Read from `meminfo` every `reserve_interval`.
	uint64_t reserve = 0;
	std::string meminfo = "/proc/meminfo"; // test hook: RDMASWAP_MEMINFO
	std::chrono::milliseconds reserve_interval{1000};
	// Limits on every peer (docs/security.md, "Limits"). --max-lease: a BIND with a longer
	// lease is refused (ERANGE).
	uint32_t max_lease_s = 86400;
	// --max-floors: epoch floors per session; one more is refused (SET_TAG: ENOSPC).
	size_t max_floors = SessionTable::kDefaultMaxFloors;
	// --max-peer-sessions: sessions (live or detached) created from one address; a HELLO
	// that would create one more is refused (EUSERS).
	unsigned max_peer_sessions = 64;
	// Quotas per identity (memserver/quota.h): the slabs one owner (a volume key; an
	// unbound session's address) may hold: --max-owner-share percent of the slabs (default
	// 100: none; docs/deployment.md says when to set it) and at most --max-owner-slabs (0: no such bound);
	// an ALLOC beyond is refused (ENOSPC). --max-peer-owners: distinct volume keys one
	// address may bind within the last max(--max-lease, 1 h); one more BIND is refused
	// (EUSERS).
	unsigned max_owner_share = 100;
	uint32_t max_owner_slabs = 0;
	unsigned max_peer_owners = 0; // 0: no bound (main: 16 by default when a quota is set)
	// --connect-rate: new connections per second from one address (a token bucket with a
	// burst of twice that; 0: no limit); --max-peer-connections: connections open at once
	// from one address (never more than max_connections). Over either, the accept loop
	// closes the connection at once and counts it.
	// Sized for 16 volumes of one address at the plugin's defaults (19 connections each).
	unsigned connect_rate = 150;
	unsigned max_peer_connections = 384;
	// Test hook (RDMASWAP_TEST_LIFECYCLE_PAUSE_MS): sleep this long inside the detach of a
	// session (after the decision, before its RDMA state is dropped) and inside a takeover
	// (between the bind and the move of the slabs), logging "lifecycle pause" first, so that a
	// test can try to interleave another transition there. 0: off.
	std::chrono::milliseconds test_lifecycle_pause{0};
	// --metrics-listen ADDR:PORT: serve GET /metrics (Prometheus text format) there, on a
	// thread of its own (memserver/metrics_http.h). Empty: off.
	std::string metrics_listen;
};

// What the memserver counts, read without any lock (Memserver::snapshot()): STATS and the
// metrics endpoint report it. Each value is exact when read; they may come from different
// moments.
struct MemserverSnapshot {
	uint64_t capacity = 0, slab_size = 0;
	SlabPool::Counts slabs;
	SessionTable::Counts sessions;
	uint32_t connections = 0; // TCP connections open
	uint32_t rdma_qps = 0;
	bool rdma = false;        // the RDMA service runs
	uint64_t accepted = 0;    // TCP connections admitted
	// TCP connections closed at once by the accept loop, by PeerTable::Verdict (Ok unused).
	std::array<uint64_t, PeerTable::kVerdicts> refused{};
	// Memserver::warn_peer calls, by PeerEvent (before rate-limiting: every event).
	std::array<uint64_t, 4> peer_events{};
	// TCP READ/WRITE requests served and their bytes; refused: answered EACCES (the slab
	// not the session's, or the range outside it).
	uint64_t tcp_read_ops = 0, tcp_read_bytes = 0, tcp_write_ops = 0, tcp_write_bytes = 0;
	uint64_t tcp_refused = 0;
};

// MemAvailable in bytes from a /proc/meminfo-format file; nullopt if absent or unreadable.
std::optional<uint64_t> read_mem_available(const std::string &path);

class Memserver {
public:
	// Allocates and locks the pool, binds the TCP port and (rdma/auto) the RDMA listener.
	// Throws std::runtime_error with a message for the operator.
	explicit Memserver(const MemserverOptions &opts);
	~Memserver();

	// Serve until stop() (or a signal handler setting the flag). Returns when all connection
	// threads have ended. If it stopped because a thread failed (thread_failed), it throws
	// std::runtime_error naming that thread once everything has stopped, so that the process
	// exits with a non-zero status.
	void run();
	void stop() { stop_.store(true); }

	// Exception boundaries (docs/architecture.md, "Exception boundaries"): every thread of
	// the memserver runs its body through guarded_thread (common/obs/guarded_main.h).
	// A thread whose loss leaves the memserver unable to serve (an event loop, the accept
	// loop, the RDMA event thread) failed: stop as stop() does (a clean shutdown: the
	// connections are closed, the workers finish, the registration is removed), and make
	// run() throw at the end. The first such thread is the one run() names. Any thread.
	void thread_failed(const char *thread) noexcept;
	// What such a thread's boundary says it leads to, and its `failed` callback:
	// thread_failed(thread), then the thread ends. `thread` must outlive the thread (a
	// string literal, or a member of the thread's owner).
	static constexpr const char *kStops = "the memserver stops (exit status 1)";
	auto stop_on_failure(const char *thread) noexcept
	{
		return [this, thread](const char *) noexcept {
			thread_failed(thread);
			return AfterFailure::End;
		};
	}
	// The `failed` callback of a thread that carries on (the lease and reserve threads):
	// waits up to `pause` or until stop, then the body runs again (unless stopping).
	AfterFailure again_after(std::chrono::milliseconds pause) noexcept;

	uint16_t port() const { return port_; }
	// The event loops run() starts (--threads, or the CPU count).
	unsigned loop_threads() const;
	// False when TCP connections and RDMA QPs together are at --max-connections: the RDMA
	// service rejects a new QP then.
	bool room_for_connection() const;
	bool rdma_enabled() const { return rdma_ != nullptr; }
	// Takes no lock (it may be called from any thread, e.g. the metrics endpoint's).
	MemserverSnapshot snapshot() const;
	// The pool's shape, its free slabs and the client sessions, for the etcd registry. Take
	// no lock (the counts as SlabPool and SessionTable last published them).
	uint64_t slab_size() const { return pool_.slab_size(); }
	uint32_t slabs_total() const { return pool_.slabs_total(); }
	uint32_t slabs_free() const { return pool_.counts().free; }
	uint32_t sessions() const { return sessions_.counts().sessions; }
	proto::StatsReply stats() const;
	// snapshot() in the Prometheus text format (rdmaswap_memserver_* families;
	// docs/metrics.md). Takes no lock; allocates.
	std::string metrics_text() const;
	// Withdraw `bytes` (rounded up to slabs) of capacity: free slabs at once, granted ones
	// are wanted back from their owners (GIVEBACK; also used by --reserve).
	proto::GiveBackReply give_back(uint64_t bytes);
	proto::GiveBackReply give_back_status() const;
	// Re-offer up to `bytes` (rounded up to slabs) of withdrawn capacity: pending moves are
	// cancelled first, then withdrawn slabs are put back in the pool (LEND).
	proto::GiveBackReply lend(uint64_t bytes);

	// Session transitions (memserver/lifecycle.cpp). Each one is made under the lifecycle
	// mutex, so that none interleaves with another: a session is joined, detached, ended or
	// taken over in one step.
	// Called by the TCP and RDMA services when a connection of `session` ends. The last one
	// detaches the session (its RDMA state is dropped, its slabs kept for its lease) or ends
	// it (RDMA state dropped, then its slabs freed: by then it can no longer be joined).
	void leave_session(uint64_t session);
	// Free the slabs of detached sessions whose lease ended (called by the lease thread every
	// 200 ms).
	void expire_leases();
	// The lifecycle mutex, for the RDMA service: held across a QP's join of a session and the
	// creation of the session's PD. Lock order: lifecycle mutex, then RdmaService's, then
	// SessionTable's, then SlabPool's. Never taken on the READ/WRITE path.
	[[nodiscard]] std::unique_lock<std::mutex> lifecycle_lock()
	{
		return std::unique_lock(lifecycle_mu_);
	}
	// What a peer did wrong. Each kind is rate-limited on its own, so that a flood of one
	// kind cannot hide another.
	enum class PeerEvent { Auth, Limit, Slow, Protocol };
	// Log a warning about something a peer did wrong, rate-limited per kind.
	void warn_peer(PeerEvent kind, const std::string &what);
	// Log an info line about a session of a client at `peer` (new, bound, detached, ended,
	// reattached, expired), rate-limited per address (PeerTable::log_allowed); unlimited if
	// the address is not known.
	template <class... Args>
	void session_info(const std::optional<PeerAddr> &peer, fmt::format_string<Args...> f,
			  Args &&...args)
	{
		uint64_t suppressed = 0;
		if (peer && !peers_.log_allowed(*peer, suppressed))
			return;
		if (suppressed)
			logger("memserver")->info("{} ({} more session messages about clients at {} "
						  "suppressed before)",
						  fmt::format(f, std::forward<Args>(args)...),
						  suppressed, peer->str());
		else
			logger("memserver")->info(f, std::forward<Args>(args)...);
	}

private:
	struct Conn;            // one TCP connection (memserver/conn.h)
	struct Request;         // one control request being applied (memserver/conn.h)
	enum class Next : uint8_t; // what serving a request leads to (memserver/conn.h)
	struct Handlers;        // the per-op handlers (memserver/conn.h, handlers.cpp)
	class Loop;             // one event loop (memserver/conn.h, loop.cpp)
	void accept_loop();
	// Accept one connection and admit it (to the least loaded event loop) or close it at
	// once. False when there was none to accept.
	bool accept_one();
	// A loop closed `c`: its peer's count drops, and its session is left (on a worker).
	void connection_closed(const std::shared_ptr<Conn> &c);
	// The accept loop's periodic work (every 200 ms): reap ended connections, report the
	// connections refused since the last report (per kind, at most every 5 s), forget idle
	// peers.
	void accept_housekeeping(std::chrono::steady_clock::time_point now);
	// Lease expiry, and memory handed back to the system after large frees (malloc_trim),
	// every 200 ms until stop.
	void lease_loop();
	// HELLO with a session id: join it if the token matches. False: no such session (or it
	// ended), or a wrong token.
	bool join_session(uint64_t id, uint64_t token);
	struct Bound {
		SessionTable::BindResult bind;
		uint32_t slabs = 0; // slabs taken over with a detached session
	};
	// BIND: bind `session` to a volume and take over a detached session of the same volume
	// with its slabs, in one step.
	Bound bind_volume(uint64_t session, const std::string &scoped, const std::string &name,
			  uint32_t lease_s);
	// The test hook of MemserverOptions::test_lifecycle_pause (under the lifecycle mutex).
	void lifecycle_pause(const char *step, uint64_t session);
	// Drop closed connections from conns_.
	void reap();
	// Stop everything (the destructor; the constructor when it fails after starting threads).
	void shutdown();
	// Stop connection `id` of `session` from applying any further request, waiting for the
	// one it may be applying now. No-op if there is no such connection.
	void fence(uint64_t session, uint64_t id);
	// --reserve: withdraw slabs while MemAvailable is below the reserve; take back those it
	// withdrew once MemAvailable is well above it again.
	void reserve_loop();

	const MemserverOptions opts_;
	// The cluster keys, then the admin keys: what a connection's AUTH may name.
	std::vector<std::shared_ptr<const AuthKey>> keys_;
	SlabPool pool_;
	SessionTable sessions_;
	PeerTable peers_;
	OwnerWindow owner_window_; // --max-peer-owners
	// Held across each multi-step session transition (join, leave, bind + takeover, lease
	// expiry), never on the data path. Lock order in lifecycle_lock().
	std::mutex lifecycle_mu_;
	Fd listen_fd_;
	uint16_t port_ = 0;
	std::unique_ptr<RdmaService> rdma_;
	std::atomic<bool> stop_{false};
	// thread_failed(): the first failed thread's name (set before failed_), for run().
	std::atomic_flag failing_ = ATOMIC_FLAG_INIT;
	std::array<char, 64> failed_thread_{};
	std::atomic<bool> failed_{false};
	// Test hooks (RDMASWAP_TEST_THROW, comma-separated, read by the constructor; unset in
	// production): "loop" makes the first hand-over to an event loop (a new connection)
	// throw in that loop's thread, "lease" the first three runs of the lease thread's body.
	std::atomic<bool> test_throw_loop_{false};
	std::atomic<int> test_throw_lease_{0};
	// The workers (made before the RDMA service, which hands them connect requests; ended
	// after the loops and the RDMA event thread) and the loops (made by run()).
	std::unique_ptr<WorkerPool> workers_;
	std::vector<std::unique_ptr<Loop>> loops_;
	std::atomic<unsigned> tcp_open_{0}; // TCP connections admitted and not yet closed
	// The READ/WRITE counters of one event loop: written by that loop only, read relaxed by
	// snapshot(). One per loop (loop_threads()), made by the constructor.
	struct alignas(64) LoopCounters {
		SoloCounter read_ops, read_bytes, write_ops, write_bytes, refused;
	};
	std::unique_ptr<LoopCounters[]> loop_counters_;
	// The accept loop's: connections admitted, and refused by verdict.
	SoloCounter accepted_;
	std::array<SoloCounter, PeerTable::kVerdicts> refused_;
	// warn_peer() calls by kind (any thread).
	std::array<std::atomic<uint64_t>, 4> peer_events_{};
	std::thread reserve_thread_;
	std::thread lease_thread_;
	// Accept loop only: when each kind of refusal was last reported, and the next sweep.
	std::array<std::chrono::steady_clock::time_point, PeerTable::kVerdicts> drop_reported_{};
	std::chrono::steady_clock::time_point next_sweep_{};
	// Lease thread only: floors and sessions freed since the last malloc_trim.
	uint64_t freed_since_trim_ = 0;
	std::array<LogLimiter, 4> peer_log_{{{10, std::chrono::seconds(10)},
					     {10, std::chrono::seconds(10)},
					     {10, std::chrono::seconds(10)},
					     {10, std::chrono::seconds(10)}}};

	mutable std::mutex conns_mu_;
	std::list<std::shared_ptr<Conn>> conns_;
	// --metrics-listen (null: off). Started last by the constructor, stopped first by the
	// destructor: it reads the members above.
	std::unique_ptr<MetricsServer> metrics_;
};

// Tell systemd (Type=notify) that we are ready, if NOTIFY_SOCKET is set. No-op otherwise.
void notify_ready();

} // namespace rdmaswap
