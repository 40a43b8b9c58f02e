// SPDX-License-Identifier: MIT
// Unit tests for common/cluster/holders (issue 14): the holders record's text and its refusals, the
// local file (written whole, mode 0600, read back with bounds), its default path and etcd key,
// the etcd calls failing within their bound when nothing listens, and (issue 29) the
// unreachable times it keeps and the aging that bounds it.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/cluster/holders.h"
#include "tests/support/results.h"
#include "tests/support/state_file_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::holders;
using rdmaswap::test::value_or_why;
using rdmaswap::test::strs;
using rdmaswap::test::TempDir;

namespace {

// A loopback port that nothing listens on: bound, then closed.
uint16_t closed_port()
{
	const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	REQUIRE(fd >= 0);
	sockaddr_in a{};
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t len = sizeof a;
	REQUIRE(::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
	REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0);
	::close(fd);
	return ntohs(a.sin_port);
}

} // namespace

TEST_CASE("holders: the record text round trips, sorted and without duplicates", "[holders]")
{
	const std::vector<Endpoint> donors{
		{"10.0.0.2", 7471}, {"fd00::2", 7000}, {"10.0.0.1", 7471}, {"10.0.0.2", 7471}};
	const std::string text = record_text("vol-1", donors);
	CHECK(text == R"({"donors":["10.0.0.1:7471","10.0.0.2:7471","[fd00::2]:7000"],)"
		      R"("version":1,"volume":"vol-1"})"
		      "\n");
	std::string why;
	auto back = value_or_why(parse_record(text, "vol-1"), why);
	REQUIRE(back);
	CHECK(strs(*back) ==
	      std::vector<std::string>{"10.0.0.1:7471", "10.0.0.2:7471", "[fd00::2]:7000"});
	CHECK(record_text("vol-1", *back) == text);
	// A volume that holds nothing.
	back = value_or_why(parse_record(record_text("vol-1", {}), "vol-1"), why);
	REQUIRE(back);
	CHECK(back->empty());
	// Written by another hand: unsorted, a duplicate, an unknown field: accepted, made
	// canonical.
	back = value_or_why(
		parse_record(R"({"version":1,"volume":"v","donors":["b:2","a:1","b:2"],"x":true})", "v"),
		why);
	REQUIRE(back);
	CHECK(strs(*back) == std::vector<std::string>{"a:1", "b:2"});
}

TEST_CASE("holders: parse_record refuses what is not the volume's record, saying why",
	  "[holders]")
{
	std::string why;
	const auto refused = [&](std::string_view text, std::string_view expect) {
		INFO(text);
		why.clear();
		CHECK_FALSE(value_or_why(parse_record(text, "v"), why));
		CHECK_THAT(why, Catch::Contains(std::string(expect)));
	};
	refused("", "not a JSON object");
	refused("{", "not a JSON object");
	refused("[]", "not a JSON object");
	refused(R"({"volume":"v","donors":[]})", "not version 1");
	refused(R"({"version":2,"volume":"v","donors":[]})", "not version 1");
	refused(R"({"version":"1","volume":"v","donors":[]})", "not version 1");
	refused(R"({"version":1,"donors":[]})", "no \"volume\"");
	refused(R"({"version":1,"volume":7,"donors":[]})", "\"volume\" is not a string");
	refused(R"({"version":1,"volume":"w","donors":[]})", "volume w, not v");
	refused(R"({"version":1,"volume":"v"})", "no \"donors\" list");
	refused(R"({"version":1,"volume":"v","donors":"h:1"})", "no \"donors\" list");
	refused(R"({"version":1,"volume":"v","donors":["h"]})", "donor \"h\" is not HOST:PORT");
	refused(R"({"version":1,"volume":"v","donors":["h:0"]})", "\"h:0\"");
	refused(R"({"version":1,"volume":"v","donors":["h:65536"]})", "\"h:65536\"");
	refused(R"({"version":1,"volume":"v","donors":["a:1",7471]})", "donor 7471 is not");
	refused(R"({"version":1,"volume":"v","donors":["a b:1"]})", "is not HOST:PORT");
}

