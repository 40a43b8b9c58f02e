// SPDX-License-Identifier: MIT
// Unit tests for common/net/etcd (no server): base64, endpoint lists, request bodies, reply
// parsing, prefix ranges, and the memserver's registration value and an unreachable etcd.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "common/net/etcd.h"
#include "common/util/encoding.h"
#include "memserver/registry.h"

using namespace rdmaswap;
using namespace rdmaswap::etcd;

TEST_CASE("etcd: base64 round trips and matches RFC 4648", "[etcd]")
{
	// RFC 4648 section 10 test vectors.
	const std::pair<const char *, const char *> vec[] = {
		{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},         {"foo", "Zm9v"},
		{"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
	};
	for (auto [plain, enc] : vec) {
		CHECK(base64_encode(plain) == enc);
		CHECK(base64_decode(enc) == std::string(plain));
	}
	std::string all;
	for (int i = 0; i < 256; i++)
		all += char(i);
	CHECK(base64_decode(base64_encode(all)) == all);
	CHECK(base64_encode("\xff\xfe") == "//4=");
}

TEST_CASE("etcd: base64_decode refuses what is not padded base64", "[etcd]")
{
	for (const char *bad : {"Zg", "Zg=", "Zm9", "Z===", "Zg=a", "Zm9v!A==", "Zh==", "Zm9=",
				"Z m9v", "Zg==Zg=="})
		CHECK_FALSE(base64_decode(bad));
}

TEST_CASE("etcd: parse_endpoints", "[etcd]")
{
	auto eps = parse_endpoints("http://127.0.0.1:2379, http://127.0.0.1:22379/,https://[::1]:2379");
	REQUIRE(eps);
	CHECK(*eps == std::vector<std::string>{"http://127.0.0.1:2379", "http://127.0.0.1:22379",
					       "https://[::1]:2379"});
	auto one = parse_endpoints("http://etcd-1.example:2379");
	REQUIRE(one);
	CHECK(one->size() == 1);
	for (const char *bad : {"", ",", "http://a:1,", "127.0.0.1:2379", "ftp://a:1", "http://a",
				"http://a:0", "http://a:65536", "http://:2379", "http://a:2379/v3",
				"http://u@a:1", "http://::1:2379", "http://a:1x"}) {
		const auto r = parse_endpoints(bad);
		CHECK_FALSE(r);
		CHECK_FALSE(r.error.empty());
	}
}

TEST_CASE("etcd: prefix_range_end", "[etcd]")
{
	CHECK(prefix_range_end("/rdmaswap/donors/") == "/rdmaswap/donors0");
	CHECK(prefix_range_end("a\xff") == "b");
	CHECK(prefix_range_end("") == std::string(1, '\0'));
	CHECK(prefix_range_end("\xff\xff") == std::string(1, '\0'));
}

TEST_CASE("etcd: request bodies", "[etcd]")
{
	using nlohmann::json;
	CHECK(json::parse(lease_grant_body(10)) == json{{"TTL", 10}, {"ID", 0}});
	CHECK(json::parse(lease_id_body(7587883264171185668)) == json{{"ID", 7587883264171185668}});
	CHECK(json::parse(put_body("foo", "bar", 42)) ==
	      json{{"key", "Zm9v"}, {"value", "YmFy"}, {"lease", 42}});
	CHECK(json::parse(put_body("foo", "", 0)) == json{{"key", "Zm9v"}, {"value", ""}});
	CHECK(json::parse(range_body("foo", {})) == json{{"key", "Zm9v"}});
	CHECK(json::parse(range_body("fo", "fp")) == json{{"key", "Zm8="}, {"range_end", "ZnA="}});
}

TEST_CASE("etcd: reply parsing (replies of etcd 3.4.23)", "[etcd]")
{
	const char *hdr = R"("header":{"cluster_id":"3249","member_id":"3319","revision":"2","raft_term":"2"})";
	auto g = parse_lease_grant(std::string("{") + hdr +
				   R"(,"ID":"2324035596854780677","TTL":"10"})");
	REQUIRE(g);
	CHECK(g.value->id == 2324035596854780677);
	CHECK(g.value->ttl == 10);
	CHECK_FALSE(parse_lease_grant(std::string("{") + hdr + "}")); // no ID

	auto k = parse_lease_keepalive(std::string(R"({"result":{)") + hdr +
				       R"(,"ID":"2324035596854780679","TTL":"10"}})");
	REQUIRE(k);
	CHECK(k.value->ttl == 10);
	// A revoked or expired lease: the keepalive answers without a TTL.
	auto gone = parse_lease_keepalive(std::string(R"({"result":{)") + hdr +
					  R"(,"ID":"2324035596854780679"}})");
	REQUIRE(gone);
	CHECK(gone.value->ttl == 0);

	auto r = parse_range(std::string("{") + hdr +
			     R"(,"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"3",)"
			     R"("version":"2","value":"YmFy","lease":"2324035596854780679"}],"count":"1"})");
	REQUIRE(r);
	REQUIRE(r.value->size() == 1);
	CHECK(r.value->at(0).key == "foo");
	CHECK(r.value->at(0).value == "bar");
	CHECK(r.value->at(0).lease == 2324035596854780679);
	CHECK(r.value->at(0).create_revision == 2);
	CHECK(r.value->at(0).mod_revision == 3);
	CHECK(r.value->at(0).version == 2);
	auto none = parse_range(std::string("{") + hdr + "}");
	REQUIRE(none);
	CHECK(none.value->empty());
	CHECK_FALSE(parse_range(R"({"kvs":[{"key":"not base64!"}]})"));
	CHECK_FALSE(parse_range(R"({"kvs":{"key":"Zm9v"}})"));
	CHECK_FALSE(parse_range(R"({"kvs":[{"key":"Zm9v","lease":"12x"}]})"));

	auto d = parse_deleterange(std::string("{") + hdr + R"(,"deleted":"1"})");
	REQUIRE(d);
	CHECK(*d.value == 1);
	CHECK(*parse_deleterange(std::string("{") + hdr + "}").value == 0);

	auto err = parse_empty(R"({"error":"etcdserver: requested lease not found",)"
			       R"("message":"etcdserver: requested lease not found","code":5})");
	CHECK_FALSE(err);
	CHECK(err.code == kNotFound);
	CHECK(err.error.find("requested lease not found") != std::string::npos);
	CHECK(parse_empty(std::string("{") + hdr + "}"));
	for (const char *junk : {"", "null", "[1]", "{", "<html>502</html>"})
		CHECK_FALSE(parse_empty(junk));
}

