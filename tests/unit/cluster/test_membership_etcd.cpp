// SPDX-License-Identifier: MIT
// Issue 26, "etcd decides nothing alone": a boot id in etcd is only a reason to ask the donor
// (S1), an address only etcd names never makes a chunk lost (S2), the donor table is bounded
// and ages out, registered donors are probed (newest first) before they join (S4/S5), probes
// run in parallel under one deadline (S6); and the bounded listing's helpers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/cluster/discovery.h"
#include "common/cluster/membership.h"
#include "common/cluster/probe.h"
#include "common/net/etcd.h"
#include "common/util/encoding.h"
#include "tests/support/fake_transport.h"
#include "tests/support/volume_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::test;
using namespace std::chrono_literals;

namespace {

discovery::Donor donor(const std::string &host, uint64_t boot = 0x1111)
{
	discovery::Donor d;
	d.addr = Endpoint{host, 7471};
	d.boot_id = boot;
	d.transport = "tcp";
	d.slabs_total = 16;
	d.slabs_free = 16;
	return d;
}

// Backends by host name; connect() makes a FakeServer of one (and throws for a host it does
// not know: a dead address).
struct Hosts {
	std::map<std::string, std::shared_ptr<FakeBackend>> backends;
	std::mutex mu;
	std::set<std::string> contacted, probed;
	std::vector<std::string> probe_order;
	Membership::Connect connect()
	{
		return [this](const Endpoint &ep) -> std::unique_ptr<Server> {
			{
				std::lock_guard lock(mu);
				contacted.insert(ep.host);
			}
			return std::make_unique<FakeServer>(backends.at(ep.host));
		};
	}
	// Answers for the hosts it knows, fails for the others.
	ProbeFn probe()
	{
		return [this](const Endpoint &ep, ProbeClock::time_point) -> Result<DonorLoad> {
			std::lock_guard lock(mu);
			probed.insert(ep.host);
			probe_order.push_back(ep.host);
			if (!backends.count(ep.host))
				return Result<DonorLoad>::fail("connection refused");
			return Result<DonorLoad>::of(DonorLoad{0, 16, true, 0});
		};
	}
	bool was_contacted(const std::string &h)
	{
		std::lock_guard lock(mu);
		return contacted.count(h) > 0;
	}
};

} // namespace

TEST_CASE("membership: a new boot id in etcd is only a reason to ask the donor (S1)",
	  "[membership][etcd]")
{
	quiet();
	Hosts h;
	auto a = backend("a", 16);
	h.backends["a"] = a;
	std::vector<std::unique_ptr<Server>> servers;
	servers.push_back(std::make_unique<FakeServer>(a));
	Server *sa = servers[0].get();
	auto v = std::make_unique<Volume>(std::move(servers), opts(4 * SS)); // replicas 1
	Bytes shadow(4 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(4 * SS, 7), 0) == 0);
	REQUIRE(a->live_slabs() == 4);

	Membership::Options mo;
	mo.spread = 0;
	mo.revision = 1; // (the start listed the registry: the registrations below say it all)
	mo.registered = {donor("a", 0x1111)};
	const std::vector<Membership::Start> st{{Endpoint{"a", 7471}, 0x1111, true, sa}};
	Membership m(*v, h.connect(), std::move(mo), st);
	m.step();
	CHECK(m.counters().boot_id_disbelieved == 0);

	// A forged boot id: the donor still holds the session, nothing is dropped.
	m.registration_put(donor("a", 0x2222));
	m.step();
	CHECK(m.counters().boot_id_disbelieved == 1);
	CHECK(v->stats().lost == 0);
	CHECK(a->live_slabs() == 4);
	CHECK(compare_all(*v, shadow) == -1);
	CHECK_FALSE(v->retired(0));
	// Asked once per boot id: the next steps do not ask again.
	m.step();
	m.step();
	CHECK(m.counters().boot_id_disbelieved == 1);
	CHECK(m.status_text().find("etcd_boot_id_disbelieved=1\n") != std::string::npos);

	// The donor really restarted: its session is gone; the new boot id makes the plugin ask,
	// and the donor's answer (no session) drops its replicas at once.
	a->lose_session();
	m.registration_put(donor("a", 0x3333));
	m.step();
	CHECK(v->retired(0));
	uint8_t b[64];
	CHECK(v->pread(b, sizeof b, 0) == EIO); // lost: an error, never zeros
	CHECK(m.counters().boot_id_disbelieved == 1);
}