TEST_CASE("holders: the file is written whole, mode 0600, and read back", "[holders]")
{
	TempDir dir;
	const std::string path = dir.path / "vol.holders";
	CHECK_FALSE(read_file(path, "vol")); // none: nothing recorded, not an error
	const ::mode_t old = ::umask(0);
	write_file(path, "vol", std::vector<Endpoint>{{"i", 2}, {"h", 1}});
	::umask(old);
	struct stat st {};
	REQUIRE(::stat(path.c_str(), &st) == 0);
	CHECK((st.st_mode & 0777) == 0600);
	auto got = read_file(path, "vol");
	REQUIRE(got);
	CHECK(strs(*got) == std::vector<std::string>{"h:1", "i:2"});
	// Replaced whole; no temporary file is left behind.
	write_file(path, "vol", std::vector<Endpoint>{});
	got = read_file(path, "vol");
	REQUIRE(got);
	CHECK(got->empty());
	size_t files = 0;
	for ([[maybe_unused]] const auto &e : std::filesystem::directory_iterator(dir.path))
		files++;
	CHECK(files == 1);
	// Another volume's record, a damaged file, a directory: errors naming the file.
	CHECK_THROWS_WITH(read_file(path, "other"),
			  Catch::Contains(path) && Catch::Contains("other"));
	std::ofstream(path) << R"({"version":1,"volume":"vol","donors":["h:)";
	CHECK_THROWS_WITH(read_file(path, "vol"), Catch::Contains(path));
	CHECK_THROWS_WITH(read_file(dir.path, "vol"), Catch::Contains(dir.path.string()) &&
							  Catch::Contains("not a regular file"));
	// A symbolic link, even to a good record, is refused (O_NOFOLLOW).
	const std::string good = dir.path / "good.holders", link = dir.path / "link.holders";
	write_file(good, "vol", std::vector<Endpoint>{{"h", 1}});
	std::filesystem::create_symlink(good, link);
	CHECK_THROWS_WITH(read_file(link, "vol"),
			  Catch::Contains(link) && Catch::Contains("symbolic link"));
	// More than 1 MiB: refused before it is read.
	const std::string big = dir.path / "big.holders";
	{
		std::ofstream f(big);
		f << R"({"version":1,"volume":"vol","donors":[])" << std::string(1 << 20, ' ')
		  << "}";
	}
	CHECK_THROWS_WITH(read_file(big, "vol"),
			  Catch::Contains(big) && Catch::Contains("larger than"));
	// A directory that does not exist: the write fails, naming the path.
	const std::string nowhere = dir.path / "no" / "vol.holders";
	CHECK_THROWS_WITH(write_file(nowhere, "vol", std::vector<Endpoint>{{"h", 1}}),
			  Catch::Contains(nowhere));
}

TEST_CASE("holders: unreachable times round trip; a record without them is the old format",
	  "[holders]")
{
	const std::vector<Endpoint> donors{{"b", 2}, {"a", 1}, {"c", 3}};
	// Times of donors not in the list are left out; none left: the text of before.
	const Unreachable since{{"a:1", 1700000000}, {"z:9", 5}};
	const std::string text = record_text("v", donors, since);
	CHECK(text == R"({"donors":["a:1","b:2","c:3"],"unreachable_since":{"a:1":1700000000},)"
		      R"("version":1,"volume":"v"})"
		      "\n");
	CHECK(record_text("v", donors, Unreachable{{"z:9", 5}}) == record_text("v", donors));
	std::string why;
	Unreachable got{{"stale:1", 1}};
	auto back = value_or_why(parse_record(text, "v", &got), why);
	REQUIRE(back);
	CHECK(strs(*back) == std::vector<std::string>{"a:1", "b:2", "c:3"});
	CHECK(got == Unreachable{{"a:1", 1700000000}});
	// The old format (no field): no times (a start takes them as "since now"); cleared.
	back = value_or_why(parse_record(record_text("v", donors), "v", &got), why);
	REQUIRE(back);
	CHECK(got.empty());
	// Written by another hand: a time of a donor not listed is dropped.
	back = value_or_why(parse_record(R"({"version":1,"volume":"v","donors":["a:1"],)"
			    R"("unreachable_since":{"a:1":7,"b:2":8}})",
			    "v", &got), why);
	REQUIRE(back);
	CHECK(got == Unreachable{{"a:1", 7}});
	// Refused: not an object, a time that is not a non-negative integer.
	const auto refused = [&](std::string_view t, std::string_view expect) {
		INFO(t);
		why.clear();
		CHECK_FALSE(value_or_why(parse_record(t, "v", &got), why));
		CHECK_THAT(why, Catch::Contains(std::string(expect)));
	};
	refused(R"({"version":1,"volume":"v","donors":["a:1"],"unreachable_since":[]})",
		"\"unreachable_since\" is not an object");
	refused(R"({"version":1,"volume":"v","donors":["a:1"],"unreachable_since":{"a:1":-1}})",
		"of a:1 is not an integer");
	refused(R"({"version":1,"volume":"v","donors":["a:1"],"unreachable_since":{"a:1":"7"}})",
		"of a:1 is not an integer");
	// The file keeps them too.
	TempDir dir;
	const std::string path = dir.path / "v.holders";
	write_file(path, "v", donors, since);
	got.clear();
	back = read_file(path, "v", &got);
	REQUIRE(back);
	CHECK(got == Unreachable{{"a:1", 1700000000}});
}

