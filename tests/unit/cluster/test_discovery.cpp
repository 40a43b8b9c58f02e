// SPDX-License-Identifier: MIT
// Unit tests for common/cluster/discovery (the plugin's etcd=): registry entries parsed (as the
// memserver writes them, and refused when malformed), server= merged with the donors, the
// donor cache file, and the default volume id with and without etcd=.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/cluster/discovery.h"
#include "common/volume/reattach.h"
#include "common/wire/protocol.h"
#include "memserver/registry.h"
#include "tests/support/results.h"
#include "tests/support/state_file_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::discovery;
using rdmaswap::test::value_or_why;
using rdmaswap::test::strs;
using rdmaswap::test::TempDir;

namespace {

RegistryOptions registry(const std::string &advertise)
{
	RegistryOptions o;
	o.prefix = "/rdmaswap/";
	o.advertise = advertise;
	o.transport = "tcp";
	o.auth = true;
	o.slab_size = 256 << 20;
	o.slabs_total = 64;
	o.boot_id = 0x00ab0000000000cdULL;
	return o;
}

} // namespace

TEST_CASE("discovery: what the memserver registers is parsed back", "[discovery]")
{
	for (const char *adv : {"10.0.0.7:7471", "[fd00::7]:7000", "donor-3.example:1"}) {
		const RegistryOptions o = registry(adv);
		std::string why;
		auto d = value_or_why(parse_donor("/rdmaswap/", registry_key(o),
						  registry_value(o, {.slabs_free = 60, .sessions = 5})),
				      why);
		INFO(adv << ": " << why);
		REQUIRE(d);
		CHECK(d->addr.str() == adv);
		CHECK(d->boot_id == 0x00ab0000000000cdULL);
		CHECK(d->transport == "tcp");
		CHECK(d->slab_size == 256u << 20);
		CHECK(d->slabs_total == 64);
		CHECK(d->slabs_free == 60);
		CHECK(d->sessions == 5);
		CHECK(d->auth);
	}
	// Another prefix: the key must be under it.
	RegistryOptions o = registry("10.0.0.7:7471");
	o.prefix = "/other/";
	std::string why;
	CHECK(value_or_why(
		parse_donor("/other/", registry_key(o), registry_value(o, {.slabs_free = 1})), why));
	CHECK_FALSE(
		value_or_why(parse_donor("/rdmaswap/", registry_key(o),
					 registry_value(o, {.slabs_free = 1})),
			     why));
	// Unknown fields are ignored (a later memserver may publish more).
	CHECK(value_or_why(
		parse_donor("/rdmaswap/", "/rdmaswap/donors/h:1",
			    R"({"addr":"h:1","boot_id":"0000000000000001","transport":"rdma",)"
			    R"("slab_size":1,"slabs_total":0,"slabs_free":0,"auth":false,"zone":"b"})"),
		why));
}

TEST_CASE("discovery: \"sessions\" is optional, and checked when present", "[discovery]")
{
	const std::string key = "/rdmaswap/donors/h:7471";
	// As a memserver before "sessions" registered itself: 0.
	const std::string old = R"({"addr":"h:7471","boot_id":"00000000000000ff","transport":"tcp",)"
				R"("slab_size":1048576,"slabs_total":8,"slabs_free":8,"auth":true})";
	auto with = [&](nlohmann::json v) {
		auto j = nlohmann::json::parse(old);
		j["sessions"] = v;
		return j.dump();
	};
	std::string why;
	auto d = value_or_why(parse_donor("/rdmaswap/", key, old), why);
	REQUIRE(d);
	CHECK(d->sessions == 0);
	CHECK(why.empty());
	d = value_or_why(parse_donor("/rdmaswap/", key, with(0)), why);
	REQUIRE(d);
	CHECK(d->sessions == 0);
	d = value_or_why(parse_donor("/rdmaswap/", key, with(7)), why);
	REQUIRE(d);
	CHECK(d->sessions == 7);
	d = value_or_why(parse_donor("/rdmaswap/", key, with(0xffffffffull)), why);
	REQUIRE(d);
	CHECK(d->sessions == 0xffffffffu);
	for (const nlohmann::json &bad :
	     {nlohmann::json(-1), nlohmann::json("3"), nlohmann::json(1ull << 32), nlohmann::json(1.5),
	      nlohmann::json(nullptr), nlohmann::json(true), nlohmann::json::array({1})}) {
		why.clear();
		const std::string value = with(bad);
		INFO(value);
		CHECK_FALSE(value_or_why(parse_donor("/rdmaswap/", key, value), why));
		CHECK(why.find("\"sessions\" is not an integer 0..4294967295") != std::string::npos);
	}
}

