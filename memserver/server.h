// SPDX-License-Identifier: MIT
// The memserver: slab pool + sessions + TCP control/data service (+ the RDMA service when
// enabled). One thread accepts; each TCP connection is served by its own thread, so a slow or
// hostile client holds only its own thread. A connection must authenticate (AUTH, AUTH_PROOF)
// before any other request, and finish the handshake (through HELLO) within a time bound.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <vector>

#include "common/auth.h"
#include "common/config.h"
#include "common/log.h"
#include "common/protocol.h"
#include "common/tcp/socket.h"
#include "memserver/sessions.h"
#include "memserver/slab_pool.h"

namespace rdmaswap {

class RdmaService;

struct MemserverOptions {
	std::string listen = "0.0.0.0";
	uint16_t port = kDefaultPort;         // 0: pick a free port (tests)
	uint64_t capacity = uint64_t(1) << 30;
	uint64_t slab_size = uint64_t(256) << 20;
	TransportKind transport = TransportKind::Auto;
	unsigned max_connections = 256;
	bool lock_memory = true;
	// One key, or two during a key rotation. Empty only with `insecure` (no authentication).
	std::vector<std::shared_ptr<const AuthKey>> auth_keys;
	bool insecure = false;
	// From accept to a finished HELLO (AUTH + AUTH_PROOF + HELLO); slower peers are dropped.
	std::chrono::milliseconds handshake_timeout{5000};
	// --reserve: keep at least this many bytes of MemAvailable on the host by withdrawing
	// slabs (0: off). Read from `meminfo` every `reserve_interval`.
	uint64_t reserve = 0;
	std::string meminfo = "/proc/meminfo"; // test hook: RDMASWAP_MEMINFO
	std::chrono::milliseconds reserve_interval{1000};
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
	// threads have ended.
	void run();
	void stop() { stop_.store(true); }

	uint16_t port() const { return port_; }
	bool rdma_enabled() const { return rdma_ != nullptr; }
	proto::StatsReply stats() const;
	// Withdraw `bytes` (rounded up to slabs) of capacity: free slabs at once, granted ones
	// are wanted back from their owners (GIVEBACK; also used by --reserve).
	proto::GiveBackReply give_back(uint64_t bytes);
	proto::GiveBackReply give_back_status() const;

	// Called by the TCP and RDMA services when a connection of `session` ends.
	void leave_session(uint64_t session);
	// Free the slabs of detached sessions whose lease ended (called by the accept loop).
	void expire_leases();
	// What a peer did wrong. Each kind is rate-limited on its own, so that a flood of one
	// kind cannot hide another.
	enum class PeerEvent { Auth, Limit, Slow, Protocol };
	// Log a warning about something a peer did wrong, rate-limited per kind.
	void warn_peer(PeerEvent kind, const std::string &what);

private:
	struct Conn;
	void accept_loop();
	void serve(Conn &c);
	void reap(bool all);
	// Stop connection `id` of `session` from applying any further request, waiting for the
	// one it may be applying now. No-op if there is no such connection.
	void fence(uint64_t session, uint64_t id);
	// The VOLUME_LIST reply for `req` (control path: allocates). 0 or an errno.
	int volume_list(uint64_t session, const proto::VolumeListRequest &req,
			std::vector<std::byte> &out);
	// --reserve: withdraw slabs while MemAvailable is below the reserve; take back those it
	// withdrew once MemAvailable is well above it again.
	void reserve_loop();

	const MemserverOptions opts_;
	SlabPool pool_;
	SessionTable sessions_;
	Fd listen_fd_;
	uint16_t port_ = 0;
	std::unique_ptr<RdmaService> rdma_;
	std::atomic<bool> stop_{false};
	std::thread reserve_thread_;
	std::array<LogLimiter, 4> peer_log_{{{10, std::chrono::seconds(10)},
					     {10, std::chrono::seconds(10)},
					     {10, std::chrono::seconds(10)},
					     {10, std::chrono::seconds(10)}}};

	mutable std::mutex conns_mu_;
	std::list<std::shared_ptr<Conn>> conns_;
	// Totals of connections that have ended.
	uint64_t closed_read_ops_ = 0, closed_read_bytes_ = 0;
	uint64_t closed_write_ops_ = 0, closed_write_bytes_ = 0;
};

// Tell systemd (Type=notify) that we are ready, if NOTIFY_SOCKET is set. No-op otherwise.
void notify_ready();

} // namespace rdmaswap
