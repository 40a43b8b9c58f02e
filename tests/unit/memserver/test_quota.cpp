// SPDX-License-Identifier: MIT
// Unit tests for memserver/quota: the slab limit of one owner, the accounts of sessions and
// owners (charges, releases, a session moving from its address to its volume key, a takeover,
// a session's end), the same through SlabPool, the window of owners per address, and a start
// that keeps a full donor (Membership::plan_start).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cerrno>
#include <chrono>

#include "common/cluster/membership.h"
#include "tests/support/fake_transport.h"
#include "memserver/quota.h"
#include "memserver/slab_pool.h"
#include "tests/support/volume_helpers.h"

using namespace rdmaswap;
using namespace std::chrono_literals;
using rdmaswap::test::backend;
using rdmaswap::test::FakeServer;

namespace {

PeerAddr v4(const char *ip)
{
	sockaddr_storage ss{};
	auto &in = reinterpret_cast<sockaddr_in &>(ss);
	in.sin_family = AF_INET;
	REQUIRE(inet_pton(AF_INET, ip, &in.sin_addr) == 1);
	return PeerAddr::from(ss);
}

} // namespace

TEST_CASE("quota: the limit is a share of the slabs, bounded by a count, at least one",
	  "[quota]")
{
	CHECK(owner_slab_limit(16, 0, 50) == 8);
	CHECK(owner_slab_limit(15, 0, 50) == 7);
	CHECK(owner_slab_limit(16, 3, 50) == 3);
	CHECK(owner_slab_limit(16, 100, 50) == 8);
	CHECK(owner_slab_limit(16, 0, 100) == 16);
	CHECK(owner_slab_limit(1, 0, 50) == 1);
	CHECK(owner_slab_limit(4096, 0, 1) == 40);
	CHECK(owner_slab_limit(UINT32_MAX - 1, 0, 100) == UINT32_MAX - 1);
}

TEST_CASE("quota: sessions of one owner share one count", "[quota]")
{
	OwnerAccounts a(3);
	const std::string k = key_owner("aa"), other = key_owner("bb");
	REQUIRE(a.assign(1, k) == 0);
	REQUIRE(a.assign(2, k) == 0);
	REQUIRE(a.assign(3, other) == 0);
	CHECK(a.charge(1));
	CHECK(a.charge(2));
	CHECK(a.charge(1));
	CHECK_FALSE(a.charge(2)); // the owner holds 3: its limit
	CHECK_FALSE(a.charge(1));
	CHECK(a.held(k) == 3);
	CHECK(a.left(1) == 0);
	CHECK(a.charge(3)); // another owner is not affected
	CHECK(a.held(other) == 1);
	a.uncharge(2, 1);
	CHECK(a.left(1) == 1);
	CHECK(a.charge(2));
	CHECK(a.charge(99)); // a session never assigned is not counted
	CHECK(a.left(99) == UINT32_MAX);
}

TEST_CASE("quota: a session moves from its address to its volume key, within the limit",
	  "[quota]")
{
	OwnerAccounts a(4);
	const std::string addr = address_owner(v4("192.0.2.1")), k = key_owner("aa");
	REQUIRE(a.assign(1, addr) == 0);
	REQUIRE(a.assign(2, k) == 0);
	for (int i = 0; i < 3; i++)
		REQUIRE(a.charge(2));
	REQUIRE(a.charge(1));
	REQUIRE(a.charge(1));
	// Session 1's two slabs would put k at 5 of 4: refused, nothing changes.
	CHECK(a.check_assign(1, k) == EDQUOT);
	CHECK(a.assign(1, k) == EDQUOT);
	CHECK(a.held(addr) == 2);
	CHECK(a.held(k) == 3);
	a.uncharge(1, 1);
	CHECK(a.assign(1, k) == 0);
	CHECK(a.held(k) == 4);
	CHECK(a.held(addr) == 0);
	CHECK(a.owners() == 1); // the address owner had no session left
	CHECK(a.assign(1, k) == 0); // again: a no-op
	CHECK(a.held(k) == 4);
	// A forced assignment goes over (a bind that succeeded: counted, never lost).
	REQUIRE(a.assign(3, addr) == 0);
	REQUIRE(a.charge(3));
	CHECK(a.assign(3, k, true) == 0);
	CHECK(a.held(k) == 5);
	CHECK_FALSE(a.charge(1));
}