TEST_CASE("discovery: a malformed or incomplete entry is refused, saying why", "[discovery]")
{
	const std::string key = "/rdmaswap/donors/h:7471";
	auto refused = [&](const std::string &value, const std::string &k = "") {
		std::string why;
		const bool ok =
			value_or_why(parse_donor("/rdmaswap/", k.empty() ? key : k, value), why)
				.has_value();
		INFO(value << " -> " << why);
		CHECK_FALSE(ok);
		CHECK_FALSE(why.empty());
		return why;
	};
	const std::string good = R"({"addr":"h:7471","boot_id":"00000000000000ff","transport":"tcp",)"
				 R"("slab_size":1048576,"slabs_total":8,"slabs_free":8,"auth":true})";
	std::string why;
	REQUIRE(value_or_why(parse_donor("/rdmaswap/", key, good), why));
	// Each field missing in turn.
	for (const char *f : {"addr", "boot_id", "transport", "slab_size", "slabs_total",
			      "slabs_free", "auth"}) {
		auto j = nlohmann::json::parse(good);
		j.erase(f);
		CHECK(refused(j.dump()).find(f) != std::string::npos);
	}
	for (const char *junk : {"", "null", "[]", "7", "{", "\"h:7471\"", "{\"addr\":\"h:7471\""})
		refused(junk);
	auto with = [&](const char *field, nlohmann::json v) {
		auto j = nlohmann::json::parse(good);
		j[field] = v;
		return j.dump();
	};
	refused(with("addr", 7471));
	refused(with("addr", "h"), "/rdmaswap/donors/h");            // no port
	refused(with("addr", "h:0"), "/rdmaswap/donors/h:0");        // port 0
	refused(with("addr", "h:70000"), "/rdmaswap/donors/h:70000");
	refused(with("addr", "::1:7471"), "/rdmaswap/donors/::1:7471"); // bare IPv6
	refused(with("addr", "h:7472"));                              // not the key's address
	refused(good, "/rdmaswap/donors/h:7471/x");
	refused(good, "/rdmaswap/h:7471");
	refused(with("boot_id", "ff"));
	refused(with("boot_id", "00000000000000FF"));
	refused(with("boot_id", "0000000000000000"));
	refused(with("boot_id", "000000000000000g"));
	refused(with("boot_id", 255));
	refused(with("transport", "udp"));
	refused(with("slab_size", -1));
	refused(with("slab_size", 1.5));
	refused(with("slab_size", "1048576"));
	refused(with("slabs_total", 1ull << 32));
	refused(with("slabs_free", 9)); // more free than total
	refused(with("auth", "true"));
}

TEST_CASE("discovery: merge keeps server= and adds the donors it does not name", "[discovery]")
{
	const std::vector<Endpoint> servers{{"b", 2}, {"a", 1}};
	const std::vector<Endpoint> donors{{"a", 1}, {"c", 3}, {"a", 2}, {"c", 3}, {"b", 2}};
	CHECK(strs(merge(servers, donors)) == std::vector<std::string>{"b:2", "a:1", "c:3", "a:2"});
	CHECK(strs(merge(servers, {})) == std::vector<std::string>{"b:2", "a:1"});
	CHECK(strs(merge({}, donors)) == std::vector<std::string>{"a:1", "c:3", "a:2", "b:2"});
	// A server= entry named twice stays as given (the plugin's behaviour without etcd=).
	const std::vector<Endpoint> twice{{"a", 1}, {"a", 1}};
	CHECK(merge(twice, donors).size() == 5);
}

