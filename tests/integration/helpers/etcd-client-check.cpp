// SPDX-License-Identifier: MIT
// Drives common/net/etcd's Client against a real etcd for test-etcd-register.sh: list a prefix, a
// watch that sees a put and a delete, a watch from a compacted revision; and common/cluster/holders'
// record in etcd for test-etcd-holders.sh. Exit 0: as expected.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster/holders.h"
#include "common/net/etcd.h"

using namespace rdmaswap;
using namespace rdmaswap::etcd;
using namespace std::chrono_literals;

namespace {

int usage()
{
	std::fprintf(stderr, "usage: etcd-client-check ENDPOINTS list PREFIX\n"
			     "       etcd-client-check ENDPOINTS watch PREFIX\n"
			     "       etcd-client-check ENDPOINTS compacted PREFIX REVISION\n"
			     "       etcd-client-check ENDPOINTS holders PREFIX\n");
	return 2;
}

int fail(const std::string &why)
{
	std::fprintf(stderr, "etcd-client-check: %s\n", why.c_str());
	return 1;
}

// Every key under the prefix, one "KEY VALUE" line each.
int list(Client &c, const std::string &prefix)
{
	auto r = c.get_prefix(prefix);
	if (!r)
		return fail("get_prefix: " + r.error);
	for (const auto &kv : *r.value)
		std::printf("%s %s\n", kv.key.c_str(), kv.value.c_str());
	return 0;
}

// A watch on PREFIX sees a put of PREFIX/k (made by another client once the watch exists) and
// its delete, in order, with the value.
int watch(Client &c, Client &writer, const std::string &prefix)
{
	const std::string key = prefix + "k";
	std::thread t;
	int step = 0;
	std::string why;
	auto r = c.watch_prefix(
		prefix, 0,
		[&](const WatchMessage &m) {
			if (m.created && step == 0) {
				step = 1;
				t = std::thread([&] {
					if (auto p = writer.put(key, "v1"); !p)
						why = "put: " + p.error;
					else if (auto d = writer.del(key); !d)
						why = "del: " + d.error;
				});
			}
			for (const auto &e : m.events) {
				if (step == 1 && e.type == WatchEvent::Type::Put && e.kv.key == key &&
				    e.kv.value == "v1")
					step = 2;
				else if (step == 2 && e.type == WatchEvent::Type::Delete &&
					 e.kv.key == key)
					step = 3;
				else
					why = "unexpected event on " + e.kv.key + " at step " +
					      std::to_string(step);
			}
			return step < 3 && why.empty();
		},
		std::chrono::steady_clock::now() + 10s);
	if (t.joinable())
		t.join();
	if (!r)
		return fail("watch_prefix: " + r.error);
	if (!why.empty())
		return fail(why);
	if (step != 3)
		return fail("the watch saw " + std::to_string(step) + " of 3 steps within 10 s");
	std::printf("watch: created, put, delete\n");
	return 0;
}

// A watch from a compacted revision is cancelled by etcd with the compaction's revision.
int compacted(Client &c, const std::string &prefix, int64_t rev)
{
	int64_t compact = 0;
	auto r = c.watch_prefix(
		prefix, rev,
		[&](const WatchMessage &m) {
			if (m.canceled)
				compact = m.compact_revision;
			return true;
		},
		std::chrono::steady_clock::now() + 5s);
	if (!r)
		return fail("watch_prefix: " + r.error);
	if (compact < rev)
		return fail("no cancel with a compact revision >= " + std::to_string(rev));
	std::printf("compacted: canceled, compact_revision=%lld\n", (long long)compact);
	return 0;
}

// The holders record of a volume under PREFIX: absent at first; put, then read back as put
// (sorted, no duplicates), also an empty one; another volume's record, or a value that is not
// a record, at the key: a failure naming the key. Each call within the 3 s bound. Leaves the
// record of "vol/1" as {h1:1, h2:2} for the script to read with etcdctl.
int holders_check(Client &c, const std::vector<std::string> &endpoints, const std::string &prefix)
{
	discovery::ListOptions o;
	o.endpoints = endpoints;
	o.prefix = prefix;
	o.timeout = 3s;
	using Status = holders::EtcdRecord::Status;
	const std::string volume = "vol/1", key = holders::etcd_key(prefix, volume);
	auto got = holders::get_etcd(o, volume);
	if (got.status != Status::Absent)
		return fail("get_etcd before any put: not Absent: " + got.why);
	const std::vector<Endpoint> none, donors{{"h2", 2}, {"h1", 1}, {"h2", 2}};
	for (const auto *put : {&none, &donors}) {
		if (auto r = holders::put_etcd(o, volume, *put); !r)
			return fail("put_etcd: " + r.error);
		got = holders::get_etcd(o, volume);
		if (got.status != Status::Found)
			return fail("get_etcd after put_etcd: not Found: " + got.why);
		const std::size_t want = put->empty() ? 0 : 2;
		if (got.donors.size() != want ||
		    (want && (got.donors[0].str() != "h1:1" || got.donors[1].str() != "h2:2")))
			return fail("get_etcd gave " + std::to_string(got.donors.size()) +
				    " donors, not as put");
	}
	// Refused records: another volume's at this key, and junk.
	const std::string other = "/other-holders/";
	for (const char *bad : {R"({"version":1,"volume":"vol/2","donors":[]})", "junk"}) {
		if (auto p = c.put(holders::etcd_key(other, volume), bad); !p)
			return fail("put: " + p.error);
		o.prefix = other;
		got = holders::get_etcd(o, volume);
		if (got.status != Status::Failed ||
		    got.why.find(holders::etcd_key(other, volume)) == std::string::npos)
			return fail(std::string("get_etcd of a refused record (") + bad +
				    "): not Failed naming the key: " + got.why);
	}
	std::printf("holders: absent, put and read back, refused records fail (%s)\n", key.c_str());
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 4)
		return usage();
	auto eps = parse_endpoints(argv[1]);
	if (!eps)
		return fail(eps.error);
	const std::string mode = argv[2], prefix = argv[3];
	Client c({*eps});
	if (mode == "list")
		return list(c, prefix);
	if (mode == "watch") {
		Client writer({*eps});
		return watch(c, writer, prefix);
	}
	if (mode == "holders")
		return holders_check(c, *eps, prefix);
	if (mode == "compacted" && argc == 5)
		return compacted(c, prefix, std::strtoll(argv[4], nullptr, 10));
	return usage();
}
