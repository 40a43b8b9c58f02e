// SPDX-License-Identifier: MIT
// Parsing of the user-facing values shared by the memserver, the plugin and the tools.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rdmaswap {

// Parse a size: decimal digits with an optional binary suffix K, M, G, T (case-insensitive,
// optionally followed by "iB" or "B"): "4096", "64K", "256M", "4GiB". Returns nullopt for
// empty input, junk, a negative value or a value that overflows uint64_t.
std::optional<uint64_t> parse_size(std::string_view s);

struct Endpoint {
	std::string host;
	uint16_t port = 0;
	std::string str() const; // "host:port", IPv6 hosts in brackets
	bool operator==(const Endpoint &) const = default; // the same host string and port
};

inline constexpr uint16_t kDefaultPort = 7471;

// Parse "HOST", "HOST:PORT", "[V6]" or "[V6]:PORT". Port must be 1..65535. nullopt on junk,
// including a host with white space, control characters (NUL too), '/', '[' or ']'.
std::optional<Endpoint> parse_endpoint(std::string_view s, uint16_t default_port = kDefaultPort);

enum class TransportKind { Tcp, Rdma, Auto };
std::optional<TransportKind> parse_transport(std::string_view s);
const char *transport_name(TransportKind k);

} // namespace rdmaswap