TEST_CASE("membership: with no way to ask the donor, a new boot id in etcd is not believed",
	  "[membership][etcd]")
{
	quiet();
	Hosts h;
	auto a = backend("a", 16);
	h.backends["a"] = a;
	auto v = make_volume({a}, opts(4 * SS));
	Bytes shadow(4 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(4 * SS, 3), 0) == 0);
	Membership::Options mo;
	mo.spread = 0;
	const std::vector<Membership::Start> st{{Endpoint{"a", 7471}, 0x1111, true}}; // no server
	Membership m(*v, h.connect(), std::move(mo), st);
	m.registration_put(donor("a", 0x9999));
	m.step();
	CHECK(v->stats().lost == 0);
	CHECK(compare_all(*v, shadow) == -1);
}

TEST_CASE("membership: the table is bounded, ages out, and a donor registered later is used "
	  "(S4/S5)",
	  "[membership][etcd]")
{
	quiet();
	Hosts h;
	h.backends["a"] = backend("a", 16);
	h.backends["real"] = backend("real", 16);
	auto v = make_volume({h.backends["a"]}, opts(4 * SS));
	Membership::Options mo;
	mo.spread = 2; // one vacancy beside a
	mo.probe = h.probe();
	mo.age_out = 50ms;
	mo.revision = 1;
	const std::vector<Membership::Start> st{{Endpoint{"a", 7471}, 0, true}};
	Membership m(*v, h.connect(), std::move(mo), st);
	// More junk registrations than the table holds: the rest is ignored and counted.
	std::vector<discovery::Donor> junk{donor("a")};
	const size_t n = Membership::kMaxEntries + 1000;
	for (size_t i = 0; i < n; i++)
		junk.push_back(donor("junk" + std::to_string(i)));
	REQUIRE_NOTHROW(m.set_registered(junk));
	auto c = m.counters();
	CHECK(c.known == Membership::kMaxEntries);
	CHECK(c.ignored_beyond == n + 1 - Membership::kMaxEntries);
	// A step probes a bounded batch (and connects nothing it did not probe).
	REQUIRE_NOTHROW(m.step());
	c = m.counters();
	CHECK(c.probes_failed == Membership::kProbeBatch);
	CHECK(c.probes_ok == 0);
	CHECK(v->servers() == 1);
	// The table is full: a donor registered now is ignored (counted)...
	m.registration_put(donor("real"));
	CHECK(m.counters().ignored_beyond == n + 2 - Membership::kMaxEntries);
	// ... until junk leaves etcd and ages out.
	for (size_t i = 0; i < 100; i++)
		m.registration_gone(Endpoint{"junk" + std::to_string(i), 7471});
	m.step(); // (starts their age)
	std::this_thread::sleep_for(60ms);
	m.step();
	c = m.counters();
	CHECK(c.aged_out == 100);
	CHECK(c.known == Membership::kMaxEntries - 100);
	// Registered now: probed first (the newest), then made a member and connected.
	m.registration_put(donor("real"));
	m.step();
	{
		std::lock_guard lock(h.mu);
		REQUIRE(h.probe_order.size() >= Membership::kProbeBatch);
		CHECK(std::find(h.probe_order.end() - Membership::kProbeBatch, h.probe_order.end(),
				"real") != h.probe_order.end());
	}
	m.step();
	CHECK(v->servers() == 2);
	CHECK(h.was_contacted("real"));
	// No junk was ever connected: only what answered a probe.
	std::lock_guard lock(h.mu);
	for (const auto &host : h.contacted)
		CHECK(host.rfind("junk", 0) != 0);
}

TEST_CASE("membership: spread 0 connects registered donors once they answered a probe",
	  "[membership][etcd]")
{
	quiet();
	Hosts h;
	h.backends["a"] = backend("a", 16);
	h.backends["b"] = backend("b", 16);
	auto v = make_volume({h.backends["a"]}, opts(4 * SS));
	Membership::Options mo;
	mo.spread = 0;
	mo.probe = h.probe();
	mo.revision = 1;
	const std::vector<Membership::Start> st{{Endpoint{"a", 7471}, 0, true}};
	Membership m(*v, h.connect(), std::move(mo), st);
	m.set_registered(std::vector<discovery::Donor>{donor("a"), donor("b"), donor("dead")});
	m.step(); // probes b and dead
	CHECK_FALSE(h.was_contacted("b"));
	m.step(); // connects b
	CHECK(v->servers() == 2);
	CHECK_FALSE(h.was_contacted("dead"));
	CHECK(m.counters().probes_ok == 1);
	CHECK(m.counters().probes_failed == 1);
}

