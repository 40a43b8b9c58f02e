// SPDX-License-Identifier: MIT
// Parsing of sizes, endpoints and transport names.
#include "common/config.h"

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

} // namespace rdmaswap