TEST_CASE("etcd: a client fails within its bound when no endpoint answers", "[etcd]")
{
	// Port 1 on loopback: nothing listens there (connection refused at once).
	Client c({{"http://127.0.0.1:1", "http://127.0.0.1:1"}, std::chrono::milliseconds(500),
		  std::chrono::milliseconds(200)});
	const auto t0 = std::chrono::steady_clock::now();
	auto r = c.put("k", "v");
	CHECK_FALSE(r);
	CHECK(r.code == 0);
	CHECK(r.error.find("127.0.0.1:1") != std::string::npos);
	CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
	// interrupt(): calls fail at once until clear_interrupt().
	c.interrupt();
	auto i = c.get_prefix("/x/");
	CHECK_FALSE(i);
	CHECK(i.error.find("interrupted") != std::string::npos);
	c.clear_interrupt();
	CHECK(c.get("k").error.find("interrupted") == std::string::npos);
}

TEST_CASE("registry: key and value", "[etcd]")
{
	RegistryOptions o;
	o.prefix = "/rdmaswap/";
	o.advertise = "10.0.0.7:7471";
	o.transport = "tcp";
	o.auth = true;
	o.slab_size = 256 << 20;
	o.slabs_total = 64;
	o.boot_id = 0x00ab0000000000cdULL;
	CHECK(registry_key(o) == "/rdmaswap/donors/10.0.0.7:7471");
	auto v = nlohmann::json::parse(registry_value(o, {.slabs_free = 60, .sessions = 3}, 1234));
	CHECK(v == nlohmann::json{{"addr", "10.0.0.7:7471"},
				  {"boot_id", "00ab0000000000cd"},
				  {"transport", "tcp"},
				  {"slab_size", 256 << 20},
				  {"slabs_total", 64},
				  {"slabs_free", 60},
				  {"sessions", 3},
				  {"auth", true},
				  {"ts", 1234}}); // (no donor key: unsigned, test_signed_etcd.cpp)
	// No sessions is published as 0, not left out.
	CHECK(nlohmann::json::parse(registry_value(o, {.slabs_free = 64}))["sessions"] == 0);
	CHECK(make_boot_id() != 0);
	CHECK(make_boot_id() != make_boot_id());
}

TEST_CASE("etcd: watch body and stream messages (etcd 3.4.23)", "[etcd]")
{
	using nlohmann::json;
	CHECK(json::parse(watch_body("fo", "fp", 0)) ==
	      json{{"create_request", {{"key", "Zm8="}, {"range_end", "ZnA="}}}});
	CHECK(json::parse(watch_body("fo", "fp", 7)) ==
	      json{{"create_request", {{"key", "Zm8="}, {"range_end", "ZnA="}, {"start_revision", 7}}}});

	auto created = parse_watch_message(
		R"({"result":{"header":{"cluster_id":"1","member_id":"2","revision":"3","raft_term":"2"},"created":true}})");
	REQUIRE(created);
	CHECK(created.value->created);
	CHECK_FALSE(created.value->canceled);
	CHECK(created.value->revision == 3);
	CHECK(created.value->events.empty());

	auto ev = parse_watch_message(
		R"({"result":{"header":{"revision":"5"},"events":[)"
		R"({"kv":{"key":"Zm9v","create_revision":"4","mod_revision":"4","version":"1","value":"YmFy"}},)"
		R"({"type":"DELETE","kv":{"key":"Zm9v","mod_revision":"5"}}]}})");
	REQUIRE(ev);
	REQUIRE(ev.value->events.size() == 2);
	CHECK(ev.value->events[0].type == WatchEvent::Type::Put);
	CHECK(ev.value->events[0].kv.key == "foo");
	CHECK(ev.value->events[0].kv.value == "bar");
	CHECK(ev.value->events[1].type == WatchEvent::Type::Delete);
	CHECK(ev.value->events[1].kv.mod_revision == 5);

	auto compacted = parse_watch_message(
		R"({"result":{"header":{"raft_term":"2"},"canceled":true,"compact_revision":"2"}})");
	REQUIRE(compacted);
	CHECK(compacted.value->canceled);
	CHECK(compacted.value->compact_revision == 2);

	CHECK_FALSE(parse_watch_message(R"({"result":{"events":[{"type":"BOGUS","kv":{}}]}})"));
	CHECK_FALSE(parse_watch_message(R"({"result":{"events":[{"type":"PUT"}]}})"));
	CHECK_FALSE(parse_watch_message(R"({"result":{"created":"yes"}})"));
	auto err = parse_watch_message(R"({"error":{"grpc_code":14,"message":"no leader"}})");
	CHECK_FALSE(err);
	CHECK(err.error.find("no leader") != std::string::npos);
}
