// SPDX-License-Identifier: MIT
// Unit tests for common/holders (issue 14): the holders record's text and its refusals, the
// local file (written whole, mode 0600, read back with bounds), its default path and etcd key,
// and the etcd calls failing within their bound when nothing listens.
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

#include "common/holders.h"
#include "state_file_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::holders;
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
	auto back = parse_record(text, "vol-1", why);
	REQUIRE(back);
	CHECK(strs(*back) ==
	      std::vector<std::string>{"10.0.0.1:7471", "10.0.0.2:7471", "[fd00::2]:7000"});
	CHECK(record_text("vol-1", *back) == text);
	// A volume that holds nothing.
	back = parse_record(record_text("vol-1", {}), "vol-1", why);
	REQUIRE(back);
	CHECK(back->empty());
	// Written by another hand: unsorted, a duplicate, an unknown field: accepted, made
	// canonical.
	back = parse_record(R"({"version":1,"volume":"v","donors":["b:2","a:1","b:2"],"x":true})",
			    "v", why);
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
		CHECK_FALSE(parse_record(text, "v", why));
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
	const std::string why = put_etcd(o, "vol", std::vector<Endpoint>{{"h", 1}});
	CHECK_THAT(why, Catch::Contains(o.endpoints[0].substr(7)));
	CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
}
