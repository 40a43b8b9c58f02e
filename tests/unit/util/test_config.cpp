// SPDX-License-Identifier: MIT
// Unit tests for common/util/config: sizes, endpoints, transport names.
#include <catch2/catch.hpp>

#include <string>
#include <string_view>

#include "common/util/config.h"

using namespace rdmaswap;

namespace {
constexpr uint64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024, TiB = GiB * 1024;
}

TEST_CASE("config: parse_size accepts plain numbers and binary suffixes", "[config]")
{
	struct Case { const char *in; uint64_t want; };
	const Case cases[] = {
		{"0", 0},
		{"1", 1},
		{"4096", 4096},
		{"64K", 64 * KiB},
		{"64k", 64 * KiB},
		{"64KB", 64 * KiB},
		{"64KiB", 64 * KiB},
		{"64kib", 64 * KiB},
		{"256M", 256 * MiB},
		{"256m", 256 * MiB},
		{"4G", 4 * GiB},
		{"4GiB", 4 * GiB},
		{"4GB", 4 * GiB},
		{"1T", TiB},
		{"1t", TiB},
		{"10b", 10},
		{"10B", 10},
		{"0K", 0},
		{"007", 7},
		{"18446744073709551615", UINT64_MAX},
		// The largest value that fits with each suffix.
		{"16777215T", 16777215 * TiB},
		{"17179869183G", 17179869183ull * GiB},
	};
	for (const Case &c : cases) {
		INFO("input \"" << c.in << "\"");
		const auto v = parse_size(c.in);
		REQUIRE(v.has_value());
		CHECK(*v == c.want);
	}
}

TEST_CASE("config: parse_size rejects junk, negatives and overflow", "[config]")
{
	const char *bad[] = {
		"", "K", "k", "B", "iB", "-1", "+1", "-0", "1.5G", "1,5G", "12X", "12Q", " 1G", "1G ",
		"1 G", "\t1", "1\n", "99999999999T", "16777216T", "17179869184G", "18446744073709551616",
		"99999999999999999999999", "1KK", "1KiBB", "1Bi", "1iB", "1bb", "1ib", "0x10", "1e3",
		"G1", "1GiB1", "1Gi",
	};
	for (const char *s : bad) {
		INFO("input \"" << s << "\"");
		CHECK_FALSE(parse_size(s).has_value());
	}
	// A string_view that is not NUL-terminated: only the view's bytes count.
	const std::string backing = "64Kjunk";
	const auto v = parse_size(std::string_view(backing).substr(0, 3));
	REQUIRE(v.has_value());
	CHECK(*v == 64 * KiB);
	const std::string digits = "12345";
	CHECK(parse_size(std::string_view(digits).substr(0, 2)) == std::optional<uint64_t>(12));
}

TEST_CASE("config: parse_endpoint", "[config]")
{
	SECTION("host alone uses the default port")
	{
		auto e = parse_endpoint("mem1.example");
		REQUIRE(e);
		CHECK(e->host == "mem1.example");
		CHECK(e->port == kDefaultPort);
		CHECK(e->str() == "mem1.example:7471");
		auto f = parse_endpoint("10.0.0.2", 9000);
		REQUIRE(f);
		CHECK(f->host == "10.0.0.2");
		CHECK(f->port == 9000);
	}
	SECTION("host:port")
	{
		auto e = parse_endpoint("10.1.2.3:7");
		REQUIRE(e);
		CHECK(e->host == "10.1.2.3");
		CHECK(e->port == 7);
		auto g = parse_endpoint("h:65535", 1);
		REQUIRE(g);
		CHECK(g->port == 65535);
		auto h = parse_endpoint("h:1");
		REQUIRE(h);
		CHECK(h->port == 1);
		CHECK(h->str() == "h:1");
	}
	SECTION("bracketed IPv6")
	{
		auto e = parse_endpoint("[::1]:7");
		REQUIRE(e);
		CHECK(e->host == "::1");
		CHECK(e->port == 7);
		CHECK(e->str() == "[::1]:7");
		auto f = parse_endpoint("[::1]");
		REQUIRE(f);
		CHECK(f->host == "::1");
		CHECK(f->port == kDefaultPort);
		auto g = parse_endpoint("[fe80::1:2]:65535", 5);
		REQUIRE(g);
		CHECK(g->host == "fe80::1:2");
		CHECK(g->port == 65535);
		// str() round-trips through parse_endpoint.
		auto again = parse_endpoint(g->str());
		REQUIRE(again);
		CHECK(again->host == g->host);
		CHECK(again->port == g->port);
	}
	SECTION("rejected")
	{
		const char *bad[] = {
			"", ":", ":7", "::1", "fe80::1", "::1:7", "h:0", "h:65536", "h:70000",
			"h:99999999999", "h:abc", "h:", "h:7x", "h: 7", "h:-1", "h:+7", "h:7:8",
			"[::1]:0", "[::1]:65536", "[::1]:", "[::1]x", "[::1]7", "[::1", "[]", "[]:7",
			"[ ]", "a b", "a/b", "a]", "h:0x10",
		};
		for (const char *s : bad) {
			INFO("input \"" << s << "\"");
			CHECK_FALSE(parse_endpoint(s).has_value());
		}
		// Control characters in the host (found by fuzz-config: "\0\0\3\0" was a host).
		using namespace std::string_view_literals;
		for (const std::string_view s : {"\0\0\3\0"sv, "a\0b"sv, "h\x7f:7"sv, "[::1\x01]"sv,
						 "\x1b[0m"sv, "h\n"sv}) {
			INFO("input of " << s.size() << " bytes");
			CHECK_FALSE(parse_endpoint(s).has_value());
		}
	}
}

TEST_CASE("config: parse_transport and transport_name", "[config]")
{
	CHECK(parse_transport("tcp") == TransportKind::Tcp);
	CHECK(parse_transport("rdma") == TransportKind::Rdma);
	CHECK(parse_transport("auto") == TransportKind::Auto);
	for (const char *s : {"", "tc", "tcpx", " tcp", "tcp ", "ib", "rdma0", "autox"}) {
		INFO("input \"" << s << "\"");
		CHECK_FALSE(parse_transport(s).has_value());
	}
	for (TransportKind k : {TransportKind::Tcp, TransportKind::Rdma, TransportKind::Auto}) {
		const auto back = parse_transport(transport_name(k));
		REQUIRE(back);
		CHECK(*back == k);
	}
}
