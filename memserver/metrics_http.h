// SPDX-License-Identifier: MIT
// The memserver's metrics endpoint (--metrics-listen): GET /metrics over HTTP with
// libmicrohttpd, on the library's one internal thread.
//
// Contracts:
// - The constructor binds and listens (a clear std::runtime_error if it cannot), then starts
//   the thread; the destructor stops it (joins) and closes the socket.
// - `render` is called on that thread, once per GET /metrics, and must take no lock that the
//   event loops, workers or data path take (Memserver::metrics_text() reads only atomics).
// - Bounded: at most kMaxConnections connections at once (more are refused by the library),
//   each closed after kIdleTimeout without progress; only GET and HEAD of /metrics are
//   answered (others: 404 or 405). A slow scraper costs that thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

struct MHD_Daemon;

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
	static constexpr unsigned kMaxConnections = 8;
	static constexpr unsigned kIdleTimeoutSeconds = 10;

	MetricsServer(const ListenAddr &at, std::function<std::string()> render);
	~MetricsServer();
	MetricsServer(const MetricsServer &) = delete;
	MetricsServer &operator=(const MetricsServer &) = delete;

	uint16_t port() const { return port_; } // the port bound (useful with port 0)

private:
	std::function<std::string()> render_;
	uint16_t port_ = 0;
	MHD_Daemon *daemon_ = nullptr;
};

} // namespace rdmaswap
