// SPDX-License-Identifier: MIT
// Unit tests for memserver/peers: the per-address token bucket, connection and session
// counts, the bounded table (idle addresses evicted, a full table refuses new ones), the
// refusal counts reported to the log, the per-address log limiter; and SessionTable's
// --max-floors limit and its count of what it freed.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <chrono>
#include <cstring>

#include "memserver/peers.h"

using namespace rdmaswap;
using V = PeerTable::Verdict;
using namespace std::chrono_literals;

namespace {

PeerAddr v4(const char *ip, uint16_t port = 1234)
{
	sockaddr_storage ss{};
	auto &in = reinterpret_cast<sockaddr_in &>(ss);
	in.sin_family = AF_INET;
	in.sin_port = htons(port);
	REQUIRE(inet_pton(AF_INET, ip, &in.sin_addr) == 1);
	return PeerAddr::from(ss);
}

PeerTable::Limits limits(unsigned rate, unsigned conns, unsigned sessions, size_t peers = 64)
{
	PeerTable::Limits l;
	l.connect_rate = rate;
	l.max_connections = conns;
	l.max_sessions = sessions;
	l.max_peers = peers;
	l.log_burst = 3;
	l.log_period = std::chrono::seconds(10);
	return l;
}

} // namespace

TEST_CASE("peers: an address is its IP without the port", "[peers]")
{
	CHECK(v4("192.0.2.7", 1) == v4("192.0.2.7", 2));
	CHECK_FALSE(v4("192.0.2.7") == v4("192.0.2.8"));
	CHECK(v4("127.0.0.3").str() == "127.0.0.3");
	sockaddr_storage ss{};
	auto &in6 = reinterpret_cast<sockaddr_in6 &>(ss);
	in6.sin6_family = AF_INET6;
	REQUIRE(inet_pton(AF_INET6, "2001:db8::1", &in6.sin6_addr) == 1);
	CHECK(PeerAddr::from(ss).str() == "2001:db8::1");
	CHECK(PeerAddrHash{}(v4("10.0.0.1")) != PeerAddrHash{}(v4("10.0.0.2")));
}

TEST_CASE("peers: new connections per address are a token bucket with a burst of twice the "
	  "rate", "[peers]")
{
	PeerTable t(limits(10, 1000, 64));
	const auto a = v4("127.0.0.3"), b = v4("127.0.0.2");
	const auto t0 = PeerTable::Clock::now();
	for (int i = 0; i < 20; i++)
		REQUIRE(t.admit(a, t0, false) == V::Ok);
	CHECK(t.admit(a, t0, false) == V::Rate);
	CHECK(t.admit(a, t0 + 50ms, false) == V::Rate);  // half a token
	CHECK(t.admit(a, t0 + 110ms, false) == V::Ok);   // one token back after 100 ms
	CHECK(t.admit(a, t0 + 110ms, false) == V::Rate);
	// Another address has its own bucket.
	CHECK(t.admit(b, t0 + 110ms, false) == V::Ok);
	// After a long pause the bucket is full again, not fuller.
	int n = 0;
	while (t.admit(a, t0 + 60s, false) == V::Ok)
		n++;
	CHECK(n == 20);
	CHECK(t.connections(a) == 41);
}

TEST_CASE("peers: connections open at once per address, and the server's own limit",
	  "[peers]")
{
	PeerTable t(limits(0, 3, 64)); // rate 0: no rate limit
	const auto a = v4("127.0.0.3"), b = v4("127.0.0.2");
	const auto now = PeerTable::Clock::now();
	for (int i = 0; i < 3; i++)
		REQUIRE(t.admit(a, now, false) == V::Ok);
	CHECK(t.admit(a, now, false) == V::Connections);
	CHECK(t.admit(b, now, false) == V::Ok);
	t.closed(a);
	CHECK(t.connections(a) == 2);
	CHECK(t.admit(a, now, false) == V::Ok);
	CHECK(t.admit(b, now, true) == V::ServerFull); // --max-connections reached
	CHECK(t.connections(b) == 1);
}

TEST_CASE("peers: sessions per address are reserved, owned, and released when they end",
	  "[peers]")
{
	PeerTable t(limits(0, 100, 2));
	const auto a = v4("127.0.0.4"), b = v4("127.0.0.5");
	REQUIRE(t.admit(a, PeerTable::Clock::now(), false) == V::Ok);
	REQUIRE(t.reserve_session(a));
	t.own_session(a, 11);
	REQUIRE(t.reserve_session(a));
	t.own_session(a, 12);
	CHECK_FALSE(t.reserve_session(a)); // EUSERS
	CHECK(t.reserve_session(b));       // another address
	t.own_session(b, 21);
	CHECK(t.sessions(a) == 2);
	CHECK(t.session_owner(12) == a);
	CHECK(t.end_session(12) == a); // ended, expired or taken over
	CHECK(t.end_session(12) == std::nullopt);
	CHECK(t.sessions(a) == 1);
	CHECK(t.reserve_session(a));
	t.unreserve_session(a); // HELLO failed before the session existed
	CHECK(t.sessions(a) == 1);
	CHECK(t.end_session(999) == std::nullopt);
	// The connection that created a session may be gone; the count stays until it ends.
	t.closed(a);
	t.sweep(PeerTable::Clock::now() + 1h);
	CHECK(t.sessions(a) == 1);
	CHECK(t.end_session(11) == a);
	CHECK(t.sessions(a) == 0);
}