TEST_CASE("holders: a start keeps the donors it reached and ages out the others after the "
	  "lease (at once with lease 0), at most a cap of them",
	  "[holders]")
{
	const int64_t now = 1'800'000'000;
	const std::vector<Endpoint> recorded{{"d1", 1}, {"d2", 1}, {"d3", 1}, {"live", 1}};
	const std::vector<Endpoint> reached{{"live", 1}, {"new", 1}};
	// d1 unreachable since 100 s ago, d2 since 61 s ago, d3 has no time (an old record, or
	// first found unreachable now).
	const Unreachable since{{"d1:1", now - 100}, {"d2:1", now - 61}, {"live:1", now - 500}};
	AgedRecord a = age_record(recorded, reached, since, now, 60, 32);
	CHECK(strs(a.donors) == std::vector<std::string>{"d3:1", "live:1", "new:1"});
	// The reached donor's time is cleared; d3's starts now.
	CHECK(a.unreachable == Unreachable{{"d3:1", now}});
	CHECK(a.dropped_lease == 2);
	CHECK(a.dropped_cap == 0);
	// Exactly the lease: kept (dropped only once longer than the lease), its time unchanged.
	a = age_record(recorded, reached, Unreachable{{"d1:1", now - 60}}, now, 60, 32);
	CHECK(strs(a.donors) == std::vector<std::string>{"d1:1", "d2:1", "d3:1", "live:1", "new:1"});
	CHECK(a.unreachable ==
	      Unreachable{{"d1:1", now - 60}, {"d2:1", now}, {"d3:1", now}});
	// A start 1 s later, with the record this one stored: d1 (unreachable for 61 s) goes,
	// d2 and d3 stay; 61 s after their times they go too.
	a = age_record(a.donors, reached, a.unreachable, now + 1, 60, 32);
	CHECK(strs(a.donors) == std::vector<std::string>{"d2:1", "d3:1", "live:1", "new:1"});
	a = age_record(a.donors, reached, a.unreachable, now + 61, 60, 32);
	CHECK(strs(a.donors) == std::vector<std::string>{"live:1", "new:1"});
	CHECK(a.unreachable.empty());
	CHECK(a.dropped_lease == 2);
	// lease 0: every donor not reached now goes at once.
	a = age_record(recorded, reached, {}, now, 0, 32);
	CHECK(strs(a.donors) == std::vector<std::string>{"live:1", "new:1"});
	CHECK(a.dropped_lease == 3);
	CHECK(a.unreachable.empty());
	// The cap: at most 2 unreachable donors kept, the first by name.
	a = age_record(recorded, reached, {}, now, 60, 2);
	CHECK(strs(a.donors) == std::vector<std::string>{"d1:1", "d2:1", "live:1", "new:1"});
	CHECK(a.dropped_cap == 1);
	// A clock set back (a time in the future): kept, as unreachable since now.
	a = age_record(recorded, reached, Unreachable{{"d1:1", now + 1000}}, now, 60, 32);
	CHECK(a.unreachable.at("d1:1") == now);
	// A donor reached that was not recorded, and a record naming nothing reached: fine.
	a = age_record({}, reached, {}, now, 60, 32);
	CHECK(strs(a.donors) == std::vector<std::string>{"live:1", "new:1"});
}

TEST_CASE("holders: the default path and the etcd key escape the volume name", "[holders]")
{
	CHECK(default_path("/var/lib/rdmaswap/volume.key", "node1-1073741824-ecbed516") ==
	      "/var/lib/rdmaswap/node1-1073741824-ecbed516.holders");
	CHECK(default_path("/s/volume.key", "a/b") == "/s/a%2Fb.holders");
	CHECK(default_path("volume.key", "a b%") == "a%20b%25.holders");
	// Beside the donor cache of the same volume.
	CHECK(discovery::default_cache_path("/s/volume.key", "a/b") == "/s/a%2Fb.donors");
	CHECK(etcd_key("/rdmaswap/", "vol-1") == "/rdmaswap/volumes/vol-1/holders");
	CHECK(etcd_key("/p/", "a/b") == "/p/volumes/a%2Fb/holders");
}

TEST_CASE("holders: etcd calls fail within their bound when nothing listens", "[holders]")
{
	discovery::ListOptions o;
	o.endpoints = {"http://127.0.0.1:" + std::to_string(closed_port())};
	o.prefix = "/p/";
	o.timeout = std::chrono::milliseconds(1500);
	const auto t0 = std::chrono::steady_clock::now();
	const EtcdRecord r = get_etcd(o, "vol");
	CHECK(r.status == EtcdRecord::Status::Failed);
	CHECK_THAT(r.why, Catch::Contains(o.endpoints[0].substr(7)));
	CHECK(r.donors.empty());
	const auto put = put_etcd(o, "vol", std::vector<Endpoint>{{"h", 1}});
	CHECK_FALSE(put);
	CHECK_THAT(put.error, Catch::Contains(o.endpoints[0].substr(7)));
	CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
}
