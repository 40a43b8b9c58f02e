// SPDX-License-Identifier: MIT
// libFuzzer target for the user-facing value parsers (common/util/config.h): parse_size,
// parse_endpoint, parse_transport. Besides "no crash, no UB, no leak" it checks that what they
// accept round-trips: a size printed in decimal parses to the same value, Endpoint::str()
// parses to the same host and port, transport_name() parses to the same kind.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/util/config.h"
#include "tests/fuzz/fuzz_check.h"

using namespace rdmaswap;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const std::string_view s(reinterpret_cast<const char *>(data), size);

	if (const auto v = parse_size(s)) {
		FUZZ_CHECK(!s.empty() && std::isdigit(static_cast<unsigned char>(s.front())));
		FUZZ_CHECK(parse_size(std::to_string(*v)) == v);
	}

	// A second default port comes from the first two bytes, so that defaults other than 7471
	// are exercised (not 0: callers pass a valid port, and "h:0" does not parse back).
	uint16_t def = size >= 2 ? uint16_t(data[0] | data[1] << 8) : kDefaultPort;
	if (def == 0)
		def = kDefaultPort;
	for (const uint16_t d : {kDefaultPort, def}) {
		const auto ep = parse_endpoint(s, d);
		if (!ep)
			continue;
		FUZZ_CHECK(!ep->host.empty());
		for (const char c : ep->host)
			FUZZ_CHECK(!std::iscntrl(static_cast<unsigned char>(c)) &&
				   !std::isspace(static_cast<unsigned char>(c)));
		const auto again = parse_endpoint(ep->str(), d);
		FUZZ_CHECK(again && again->host == ep->host && again->port == ep->port);
	}

	if (const auto t = parse_transport(s)) {
		FUZZ_CHECK(s == transport_name(*t));
		FUZZ_CHECK(parse_transport(transport_name(*t)) == t);
	}
	return 0;
}