TEST_CASE("quota: a takeover keeps the count, an ended session drops it", "[quota]")
{
	OwnerAccounts a(2);
	const std::string k = key_owner("aa");
	REQUIRE(a.assign(1, k) == 0);
	REQUIRE(a.charge(1));
	REQUIRE(a.charge(1));
	// A new session of the same volume key takes over the detached one (assigned to its
	// address first, as a new session is).
	const std::string addr = address_owner(v4("192.0.2.1"));
	REQUIRE(a.assign(2, addr) == 0);
	a.move(1, 2, 2);
	a.forget(1);
	CHECK(a.held(addr) == 2);
	REQUIRE(a.assign(2, k, true) == 0);
	CHECK(a.held(k) == 2);
	CHECK(a.held(addr) == 0);
	CHECK_FALSE(a.charge(2));
	// The session ends: its owner holds nothing, and is gone.
	a.forget(2);
	CHECK(a.held(k) == 0);
	CHECK(a.owners() == 0);
	a.uncharge(2, 1); // a release after the end: nothing to count
	CHECK(a.owners() == 0);
}

TEST_CASE("quota: SlabPool refuses an owner's ALLOC over its quota while others get slabs",
	  "[quota][slab_pool]")
{
	SlabPool pool(8 * 65536, 65536, false);
	pool.set_owner_limit(owner_slab_limit(pool.slabs_total(), 0, 50));
	REQUIRE(pool.owner_limit() == 4);
	const std::string a = key_owner("aa"), b = key_owner("bb");
	REQUIRE(pool.assign(1, a) == 0);
	REQUIRE(pool.assign(2, a) == 0);
	REQUIRE(pool.assign(3, b) == 0);
	std::vector<uint32_t> held;
	for (uint64_t s : {1, 2, 1, 2})
		held.push_back(pool.allocate(s).value());
	bool over = false;
	CHECK_FALSE(pool.allocate(1, &over).has_value());
	CHECK(over);
	CHECK(pool.slabs_free() == 4);
	CHECK(pool.owner_held(2) == 4);
	CHECK(pool.owner_left(2) == 0);
	// Owner b still gets slabs, up to its own quota.
	for (int i = 0; i < 4; i++)
		CHECK(pool.allocate(3, &over).has_value());
	CHECK_FALSE(pool.allocate(3, &over).has_value());
	CHECK(over);
	// A release makes room for the owner again; a session's end drops all it held.
	REQUIRE(pool.release(held[0], 1));
	REQUIRE(pool.settle(std::chrono::steady_clock::now() + 5s));
	CHECK(pool.owner_left(2) == 1);
	CHECK(pool.allocate(2).has_value());
	CHECK(pool.release_all(2) == 3);
	CHECK(pool.owner_held(1) == 1);
	CHECK(pool.release_all(1) == 1);
	REQUIRE(pool.settle(std::chrono::steady_clock::now() + 5s));
	CHECK(pool.owner_name(1).empty());
	// A full pool is not "over quota".
	SlabPool small(2 * 65536, 65536, false);
	REQUIRE(small.assign(5, a) == 0);
	REQUIRE(small.allocate(6).has_value());
	REQUIRE(small.allocate(6).has_value());
	CHECK_FALSE(small.allocate(5, &over).has_value());
	CHECK_FALSE(over);
	CHECK(small.owner_held(5) == 0); // charged, then taken back
}

