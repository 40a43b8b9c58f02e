// SPDX-License-Identifier: MIT
// Parsing of the user-facing values shared by the memserver, the plugin and the tools.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// How a client of etcd proves who it is and checks whom it talks to (docs/deployment.md, "etcd
// over TLS with credentials"): the plugin's keys etcd-cacert=, etcd-cert=, etcd-key=,
// etcd-user=, etcd-password-file= and the memserver's flags of the same names. File names
// only: etcd::Credentials (common/net/etcd.h) reads the files.
struct EtcdSecurity {
	std::string cacert;        // CA certificates (PEM) that sign etcd's; empty: the system's
	std::string cert, key;     // the client certificate and its private key (PEM), together
	std::string user;          // etcd user name (etcd's auth), with password_file
	std::string password_file; // that user's password (a key file: regular, ours, 0600)
	// Whether TLS options are given (a CA, a client certificate).
	bool tls() const { return !cacert.empty() || !cert.empty() || !key.empty(); }
	bool any() const { return tls() || !user.empty() || !password_file.empty(); }
};

// Whether `key` is one of the etcd-* keys of EtcdSecurity ("etcd-cacert", ...): then set the
// field to `value` and return true with `error` empty, or with `error` set if `value` is empty.
// False for any other key.
bool set_etcd_security_key(EtcdSecurity &s, std::string_view key, std::string_view value,
			   std::string &error);

// "" if `s` may be used with the etcd client URLs `endpoints` (etcd::parse_endpoints);
// otherwise what is wrong, naming the keys with the prefix `flag` ("" for the plugin's
// "etcd-cert=", "--" for the memserver's "--etcd-cert"): a certificate without its key or a key
// without its certificate; a user without a password file or a password file without a user;
// any of them without endpoints, or with an http:// endpoint (TLS options need https://, and a
// password is never sent in clear).
std::string check_etcd_security(const EtcdSecurity &s, const std::vector<std::string> &endpoints,
				std::string_view flag);

} // namespace rdmaswap