TEST_CASE("membership: a donor recorded for a connect that fails leaves the record again (S2)",
	  "[membership][etcd]")
{
	quiet();
	Hosts h;
	h.backends["a"] = backend("a", 16);
	auto v = make_volume({h.backends["a"]}, opts(4 * SS));
	std::vector<std::vector<std::string>> stored;
	Membership::Options mo;
	mo.spread = 0;
	mo.recorded = {Endpoint{"a", 7471}};
	mo.record = [&](const std::vector<Endpoint> &eps) {
		std::vector<std::string> names;
		for (const auto &e : eps)
			names.push_back(e.str());
		stored.push_back(names);
		return Result<Ok>::of({});
	};
	const std::vector<Membership::Start> st{{Endpoint{"a", 7471}, 0, true}};
	Membership m(*v, h.connect(), std::move(mo), st);
	m.registration_put(donor("ghost")); // (no probe configured: connected at once; it fails)
	m.step();
	REQUIRE(stored.size() == 2);
	CHECK(stored[0] == std::vector<std::string>{"a:7471", "ghost:7471"});
	CHECK(stored[1] == std::vector<std::string>{"a:7471"});
}

TEST_CASE("membership: a start counts as missing only donors not named by etcd alone (S2)",
	  "[membership][etcd]")
{
	quiet();
	Hosts h;
	for (const char *n : {"a", "b", "c"})
		h.backends[n] = backend(n, 16);
	h.backends["a"]->reattach = true;
	h.backends["a"]->floors[0] = 1; // a kept something for the volume
	std::vector<Membership::Candidate> cands(5);
	cands[0].ep = Endpoint{"a", 7471};
	cands[0].may_hold = true; // in the local record
	cands[1].ep = Endpoint{"dead", 7471};
	cands[1].may_hold = true; // etcd's copy of the record alone, and it does not answer
	cands[1].may_miss = false;
	cands[1].reachable = false;
	cands[2].ep = Endpoint{"b", 7471};
	cands[2].may_hold = true; // etcd's copy alone; it answers and kept nothing
	cands[2].may_miss = false;
	cands[3].ep = Endpoint{"c", 7471}; // registered, not probed in time
	cands[3].probed = false;
	cands[4].ep = Endpoint{"d", 7471}; // registered, probed: it did not answer
	cands[4].reachable = false;
	auto plan = Membership::plan_start(3, cands, h.connect());
	CHECK(plan.missing == 0);
	std::set<std::string> rec;
	for (const auto &e : plan.record)
		rec.insert(e.host);
	CHECK(rec.count("dead") == 0);
	CHECK(rec.count("a") == 1);
	CHECK_FALSE(h.was_contacted("c")); // not probed: not chosen at start
	CHECK_FALSE(h.was_contacted("dead"));
	CHECK(plan.start_holders == 1); // a
	for (const auto &s : plan.start)
		CHECK(s.server != nullptr);
}

TEST_CASE("probe_all: in parallel, under one deadline", "[membership][probe]")
{
	// 12 silent donors (each probe waits out its whole bound) and 3 that answer.
	std::vector<ProbeTarget> targets;
	for (int i = 0; i < 12; i++)
		targets.push_back({Endpoint{"silent" + std::to_string(i), 1}, 10s});
	for (int i = 0; i < 3; i++)
		targets.push_back({Endpoint{"ok" + std::to_string(i), 1}, 10s});
	ProbeFn probe = [](const Endpoint &ep, ProbeClock::time_point deadline) -> Result<DonorLoad> {
		if (ep.host.rfind("silent", 0) == 0) {
			std::this_thread::sleep_until(deadline);
			return Result<DonorLoad>::fail("timed out");
		}
		return Result<DonorLoad>::of(DonorLoad{1, 8, true, 2});
	};
	SECTION("enough workers: every probe runs; the batch ends at its deadline")
	{
		const auto t0 = ProbeClock::now();
		auto out = probe_all(targets, probe, t0 + 300ms, 16);
		const auto took = ProbeClock::now() - t0;
		CHECK(took >= 300ms);
		CHECK(took < 2500ms); // (not 12 x 300 ms; slack for sanitizer builds, loaded hosts)
		REQUIRE(out.size() == targets.size());
		for (size_t i = 0; i < 12; i++)
			CHECK(out[i].state == ProbeOutcome::State::Failed);
		for (size_t i = 12; i < 15; i++) {
			CHECK(out[i].state == ProbeOutcome::State::Ok);
			CHECK(out[i].load.total == 8);
		}
	}
	SECTION("few workers and short bounds: what did not start by the deadline is NotRun")
	{
		for (auto &t : targets)
			t.bound = 100ms;
		const auto t0 = ProbeClock::now();
		auto out = probe_all(targets, probe, t0 + 250ms, 2);
		CHECK(ProbeClock::now() - t0 < 1000ms);
		size_t not_run = 0;
		for (const auto &o : out)
			not_run += o.state == ProbeOutcome::State::NotRun;
		CHECK(not_run >= 8);
	}
	SECTION("enough() stops the batch")
	{
		std::vector<ProbeTarget> fast(targets.begin() + 12, targets.end());
		fast.insert(fast.end(), targets.begin(), targets.begin() + 12);
		auto out = probe_all(fast, probe, ProbeClock::now() + 5s, 1,
				     [](std::span<const ProbeOutcome> o) {
					     return std::count_if(o.begin(), o.end(), [](const auto &x) {
							    return x.state == ProbeOutcome::State::Ok;
						    }) >= 2;
				     });
		CHECK(out[0].state == ProbeOutcome::State::Ok);
		CHECK(out[1].state == ProbeOutcome::State::Ok);
		CHECK(out[2].state == ProbeOutcome::State::NotRun);
	}
	SECTION("a probe that throws is a failure")
	{
		ProbeFn bad = [](const Endpoint &, ProbeClock::time_point) -> Result<DonorLoad> {
			throw std::runtime_error("cannot resolve");
		};
		auto out = probe_all(std::span(targets).first(2), bad, ProbeClock::now() + 1s, 4);
		CHECK(out[0].state == ProbeOutcome::State::Failed);
		CHECK(out[0].why == "cannot resolve");
	}
}