TEST_CASE("discovery: the cache text round trips and is checked", "[discovery]")
{
	const std::vector<Endpoint> donors{{"10.0.0.1", 7471}, {"fd00::2", 7000}};
	const std::string text = cache_text("/rdmaswap/", donors);
	std::string why;
	auto back = value_or_why(parse_cache(text, "/rdmaswap/"), why);
	REQUIRE(back);
	CHECK(strs(*back) == std::vector<std::string>{"10.0.0.1:7471", "[fd00::2]:7000"});
	CHECK(value_or_why(parse_cache(cache_text("/rdmaswap/", {}), "/rdmaswap/"), why)->empty());
	// Written for another etcd-prefix: refused (those are another cluster's donors).
	CHECK_FALSE(value_or_why(parse_cache(text, "/other/"), why));
	CHECK(why.find("/other/") != std::string::npos);
	for (const char *bad :
	     {"", "[]", R"({"version":2,"prefix":"/rdmaswap/","donors":[]})",
	      R"({"prefix":"/rdmaswap/","donors":[]})", R"({"version":1,"donors":[]})",
	      R"({"version":1,"prefix":"/rdmaswap/"})",
	      R"({"version":1,"prefix":"/rdmaswap/","donors":["h"]})",
	      R"({"version":1,"prefix":"/rdmaswap/","donors":[7471]})",
	      R"({"version":1,"prefix":"/rdmaswap/","donors":"h:1"})"}) {
		INFO(bad);
		CHECK_FALSE(value_or_why(parse_cache(bad, "/rdmaswap/"), why));
	}
}

TEST_CASE("discovery: the cache file is written whole, mode 0600, and read back", "[discovery]")
{
	TempDir dir;
	const std::string path = dir.path / "vol.donors";
	CHECK_FALSE(read_cache(path, "/p/")); // no file: nothing cached, not an error
	const ::mode_t old = ::umask(0);
	write_cache(path, "/p/", std::vector<Endpoint>{{"h", 1}, {"i", 2}});
	::umask(old);
	struct stat st {};
	REQUIRE(::stat(path.c_str(), &st) == 0);
	CHECK((st.st_mode & 0777) == 0600);
	auto got = read_cache(path, "/p/");
	REQUIRE(got);
	CHECK(strs(*got) == std::vector<std::string>{"h:1", "i:2"});
	// Replaced whole; no temporary file is left behind.
	write_cache(path, "/p/", std::vector<Endpoint>{{"j", 3}});
	CHECK(strs(*read_cache(path, "/p/")) == std::vector<std::string>{"j:3"});
	size_t files = 0;
	for ([[maybe_unused]] const auto &e : std::filesystem::directory_iterator(dir.path))
		files++;
	CHECK(files == 1);
	// A damaged file, a prefix of another cluster or a directory: an error naming the file.
	std::ofstream(path) << "{\"version\":1,\"prefix\":\"/p/\",\"donors\":[\"h:";
	CHECK_THROWS_WITH(read_cache(path, "/p/"), Catch::Contains(path));
	write_cache(path, "/p/", std::vector<Endpoint>{{"j", 3}});
	CHECK_THROWS_WITH(read_cache(path, "/q/"), Catch::Contains("/q/"));
	CHECK_THROWS(read_cache(dir.path, "/p/"));
	// A directory that does not exist: the write fails, naming the path.
	const std::string nowhere = dir.path / "no" / "vol.donors";
	CHECK_THROWS_WITH(write_cache(nowhere, "/p/", std::vector<Endpoint>{{"h", 1}}),
			  Catch::Contains(nowhere));
}

TEST_CASE("discovery: the default cache path", "[discovery]")
{
	CHECK(default_cache_path("/var/lib/rdmaswap/volume.key", "node1-1073741824-ecbed516") ==
	      "/var/lib/rdmaswap/node1-1073741824-ecbed516.donors");
	CHECK(default_cache_path("/s/volume.key", "a/b c%..") == "/s/a%2Fb%20c%25...donors");
	CHECK(default_cache_path("/s/volume.key", "..") == "/s/...donors");
}

