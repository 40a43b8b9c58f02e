// SPDX-License-Identifier: MIT
// Membership's start (plan_start): which donors a start contacts, keeps and counts as missing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <map>
#include <set>

#include "common/cluster/membership.h"
#include "tests/support/fake_transport.h"
#include "tests/support/volume_helpers.h"

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

// Issue 29: a holders record that names donors no longer known (dead, never registered this
// run) and a donor registered at runtime. step() records the new donor (keeping the unknown
// ones, in name order) and connects it; it used to throw std::out_of_range (index_.at) on the
// membership thread, where nothing caught it, and nbdkit aborted.
TEST_CASE("membership: a record naming unknown donors is kept when a registered donor joins",
	  "[membership]")
{
	quiet();
	Cluster c{"a", "b", "c"};
	std::vector<std::shared_ptr<FakeBackend>> start{c.backends.at("a"), c.backends.at("b")};
	auto o = opts(4 * SS, 2);
	o.replicas = 2;
	auto v = make_volume(start, o);
	std::vector<std::vector<Endpoint>> stored;
	Membership::Options mo;
	mo.spread = 0; // every registered donor wanted
	mo.recorded = {Endpoint{"a", 7471}, Endpoint{"b", 7471}, Endpoint{"dead1", 7471},
		       Endpoint{"dead2", 7471}};
	mo.record = [&](const std::vector<Endpoint> &eps) {
		stored.push_back(eps);
		return Result<Ok>::of({});
	};
	const std::vector<Membership::Start> st{{Endpoint{"a", 7471}, 0, true},
						{Endpoint{"b", 7471}, 0, true}};
	Membership m(*v, c.connect(), std::move(mo), st);
	std::vector<discovery::Donor> reg(3);
	reg[0].addr = Endpoint{"a", 7471};
	reg[1].addr = Endpoint{"b", 7471};
	reg[2].addr = Endpoint{"c", 7471};
	for (auto &d : reg) {
		d.slabs_total = 16;
		d.slabs_free = 16;
	}
	m.set_registered(reg);

	unsigned added = 0;
	REQUIRE_NOTHROW(added = m.step());
	CHECK(added == 1);
	CHECK(c.contacted.count("c") == 1);
	CHECK(v->servers() == 3);
	REQUIRE(stored.size() == 1);
	std::vector<std::string> got;
	for (const auto &ep : stored[0])
		got.push_back(ep.str());
	// Every donor once, sorted by name; the unknown ones kept.
	CHECK(got == std::vector<std::string>{"a:7471", "b:7471", "c:7471", "dead1:7471",
					      "dead2:7471"});
	// Nothing new: the record is not stored again.
	REQUIRE_NOTHROW(m.step());
	CHECK(stored.size() == 1);
}

// Issue 29: the step thread is an exception boundary. Steps that throw are caught (logged once)
// and the thread carries on: a donor registered meanwhile is connected by a later step.
TEST_CASE("membership: the step thread survives steps that throw", "[membership]")
{
	quiet();
	Cluster c{"a", "b"};
	auto o = opts(4 * SS, 2);
	auto v = make_volume({c.backends.at("a")}, o);
	Membership::Options mo;
	mo.interval = std::chrono::milliseconds(20);
	std::atomic<int> throws{3};
	mo.fault = [&] {
		if (throws.load() > 0 && throws.fetch_sub(1) > 0)
			throw std::out_of_range("test fault");
	};
	const std::vector<Membership::Start> st{{Endpoint{"a", 7471}, 0, true}};
	Membership m(*v, c.connect(), std::move(mo), st);
	std::vector<discovery::Donor> reg(2);
	reg[0].addr = Endpoint{"a", 7471};
	reg[1].addr = Endpoint{"b", 7471};
	m.set_registered(reg);
	m.start();
	CHECK(eventually([&] { return v->servers() == 2; }, std::chrono::seconds(5)));
	CHECK(throws.load() <= 0);
	m.stop();
}
