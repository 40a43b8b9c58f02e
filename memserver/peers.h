// SPDX-License-Identifier: MIT
// Per-peer limits of the memserver: for each source address (IP, without port), a token
// bucket of new connections, the connections it has open, the sessions it created and a
// limit on its per-session info lines (like common/obs/log.h's LogLimiter, but under the table's
// lock, and with the count of suppressed lines collected when a window ends). The table is bounded: idle addresses are evicted,
// and when it is full of active ones a new address is refused. Thread-safe (one mutex, a leaf
// in the memserver's lock order); nothing allocates for an address already in the table.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <sys/socket.h>

namespace rdmaswap {

// An IP address without its port: IPv4 as an IPv4-mapped IPv6 address.
struct PeerAddr {
	std::array<uint8_t, 16> b{};
	static PeerAddr from(const sockaddr_storage &ss);
	// "192.0.2.1" or "2001:db8::1" (control path: allocates).
	std::string str() const;
	bool operator==(const PeerAddr &) const = default;
};

struct PeerAddrHash {
	size_t operator()(const PeerAddr &a) const noexcept;
};

class PeerTable {
public:
	using Clock = std::chrono::steady_clock;
	struct Limits {
		unsigned connect_rate = 50;      // new connections per second (burst 2x); 0: no limit
		unsigned max_connections = 128;  // open at once
		unsigned max_sessions = 64;      // created and not yet ended
		size_t max_peers = 65536;        // addresses tracked
		unsigned log_burst = 20;         // per-session info lines per log_period
		std::chrono::seconds log_period{10};
	};
	explicit PeerTable(const Limits &l) : lim_(l) {}

	// What admit() decided.
	enum class Verdict : uint8_t {
		Ok,          // counted as one more open connection of its address
		Rate,        // over --connect-rate
		Connections, // over --max-peer-connections
		ServerFull,  // `server_full` was set (--max-connections)
		TableFull,   // no room for a new address
	};
	static constexpr size_t kVerdicts = 5;
	// A new connection from `a` at `now` (the accept loop, before anything is read from it).
	// A refusal is counted for drop_report(); the caller closes the connection.
	Verdict admit(const PeerAddr &a, Clock::time_point now, bool server_full);
	// A connection that admit() let in has ended.
	void closed(const PeerAddr &a);

	// Reserve one session for `a` (a HELLO about to create one). False: `a` has max_sessions
	// already. The caller then names it with own_session(), or gives it back with
	// unreserve_session() if it was not created.
	bool reserve_session(const PeerAddr &a);
	void unreserve_session(const PeerAddr &a);
	// Session `id`, reserved for `a`, now exists: its count goes to `a` until end_session().
	void own_session(const PeerAddr &a, uint64_t id);
	// Session `id` ended, expired or was taken over: its creator's count drops by one.
	// Returns the creator's address (nullopt if the session is not known here).
	std::optional<PeerAddr> end_session(uint64_t id);
	// Who created session `id`.
	std::optional<PeerAddr> session_owner(uint64_t id) const;
	// Sessions counted for `a`.
	unsigned sessions(const PeerAddr &a) const;
	unsigned connections(const PeerAddr &a) const;

	// May a per-session info line about `a` be logged at `now` (Limits::log_burst per
	// log_period)? Then `suppressed` is how many of its lines were dropped before it and not
	// reported by log_suppressed() yet. An address not in the table is always allowed.
	bool log_allowed(const PeerAddr &a, uint64_t &suppressed, Clock::time_point now = Clock::now());
	struct Suppressed {
		PeerAddr addr;
		uint64_t count = 0;
	};
	// The addresses whose window of log_period ended by `now` with lines suppressed, and how
	// many (reset): one line each, so that a burst of churn ends with a count, not silence.
	std::vector<Suppressed> log_suppressed(Clock::time_point now);

	// Refusals of one kind since the last drop_report() of that kind.
	struct Dropped {
		uint64_t total = 0;
		uint32_t addresses = 0; // distinct addresses among them (0 for TableFull)
		PeerAddr worst{};       // the address with most of them, and how many
		uint64_t worst_count = 0;
	};
	// Take (and reset) the count of refusals of kind `v`.
	Dropped drop_report(Verdict v);

	// Remove idle addresses: no connection, no session, a full token bucket. Returns how many.
	size_t sweep(Clock::time_point now);
	size_t size() const;

private:
	struct Entry {
		double tokens = 0;
		Clock::time_point refilled{};
		unsigned conns = 0;
		unsigned sessions = 0;
		std::array<uint64_t, kVerdicts> drops{};     // in drop window drop_epoch[kind]
		std::array<uint64_t, kVerdicts> drop_epoch{};
		// Per-session log lines: a window of log_period, the lines let through in it, and
		// those suppressed since the last count was reported.
		Clock::time_point log_window{};
		unsigned log_lines = 0;
		uint64_t log_dropped = 0;
	};
	struct Report {
		uint64_t epoch = 1;
		Dropped d;
	};
	bool idle(const Entry &e, Clock::time_point now) const;
	void count_drop(Entry *e, const PeerAddr &a, Verdict v);
	size_t sweep_locked(Clock::time_point now);

	const Limits lim_;
	mutable std::mutex mu_;
	std::unordered_map<PeerAddr, Entry, PeerAddrHash> map_;
	std::unordered_map<uint64_t, PeerAddr> owner_; // session -> its creator
	std::vector<PeerAddr> log_pending_;            // entries with log_dropped > 0
	std::array<Report, kVerdicts> reports_{};
	Clock::time_point last_full_sweep_{};
};

} // namespace rdmaswap
