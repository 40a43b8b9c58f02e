// SPDX-License-Identifier: MIT
// The memserver's metrics endpoint (--metrics-listen): GET /metrics over HTTP with
// libmicrohttpd, on one thread of its own.
//
// Contracts:
// - The constructor binds and listens (a clear std::runtime_error if it cannot), then starts
//   the thread; the destructor stops it (joins) and closes the socket.
// - `render` is called on that thread, once per GET /metrics, and must take no lock that the
//   event loops, workers or data path take (Memserver::metrics_text() reads only atomics).
// - Bounded (issue 26, S12): at most kMaxConnections connections at once and
//   kMaxPerAddress from one IP address (more are closed by the library at accept); each
//   connection carries one request and is closed kRequestDeadline after it was accepted,
//   however its bytes trickle in or out (the whole request read and the whole reply sent, or
//   the connection is cut: shutdown(2) from the server's thread); only GET and HEAD of
//   /metrics are answered (others: 404 or 405), every reply with "Connection: close". The
//   library's messages (refusals included) are rate-limited in the log. A slow scraper costs
//   one of its address's connections for at most the deadline, and that thread only.
// - One thread of its own runs the library (MHD_run_wait) and the deadlines; it takes no lock
//   the rest of the memserver takes.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "common/obs/log.h"

struct MHD_Daemon;
struct MHD_Connection;

namespace rdmaswap {

// ADDR:PORT with a numeric IPv4 address or a bracketed IPv6 one ("127.0.0.1:9471",
// "[::1]:9471", "0.0.0.0:9471"), port 0 to 65535 (0: any free port). nullopt otherwise.
struct ListenAddr {
	std::string host; // without brackets
	uint16_t port = 0;
	std::string str() const; // as given: brackets around IPv6
};
std::optional<ListenAddr> parse_listen_addr(const std::string &s);

class MetricsServer {
public:
	static constexpr unsigned kMaxConnections = 16;
	static constexpr unsigned kMaxPerAddress = 2;
	static constexpr std::chrono::milliseconds kRequestDeadline{2000};

	MetricsServer(const ListenAddr &at, std::function<std::string()> render);
	~MetricsServer();
	MetricsServer(const MetricsServer &) = delete;
	MetricsServer &operator=(const MetricsServer &) = delete;

	uint16_t port() const { return port_; } // the port bound (useful with port 0)
	// Connections cut at the deadline so far (tests).
	uint64_t deadlines_hit() const { return deadlines_hit_.load(std::memory_order_relaxed); }

private:
	// A connection the library has open: its socket (valid from the library's "started"
	// notification to its "closed" one, which comes before it closes the socket; both on
	// thread_) and when it must be gone.
	struct Conn {
		bool used = false;
		bool cut = false;
		int fd = -1;
		std::chrono::steady_clock::time_point deadline{};
	};
	friend struct MetricsServerCallbacks; // the library's callbacks (metrics_http.cpp)
	// The library's notifications of a connection accepted (`started`) or about to close.
	void on_connection(MHD_Connection *conn, void **socket_context, bool started) noexcept;
	void serve();			    // thread_'s loop
	std::chrono::milliseconds cut_expired(); // cuts late ones; the time to the next deadline

	std::function<std::string()> render_;
	// The library's messages: at most 10 lines per 10 s, then the count of those left out.
	LogLimiter log_limit_{10, std::chrono::seconds(10)};
	uint16_t port_ = 0;
	MHD_Daemon *daemon_ = nullptr;
	std::array<Conn, kMaxConnections> conns_{}; // thread_ only
	std::atomic<bool> stop_{false};
	std::atomic<uint64_t> deadlines_hit_{0};
	std::thread thread_;
};

} // namespace rdmaswap
