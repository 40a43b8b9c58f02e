// SPDX-License-Identifier: MIT
// Membership's start (plan_start): which donors a start contacts, keeps and counts as missing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "common/membership.h"
#include "fake_transport.h"
#include "volume_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::test;

namespace {

struct Cluster {
	std::map<std::string, std::shared_ptr<FakeBackend>> backends;
	std::set<std::string> contacted;
	Cluster(std::initializer_list<const char *> names)
	{
		for (const char *n : names)
			backends[n] = backend(n, 16);
	}
	Membership::Connect connect()
	{
		return [this](const Endpoint &ep) -> std::unique_ptr<Server> {
			contacted.insert(ep.host);
			return std::make_unique<FakeServer>(backends.at(ep.host));
		};
	}
	// A donor that kept slabs for the volume from an earlier run.
	void kept(const char *n)
	{
		auto &b = backends.at(n);
		b->reattach = true;
		b->floors[0] = 1;
	}
	std::vector<Membership::Candidate> candidates(std::set<std::string> may_hold,
						      std::set<std::string> unreachable = {})
	{
		std::vector<Membership::Candidate> out;
		for (const auto &[n, b] : backends) {
			Membership::Candidate c;
			c.ep = Endpoint{n, 7471};
			c.may_hold = may_hold.count(n) > 0;
			c.reachable = !unreachable.count(n);
			out.push_back(c);
		}
		return out;
	}
};

std::set<std::string> names(const Membership::StartPlan &p)
{
	std::set<std::string> out;
	for (const auto &s : p.start)
		out.insert(s.ep.host);
	return out;
}

std::set<std::string> record(const Membership::StartPlan &p)
{
	std::set<std::string> out;
	for (const auto &e : p.record)
		out.insert(e.host);
	return out;
}

} // namespace

TEST_CASE("membership: a start without a record asks every donor, keeps what kept something "
	  "and the set's members",
	  "[membership]")
{
	quiet();
	Cluster c{"a", "b", "c", "d"};
	c.kept("c");
	const auto cands = c.candidates({"a", "b", "c", "d"});
	auto plan = Membership::plan_start(2, cands, c.connect());
	CHECK(c.contacted.size() == 4);
	REQUIRE(plan.servers.size() == 2);
	CHECK(names(plan).count("c") == 1); // it kept something: kept, and a member first
	CHECK(plan.start_holders == 2);     // all of them may hold slabs (no record)
	CHECK(plan.missing == 2);           // the two left handed back nothing: maybe restarted
	CHECK(record(plan) == names(plan));
	for (const auto &s : plan.start)
		CHECK(s.member);
}

TEST_CASE("membership: a start with a record contacts only its donors; missing counts only them",
	  "[membership]")
{
	quiet();
	Cluster c{"a", "b", "c", "d", "e"};
	c.kept("a");
	SECTION("every recorded donor answers")
	{
		const auto cands = c.candidates({"a", "b"});
		auto plan = Membership::plan_start(3, cands, c.connect());
		// a and b asked; one more member chosen among c, d, e and connected.
		REQUIRE(plan.servers.size() == 3);
		CHECK(names(plan).count("a") == 1);
		CHECK(names(plan).count("b") == 1);
		CHECK(c.contacted.size() == 3);
		CHECK(plan.start_holders == 2); // a, b: the fresh member is not expected to hold any
		CHECK(plan.missing == 0);
		CHECK(record(plan) == names(plan));
	}
	SECTION("a recorded donor does not answer: missing, and kept in the record")
	{
		const auto cands = c.candidates({"a", "b"}, {"b"});
		auto plan = Membership::plan_start(2, cands, c.connect());
		CHECK(c.contacted.count("b") == 0);
		CHECK(plan.missing == 1);
		CHECK(record(plan).count("b") == 1);
		CHECK(names(plan).count("b") == 0);
		CHECK(names(plan).count("a") == 1);
		CHECK(plan.servers.size() == 2); // a and one fresh member
	}
	SECTION("spread 0: every recorded donor that answers, no fresh member")
	{
		const auto cands = c.candidates({"a", "b"});
		auto plan = Membership::plan_start(0, cands, c.connect());
		CHECK(names(plan) == std::set<std::string>{"a", "b"});
		CHECK(c.contacted == std::set<std::string>{"a", "b"});
		CHECK(plan.missing == 0);
	}
}