TEST_CASE("discovery: check_donor ignores large and malformed entries, counted", "[discovery]")
{
	discovery::Ignored ig;
	const std::string ok = nlohmann::json{{"addr", "h:1"},
					     {"boot_id", "00000000000000ab"},
					     {"transport", "tcp"},
					     {"slab_size", 1},
					     {"slabs_total", 2},
					     {"slabs_free", 1},
					     {"auth", true}}
				       .dump();
	CHECK(discovery::check_donor("/p/", "/p/donors/h:1", ok, ig));
	CHECK(ig.total() == 0);
	std::string big = ok;
	big.insert(big.size() - 1, ",\"pad\":\"" + std::string(discovery::kMaxValue, 'x') + "\"");
	CHECK_FALSE(discovery::check_donor("/p/", "/p/donors/h:1", big, ig));
	for (int i = 0; i < 5; i++)
		CHECK_FALSE(discovery::check_donor("/p/", "/p/donors/x" + std::to_string(i), "junk", ig));
	CHECK(ig.too_large == 1);
	CHECK(ig.invalid == 5);
	CHECK(ig.examples.size() == discovery::Ignored::kExamples);
	const std::string s = ig.summary();
	CHECK(s.find("6 entries ignored (5 malformed, 1 larger than 4096 bytes)") == 0);
	CHECK(s.find("/p/donors/h:1: a value of") != std::string::npos);
	CHECK(discovery::donor_key_addr("/p/", "/p/donors/h:12") == Endpoint{"h", 12});
	CHECK_FALSE(discovery::donor_key_addr("/p/", "/p/donors/junk"));
	CHECK_FALSE(discovery::donor_key_addr("/p/", "/q/donors/h:12"));
}

TEST_CASE("etcd: range pages (body and reply of etcd 3.4.23)", "[etcd]")
{
	using nlohmann::json;
	const json b = json::parse(etcd::range_page_body("/p/", "/p0", 256, 42, true));
	CHECK(b["key"] == base64_encode("/p/"));
	CHECK(b["range_end"] == base64_encode("/p0"));
	CHECK(b["limit"] == 256);
	CHECK(b["revision"] == 42);
	CHECK(b["keys_only"] == true);
	const json plain = json::parse(etcd::range_page_body("/p/", "/p0", 0, 0, false));
	CHECK_FALSE(plain.contains("limit"));
	CHECK_FALSE(plain.contains("revision"));
	CHECK_FALSE(plain.contains("keys_only"));
	auto r = etcd::parse_range_page(
		R"({"header":{"cluster_id":"1","member_id":"2","revision":"77","raft_term":"3"},)"
		R"("kvs":[{"key":"L3AvYQ==","create_revision":"5","mod_revision":"6","version":"1",)"
		R"("value":"MQ=="}],"more":true,"count":"4100"})");
	REQUIRE(r);
	CHECK(r.value->revision == 77);
	CHECK(r.value->more);
	CHECK(r.value->count == 4100);
	REQUIRE(r.value->kvs.size() == 1);
	CHECK(r.value->kvs[0].key == "/p/a");
	auto empty = etcd::parse_range_page(R"({"header":{"revision":"9"}})");
	REQUIRE(empty);
	CHECK_FALSE(empty.value->more);
	CHECK(empty.value->kvs.empty());
	CHECK_FALSE(etcd::parse_range_page(R"({"more":"yes"})"));
	auto err = etcd::parse_range_page(
		R"({"error":"etcdserver: mvcc: required revision has been compacted","code":11})");
	CHECK_FALSE(err);
	CHECK(err.code == etcd::kOutOfRange);
}