TEST_CASE("peers: the table is bounded; idle addresses are evicted, active ones never",
	  "[peers]")
{
	PeerTable t(limits(10, 100, 64, 4));
	const auto t0 = PeerTable::Clock::now();
	for (int i = 0; i < 20; i++) // its whole burst
		REQUIRE(t.admit(v4("10.0.0.1"), t0, false) == V::Ok);
	for (const char *ip : {"10.0.0.2", "10.0.0.3", "10.0.0.4"})
		REQUIRE(t.admit(v4(ip), t0, false) == V::Ok);
	CHECK(t.size() == 4);
	// Full of addresses with open connections: a new one is refused.
	CHECK(t.admit(v4("10.0.0.5"), t0 + 2s, false) == V::TableFull);
	// One closes its connections; it becomes idle once its bucket is full again (2 s at
	// 10/s for a burst of 20), and the next sweep (at most one a second when full) evicts it.
	for (int i = 0; i < 20; i++)
		t.closed(v4("10.0.0.1"));
	CHECK(t.sweep(t0 + 1s) == 0); // its bucket is not full yet
	CHECK(t.admit(v4("10.0.0.5"), t0 + 2500ms, false) == V::TableFull); // swept at 2 s
	CHECK(t.admit(v4("10.0.0.5"), t0 + 3600ms, false) == V::Ok);
	CHECK(t.size() == 4);
	// An address that holds a session is active too.
	const auto s = v4("10.0.0.5");
	REQUIRE(t.reserve_session(s));
	t.own_session(s, 7);
	t.closed(s);
	for (const char *ip : {"10.0.0.2", "10.0.0.3", "10.0.0.4"})
		t.closed(v4(ip));
	CHECK(t.sweep(t0 + 1h) == 3);
	CHECK(t.size() == 1);
	CHECK(t.sessions(s) == 1);
}

TEST_CASE("peers: refusals are counted per kind, with the address that made most of them",
	  "[peers]")
{
	PeerTable t(limits(1, 1, 64, 3)); // burst 2
	const auto t0 = PeerTable::Clock::now();
	const auto a = v4("127.0.0.3"), b = v4("127.0.0.2");
	REQUIRE(t.admit(a, t0, false) == V::Ok);
	for (int i = 0; i < 5; i++) // one token left, one connection at most
		CHECK(t.admit(a, t0, false) != V::Ok);
	REQUIRE(t.admit(b, t0, false) == V::Ok);
	CHECK(t.admit(b, t0, false) == V::Connections);
	CHECK(t.admit(b, t0, false) == V::Rate);
	auto r = t.drop_report(V::Rate);
	CHECK(r.total == 5);
	CHECK(r.addresses == 2);
	CHECK(r.worst == a);
	CHECK(r.worst_count == 4);
	auto c = t.drop_report(V::Connections);
	CHECK(c.total == 2);
	CHECK(c.addresses == 2);
	// A report resets its kind.
	CHECK(t.drop_report(V::Rate).total == 0);
	CHECK(t.admit(a, t0 + 10s, false) == V::Connections);
	c = t.drop_report(V::Connections);
	CHECK(c.total == 1);
	CHECK(c.addresses == 1);
	CHECK(c.worst_count == 1);
	// A full table counts refusals of new addresses.
	REQUIRE(t.admit(v4("127.0.0.9"), t0, false) == V::Ok);
	CHECK(t.admit(v4("127.0.0.10"), t0, false) == V::TableFull);
	CHECK(t.drop_report(V::TableFull).total == 1);
}

TEST_CASE("peers: per-session log lines are limited per address, and what was suppressed is "
	  "counted when the window ends", "[peers]")
{
	PeerTable t(limits(0, 100, 64));
	const auto t0 = PeerTable::Clock::now();
	const auto a = v4("127.0.0.1"), b = v4("127.0.0.2");
	REQUIRE(t.admit(a, t0, false) == V::Ok);
	REQUIRE(t.admit(b, t0, false) == V::Ok);
	uint64_t suppressed = 99;
	for (int i = 0; i < 3; i++) {
		CHECK(t.log_allowed(a, suppressed, t0));
		CHECK(suppressed == 0);
	}
	int let_through = 0;
	for (int i = 0; i < 1000; i++)
		let_through += t.log_allowed(a, suppressed, t0 + 1s);
	CHECK(let_through == 0);
	CHECK(t.log_allowed(b, suppressed, t0 + 1s)); // its own limit
	// An address the table does not know (its session outlived it): always allowed.
	CHECK(t.log_allowed(v4("192.0.2.1"), suppressed, t0));
	// Not before the window (10 s) has ended; then once.
	CHECK(t.log_suppressed(t0 + 9s).empty());
	// An address with a count to report is not idle.
	t.closed(a);
	t.sweep(t0 + 1h);
	const auto r = t.log_suppressed(t0 + 10s);
	REQUIRE(r.size() == 1);
	CHECK(r[0].addr == a);
	CHECK(r[0].count == 1000);
	CHECK(t.log_suppressed(t0 + 20s).empty());
	// Or the next line let through says it, if it comes first.
	REQUIRE(t.admit(a, t0 + 20s, false) == V::Ok);
	for (int i = 0; i < 5; i++)
		t.log_allowed(a, suppressed, t0 + 20s);
	CHECK(t.log_allowed(a, suppressed, t0 + 31s));
	CHECK(suppressed == 2);
	CHECK(t.log_suppressed(t0 + 60s).empty());
}