TEST_CASE("quota: a takeover through SlabPool moves the slabs' count to the new session",
	  "[quota][slab_pool]")
{
	SlabPool pool(8 * 65536, 65536, false);
	pool.set_owner_limit(3);
	const std::string k = key_owner("aa"), addr = address_owner(v4("192.0.2.1"));
	REQUIRE(pool.assign(1, k) == 0);
	REQUIRE(pool.allocate(1).has_value());
	REQUIRE(pool.allocate(1).has_value());
	REQUIRE(pool.assign(2, addr) == 0);
	CHECK(pool.reassign(1, 2) == 2);
	REQUIRE(pool.assign(2, k, true) == 0);
	CHECK(pool.owner_held(2) == 2);
	CHECK(pool.allocate(2).has_value());
	CHECK_FALSE(pool.allocate(2).has_value());
}

TEST_CASE("quota: one address binds at most max distinct owners per period", "[quota]")
{
	OwnerWindow w(2, 100s, 2);
	const auto t0 = OwnerWindow::Clock::now();
	const PeerAddr a = v4("192.0.2.1"), b = v4("192.0.2.2"), c = v4("192.0.2.3");
	CHECK(w.admit(a, "k1", t0));
	CHECK(w.admit(a, "k2", t0 + 1s));
	CHECK_FALSE(w.admit(a, "k3", t0 + 2s));
	CHECK(w.admit(a, "k1", t0 + 50s)); // again: the same owner (a restart) is no new one
	CHECK(w.owners(a, t0 + 50s) == 2);
	CHECK(w.admit(b, "k3", t0 + 50s)); // another address has its own count
	// k2's entry ages out 100 s after its last bind; k1 was refreshed at 50 s.
	CHECK_FALSE(w.admit(a, "k3", t0 + 100s));
	CHECK(w.admit(a, "k3", t0 + 101s));
	CHECK(w.owners(a, t0 + 101s) == 2);
	// The table holds 2 addresses: a third is refused while theirs are live, admitted once
	// one has aged out.
	CHECK_FALSE(w.admit(c, "k9", t0 + 102s));
	CHECK(w.admit(c, "k9", t0 + 300s));
}

TEST_CASE("quota: a start keeps a full donor outside the set rather than fail (S8)",
	  "[quota][membership]")
{
	auto full = backend("full", 16);
	full->live_free = false;
	full->info.slabs_free = 0; // another volume took every slab
	auto empty = backend("empty", 16);
	auto connect = [&](const Endpoint &ep) -> std::unique_ptr<Server> {
		return std::make_unique<FakeServer>(ep.host == "full" ? full : empty);
	};
	auto cand = [](const char *n) {
		Membership::Candidate c; // a first start: no record, every donor may hold slabs
		c.ep = Endpoint{n, 7471};
		c.may_hold = true;
		return c;
	};
	SECTION("the only donor is full: the start keeps it (writes get ENOSPC, reads zeros)")
	{
		const std::vector<Membership::Candidate> cands{cand("full")};
		auto plan = Membership::plan_start(8, cands, connect);
		REQUIRE(plan.servers.size() == 1);
		CHECK_FALSE(plan.start[0].member); // outside the set: placement's last resort
		CHECK(plan.missing == 0);          // asked: it holds nothing of ours
	}
	SECTION("one of two donors is full: both kept (replicas=2 can start)")
	{
		const std::vector<Membership::Candidate> cands{cand("full"), cand("empty")};
		auto plan = Membership::plan_start(8, cands, connect);
		REQUIRE(plan.servers.size() == 2);
		for (const auto &st : plan.start)
			CHECK(st.member == (st.ep.host == "empty"));
	}
	SECTION("a set with no vacancy still drops the full donor it does not need")
	{
		const std::vector<Membership::Candidate> cands{cand("full"), cand("empty")};
		auto plan = Membership::plan_start(1, cands, connect);
		REQUIRE(plan.servers.size() == 1);
		CHECK(plan.start[0].ep.host == "empty");
	}
}
