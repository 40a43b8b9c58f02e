// SPDX-License-Identifier: MIT
// Parsing of sizes, endpoints and transport names, and the etcd security keys.
#include "common/util/config.h"

#include <cctype>
#include <charconv>

namespace rdmaswap {

std::optional<uint64_t> parse_size(std::string_view s)
{
	if (s.empty() || !std::isdigit(static_cast<unsigned char>(s.front())))
		return std::nullopt;
	uint64_t value = 0;
	auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
	if (ec != std::errc())
		return std::nullopt;
	std::string suffix;
	for (const char *p = end; p != s.data() + s.size(); p++)
		suffix += char(std::tolower(static_cast<unsigned char>(*p)));
	unsigned shift = 0;
	if (!suffix.empty() && suffix != "b") {
		static constexpr std::string_view kUnits = "kmgt";
		const size_t unit = kUnits.find(suffix.front());
		if (unit == std::string_view::npos)
			return std::nullopt;
		shift = 10 * unsigned(unit + 1);
		const std::string_view rest = std::string_view(suffix).substr(1);
		if (!rest.empty() && rest != "b" && rest != "ib")
			return std::nullopt;
	}
	if (shift && value > (UINT64_MAX >> shift))
		return std::nullopt;
	return value << shift;
}

std::string Endpoint::str() const
{
	if (host.find(':') != std::string::npos)
		return "[" + host + "]:" + std::to_string(port);
	return host + ":" + std::to_string(port);
}

std::optional<Endpoint> parse_endpoint(std::string_view s, uint16_t default_port)
{
	Endpoint ep;
	std::string_view port;
	if (s.empty())
		return std::nullopt;
	if (s.front() == '[') {
		const size_t close = s.find(']');
		if (close == std::string_view::npos || close == 1)
			return std::nullopt;
		ep.host = std::string(s.substr(1, close - 1));
		std::string_view rest = s.substr(close + 1);
		if (!rest.empty()) {
			if (rest.front() != ':')
				return std::nullopt;
			port = rest.substr(1);
			if (port.empty())
				return std::nullopt;
		}
	} else {
		const size_t colon = s.find(':');
		if (colon != std::string_view::npos && s.find(':', colon + 1) != std::string_view::npos)
			return std::nullopt; // bare IPv6 must be bracketed
		ep.host = std::string(s.substr(0, colon));
		if (colon != std::string_view::npos) {
			port = s.substr(colon + 1);
			if (port.empty())
				return std::nullopt;
		}
		if (ep.host.empty())
			return std::nullopt;
	}
	for (char c : ep.host)
		if (std::isspace(static_cast<unsigned char>(c)) ||
		    std::iscntrl(static_cast<unsigned char>(c)) || c == '/' || c == '[' || c == ']')
			return std::nullopt;
	ep.port = default_port;
	if (!port.empty()) {
		unsigned v = 0;
		auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), v);
		if (ec != std::errc() || end != port.data() + port.size() || v == 0 || v > 65535)
			return std::nullopt;
		ep.port = uint16_t(v);
	}
	return ep;
}

std::optional<TransportKind> parse_transport(std::string_view s)
{
	if (s == "tcp") return TransportKind::Tcp;
	if (s == "rdma") return TransportKind::Rdma;
	if (s == "auto") return TransportKind::Auto;
	return std::nullopt;
}

const char *transport_name(TransportKind k)
{
	switch (k) {
	case TransportKind::Tcp: return "tcp";
	case TransportKind::Rdma: return "rdma";
	case TransportKind::Auto: return "auto";
	}
	return "?";
}

namespace {
// The etcd-* keys and the fields they set (the memserver's flags are "--" + the key).
struct EtcdKey {
	std::string_view name;
	std::string EtcdSecurity::*field;
};
constexpr EtcdKey kEtcdKeys[] = {
	{"etcd-cacert", &EtcdSecurity::cacert},
	{"etcd-cert", &EtcdSecurity::cert},
	{"etcd-key", &EtcdSecurity::key},
	{"etcd-user", &EtcdSecurity::user},
	{"etcd-password-file", &EtcdSecurity::password_file},
};

// The key as the user writes it: "etcd-cert=" (the plugin's) or "--etcd-cert" (the memserver's).
std::string key_text(std::string_view flag, std::string_view name)
{
	return flag.empty() ? std::string(name) + "=" : std::string(flag) + std::string(name);
}
} // namespace

bool set_etcd_security_key(EtcdSecurity &s, std::string_view key, std::string_view value,
			   std::string &error)
{
	error.clear();
	for (const EtcdKey &k : kEtcdKeys) {
		if (k.name != key)
			continue;
		if (value.empty())
			error = std::string(key) + "= must not be empty";
		else
			s.*k.field = std::string(value);
		return true;
	}
	return false;
}

std::string check_etcd_security(const EtcdSecurity &s, const std::vector<std::string> &endpoints,
				std::string_view flag)
{
	auto name = [&](std::string_view n) { return key_text(flag, n); };
	if (s.cert.empty() != s.key.empty())
		return name(s.cert.empty() ? "etcd-key" : "etcd-cert") + " needs " +
		       name(s.cert.empty() ? "etcd-cert" : "etcd-key") +
		       " as well: the client certificate and its private key go together";
	if (s.user.empty() != s.password_file.empty())
		return name(s.user.empty() ? "etcd-password-file" : "etcd-user") + " needs " +
		       name(s.user.empty() ? "etcd-user" : "etcd-password-file") +
		       " as well: etcd's user name and the file of its password go together";
	if (!s.any())
		return "";
	const std::string_view first = !s.cacert.empty() ? "etcd-cacert"
				       : !s.cert.empty() ? "etcd-cert"
							  : "etcd-user";
	if (endpoints.empty())
		return name(first) + " needs " + name("etcd");
	for (const std::string &e : endpoints)
		if (e.rfind("https://", 0) != 0)
			return name(first) + " needs https:// etcd endpoints, not " + e +
			       (s.tls() ? " (TLS options apply to https:// only)"
					: " (a password is never sent in clear)");
	return "";
}

} // namespace rdmaswap