TEST_CASE("discovery: the default volume id with etcd=", "[discovery][reattach]")
{
	const std::vector<Endpoint> a{{"10.0.0.2", 7471}, {"10.0.0.1", 7471}};
	const std::vector<Endpoint> none;
	// Without etcd= the id is what it was before etcd= existed (values of the code at
	// c14-etcd, 1dfd187): volumes made then reattach after an upgrade.
	CHECK(default_volume_name("node1", 1 << 30, a) == "node1-1073741824-ecbed516");
	CHECK(default_volume_name("node1", 1 << 30, none) == "node1-1073741824-4fd0bfc1");
	// With etcd=: server= and the prefix, never the donors etcd lists (the caller passes
	// server= only), so it does not change when they do; it changes with the prefix.
	const std::string e = default_volume_name("node1", 1 << 30, none, "/rdmaswap/");
	CHECK(proto::valid_volume_name(e));
	CHECK(e.rfind("node1-1073741824-", 0) == 0);
	CHECK(e != default_volume_name("node1", 1 << 30, none));
	CHECK(e != default_volume_name("node1", 1 << 30, none, "/other/"));
	CHECK(e == default_volume_name("node1", 1 << 30, none, std::string("/rdmaswap/")));
	const std::string ea = default_volume_name("node1", 1 << 30, a, "/rdmaswap/");
	CHECK(ea != e);
	CHECK(ea != default_volume_name("node1", 1 << 30, a));
	const std::vector<Endpoint> b{a[1], a[0]};
	CHECK(ea == default_volume_name("node1", 1 << 30, b, "/rdmaswap/"));
}

TEST_CASE("discovery: listing fails within its bound when etcd is down", "[discovery]")
{
	ListOptions o;
	o.endpoints = {"http://127.0.0.1:1", "http://127.0.0.1:1"}; // connection refused
	o.timeout = std::chrono::milliseconds(1500);
	std::string why;
	const auto t0 = std::chrono::steady_clock::now();
	CHECK_FALSE(value_or_why(list_donors(o), why));
	CHECK(why.find("127.0.0.1:1") != std::string::npos);
	CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
}

TEST_CASE("discovery: with etcd down, the cache, else server=, else an error", "[discovery]")
{
	TempDir dir;
	DiscoverOptions o;
	o.list.endpoints = {"http://127.0.0.1:1"}; // connection refused
	o.list.prefix = "/p/";
	o.list.timeout = std::chrono::milliseconds(1500);
	o.cache_path = dir.path / "vol.donors";
	std::string why;
	// Neither a cache nor server=: nothing to use, and the message says why.
	CHECK_FALSE(value_or_why(discover(o), why));
	CHECK(why.find("etcd is not reachable") != std::string::npos);
	CHECK(why.find(o.cache_path + ": there is none") != std::string::npos);
	CHECK(why.find("no memserver to use") != std::string::npos);
	// server= alone.
	o.servers = {{"s", 1}};
	auto d = value_or_why(discover(o), why);
	REQUIRE(d);
	CHECK(d->source == Discovered::Source::ServersOnly);
	CHECK(strs(d->servers) == std::vector<std::string>{"s:1"});
	// A cache: its donors, after server= (one of them named by server= already).
	write_cache(o.cache_path, "/p/", std::vector<Endpoint>{{"s", 1}, {"d", 2}});
	d = value_or_why(discover(o), why);
	REQUIRE(d);
	CHECK(d->source == Discovered::Source::Cache);
	CHECK(strs(d->donors) == std::vector<std::string>{"s:1", "d:2"});
	CHECK(strs(d->servers) == std::vector<std::string>{"s:1", "d:2"});
	o.servers.clear();
	d = value_or_why(discover(o), why);
	REQUIRE(d);
	CHECK(strs(d->servers) == std::vector<std::string>{"s:1", "d:2"});
	// A cache of another prefix is not used: an error naming it.
	o.list.prefix = "/q/";
	CHECK_FALSE(value_or_why(discover(o), why));
	CHECK(why.find("/q/") != std::string::npos);
	// Nor is a damaged one.
	o.list.prefix = "/p/";
	std::ofstream(o.cache_path) << "{";
	CHECK_FALSE(value_or_why(discover(o), why));
	CHECK(why.find(o.cache_path) != std::string::npos);
}
