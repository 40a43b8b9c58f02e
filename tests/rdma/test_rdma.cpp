// SPDX-License-Identifier: MIT
// Tests of the RDMA transport against an in-process memserver. They need an RDMA device (rxe
// in the VM test) and RDMASWAP_TEST_RDMA_ADDR, an IPv4 address of it; otherwise exit 77.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/net/verbs.h"
#include "common/obs/log.h"
#include "common/transport/control_client.h"
#include "common/transport/rdma/client.h"
#include "common/transport/remote_server.h"
#include "common/volume/volume.h"
#include "common/wire/auth.h"
#include "memserver/server.h"

using namespace rdmaswap;

namespace {

std::string g_addr;

// The cluster key of these tests (the memserver refuses to run without one unless --insecure).
std::shared_ptr<const AuthKey> test_key(const char *text = "rdma test key, rdma test key!")
{
	return std::make_shared<const AuthKey>(std::as_bytes(std::span(text, std::strlen(text))));
}

// A memserver on g_addr with RDMA, running on its own thread for the test's lifetime.
struct TestServer {
	explicit TestServer(uint64_t capacity = 512ull << 20, uint64_t slab = 64ull << 20,
			    unsigned max_connections = 256)
	{
		MemserverOptions o;
		o.max_connections = max_connections;
		o.listen = g_addr;
		o.port = 0;
		o.capacity = capacity;
		o.slab_size = slab;
		o.transport = TransportKind::Rdma;
		o.auth_keys.push_back(test_key());
		server = std::make_unique<Memserver>(o);
		thread = std::thread([this] { server->run(); });
	}
	~TestServer() { stop(); }
	void stop()
	{
		if (!server)
			return;
		server->stop();
		thread.join();
		server.reset();
	}
	Endpoint endpoint() const { return Endpoint{g_addr, server->port()}; }
	std::unique_ptr<Memserver> server;
	std::thread thread;
};

struct Client {
	Client(const Endpoint &ep, std::chrono::milliseconds timeout = std::chrono::seconds(5))
	{
		ctx = std::make_unique<rdma::ClientContext>(ep, timeout);
		RemoteServerOptions o;
		o.endpoint = ep;
		o.kind = TransportKind::Rdma;
		o.rdma = ctx.get();
		o.timeout = timeout;
		o.auth_key = test_key();
		server = std::make_unique<RemoteServer>(o);
		region.resize(4 << 20);
		path = server->open_data_path(region);
	}
	std::unique_ptr<rdma::ClientContext> ctx;
	std::unique_ptr<RemoteServer> server;
	std::vector<std::byte> region;
	std::unique_ptr<DataPath> path;
};

void fill(std::byte *p, size_t n, uint64_t seed)
{
	std::mt19937_64 rng(seed);
	for (size_t i = 0; i < n; i += 8) {
		const uint64_t v = rng();
		std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
	}
}

} // namespace

TEST_CASE("RDMA write then read returns the bytes, one-sided")
{
	TestServer ts;
	Client c(ts.endpoint());
	SlabGrant g;
	REQUIRE(c.server->alloc_slab(g) == 0);
	REQUIRE(g.rkey != 0);
	fill(c.region.data(), 1 << 20, 1);
	REQUIRE(c.path->post_write(g, 4096, 1 << 20, c.region.data()) == 0);
	REQUIRE(c.path->post_write(g, 0, 100, c.region.data() + 8192) == 0); // small: inline
	REQUIRE(c.path->complete() == 0);
	std::byte *back = c.region.data() + (2 << 20);
	REQUIRE(c.path->post_read(g, 4096, 1 << 20, back) == 0);
	REQUIRE(c.path->complete() == 0);
	REQUIRE(std::memcmp(back, c.region.data(), 1 << 20) == 0);
	REQUIRE(c.path->post_read(g, 0, 100, back) == 0);
	REQUIRE(c.path->complete() == 0);
	REQUIRE(std::memcmp(back, c.region.data() + 8192, 100) == 0);
	const auto st = ts.server->stats();
	CHECK(st.tcp_read_bytes == 0);
	CHECK(st.tcp_write_bytes == 0);
	CHECK(st.rdma_qps >= 1);
}

TEST_CASE("Volume over RDMA moves hundreds of MiB with no memserver CPU per page")
{
	TestServer ts(512ull << 20, 64ull << 20);
	auto ctx = std::make_unique<rdma::ClientContext>(ts.endpoint(), std::chrono::seconds(5));
	RemoteServerOptions o;
	o.endpoint = ts.endpoint();
	o.kind = TransportKind::Rdma;
	o.rdma = ctx.get();
	o.auth_key = test_key();
	std::vector<std::unique_ptr<Server>> servers;
	servers.push_back(std::make_unique<RemoteServer>(o));
	VolumeOptions vo;
	vo.size = 256ull << 20;
	vo.channels = 2;
	Volume vol(std::move(servers), vo);
	const size_t chunk = 128 * 1024;
	std::vector<std::byte> buf(chunk), back(chunk);
	for (uint64_t off = 0; off < vo.size; off += chunk) {
		fill(buf.data(), chunk, off);
		REQUIRE(vol.pwrite(buf.data(), chunk, off) == 0);
	}
	for (uint64_t off = 0; off < vo.size; off += chunk) {
		fill(buf.data(), chunk, off);
		REQUIRE(vol.pread(back.data(), chunk, off) == 0);
		REQUIRE(std::memcmp(buf.data(), back.data(), chunk) == 0);
	}
	const auto st = ts.server->stats();
	CHECK(st.slabs_total - st.slabs_free == 4);
	CHECK(st.tcp_read_bytes == 0);
	CHECK(st.tcp_write_bytes == 0);
	CHECK(st.tcp_read_ops == 0);
	CHECK(st.tcp_write_ops == 0);
}

TEST_CASE("Another session's rkey is useless: access fails, data untouched")
{
	TestServer ts;
	Client a(ts.endpoint());
	Client b(ts.endpoint());
	SlabGrant ga;
	REQUIRE(a.server->alloc_slab(ga) == 0);
	fill(a.region.data(), 65536, 7);
	REQUIRE(a.path->post_write(ga, 0, 65536, a.region.data()) == 0);
	REQUIRE(a.path->complete() == 0);
	// B guesses A's address and rkey exactly: its QP is in another PD.
	REQUIRE(b.path->post_read(ga, 0, 65536, b.region.data()) == 0);
	CHECK(b.path->complete() == EIO);
	std::memset(b.region.data(), 0x5a, 65536);
	b.path->post_write(ga, 0, 65536, b.region.data()); // reconnect may be refused by backoff
	CHECK(b.path->complete() != 0);
	std::byte *back = a.region.data() + (1 << 20);
	REQUIRE(a.path->post_read(ga, 0, 65536, back) == 0);
	REQUIRE(a.path->complete() == 0);
	CHECK(std::memcmp(back, a.region.data(), 65536) == 0);
}

TEST_CASE("A freed slab is unreachable with its old rkey and zeroed for the next owner")
{
	TestServer ts(128ull << 20, 64ull << 20);
	Client a(ts.endpoint());
	SlabGrant g;
	REQUIRE(a.server->alloc_slab(g) == 0);
	fill(a.region.data(), 65536, 9);
	REQUIRE(a.path->post_write(g, 0, 65536, a.region.data()) == 0);
	REQUIRE(a.path->complete() == 0);
	REQUIRE(a.server->free_slab(g.id) == 0);
	REQUIRE(a.path->post_read(g, 0, 4096, a.region.data() + (1 << 20)) == 0);
	CHECK(a.path->complete() == EIO);
	Client b(ts.endpoint());
	SlabGrant gb;
	REQUIRE(b.server->alloc_slab(gb) == 0);
	REQUIRE(b.server->alloc_slab(gb) == 0); // one of the two is A's old slab
	for (uint32_t k = 0; k < 2; k++) {
		REQUIRE(b.path->post_read(gb, 0, 65536, b.region.data()) == 0);
		REQUIRE(b.path->complete() == 0);
		std::vector<std::byte> zeros(65536);
		CHECK(std::memcmp(b.region.data(), zeros.data(), 65536) == 0);
	}
}

TEST_CASE("A QP attach must prove the session's attach key; another key gets no session")
{
	TestServer ts;
	const Endpoint ep = ts.endpoint();
	const auto timeout = std::chrono::seconds(5);
	rdma::ClientContext ctx(ep, timeout);
	std::vector<std::byte> region(1 << 20);
	auto lost = std::make_shared<std::atomic<bool>>(false);
	ControlClient cc(resolve(ep), timeout, test_key());
	proto::HelloReply hello;
	REQUIRE(cc.open_session(true, hello) == 0);
	REQUIRE(cc.attach_key() != Mac{});
	// The right session id and token, but not the attach key: refused.
	Mac wrong = cc.attach_key();
	wrong[0] ^= std::byte{1};
	REQUIRE_THROWS_WITH(ctx.open_data_path(ep, cc.session_id(), cc.token(), wrong, timeout,
					       region, lost),
			    Catch::Contains("refused"));
	CHECK(ts.server->stats().rdma_qps == 0);
	// With it: attached, and a granted slab is usable.
	auto path = ctx.open_data_path(ep, cc.session_id(), cc.token(), cc.attach_key(), timeout,
				       region, lost);
	proto::AllocReply grant;
	REQUIRE(cc.alloc(grant) == 0);
	SlabGrant g{grant.slab_id, grant.length, grant.addr, grant.rkey};
	REQUIRE(path->post_write(g, 0, 4096, region.data()) == 0);
	REQUIRE(path->complete() == 0);
	// A client with another key never gets a session (so no token, no rkey).
	ControlClient other(resolve(ep), timeout, test_key("another key, another key, another"));
	CHECK(other.open_session(true, hello) == EACCES);
	CHECK(ts.server->stats().sessions == 1);
}

TEST_CASE("--max-connections counts RDMA QPs and TCP connections together")
{
	// 3: the session's control connection and two QPs; a third QP is rejected, and so is
	// another TCP connection, until a QP goes.
	TestServer ts(512ull << 20, 64ull << 20, 3);
	const Endpoint ep = ts.endpoint();
	const auto timeout = std::chrono::seconds(5);
	rdma::ClientContext ctx(ep, timeout);
	std::vector<std::byte> region(1 << 20);
	auto lost = std::make_shared<std::atomic<bool>>(false);
	ControlClient cc(resolve(ep), timeout, test_key());
	proto::HelloReply hello;
	REQUIRE(cc.open_session(true, hello) == 0);
	auto open = [&] {
		return ctx.open_data_path(ep, cc.session_id(), cc.token(), cc.attach_key(), timeout,
					  region, lost);
	};
	// The memserver counts a QP once its ESTABLISHED event is handled: wait for it (bounded).
	auto qps_become = [&](uint32_t n) {
		for (int i = 0; i < 500 && ts.server->stats().rdma_qps != n; i++)
			std::this_thread::sleep_for(std::chrono::milliseconds(10));
		return ts.server->stats().rdma_qps == n;
	};
	auto p1 = open();
	auto p2 = open();
	REQUIRE(qps_become(2));
	REQUIRE_THROWS_WITH(open(), Catch::Contains("refused"));
	CHECK(ts.server->stats().rdma_qps == 2);
	// A TCP connection is over the limit too: closed at once.
	ControlClient other(resolve(ep), timeout, test_key());
	proto::StatsReply st;
	CHECK(other.stats(st) != 0);
	// One QP goes: there is room for another.
	p2.reset();
	REQUIRE(qps_become(1));
	auto p3 = open();
	REQUIRE(qps_become(2));
	proto::AllocReply grant;
	REQUIRE(cc.alloc(grant) == 0);
	SlabGrant g{grant.slab_id, grant.length, grant.addr, grant.rkey};
	REQUIRE(p3->post_write(g, 0, 4096, region.data()) == 0);
	REQUIRE(p3->complete() == 0);
}

TEST_CASE("A memserver that goes away makes I/O fail with EIO promptly")
{
	auto ts = std::make_unique<TestServer>();
	Client c(ts->endpoint(), std::chrono::seconds(3));
	SlabGrant g;
	REQUIRE(c.server->alloc_slab(g) == 0);
	REQUIRE(c.path->post_write(g, 0, 4096, c.region.data()) == 0);
	REQUIRE(c.path->complete() == 0);
	ts->stop();
	const auto start = std::chrono::steady_clock::now();
	int err = c.path->post_read(g, 0, 4096, c.region.data());
	if (err == 0)
		err = c.path->complete();
	const auto took = std::chrono::steady_clock::now() - start;
	CHECK(err == EIO);
	CHECK(took < std::chrono::seconds(10));
	// Later calls fail fast too (no hang, no zeros).
	err = c.path->post_read(g, 0, 4096, c.region.data());
	if (err == 0)
		err = c.path->complete();
	CHECK(err == EIO);
}

namespace {
// One memserver session whose data paths share one RdmaSession, as RemoteServer's do.
struct FenceClient {
	FenceClient(const Endpoint &e, std::chrono::milliseconds t)
		: ep(e), timeout(t), ctx(e, t), cc(resolve(e), t, test_key())
	{
		proto::HelloReply hello;
		REQUIRE(cc.open_session(true, hello) == 0);
	}
	std::unique_ptr<DataPath> open()
	{
		return ctx.open_data_path(ep, cc.session_id(), cc.token(), cc.attach_key(), timeout,
					  region, lost, session);
	}
	void grant() // after a path is open (the session's PD comes with its first QP)
	{
		proto::AllocReply a;
		REQUIRE(cc.alloc(a) == 0);
		slab = SlabGrant{a.slab_id, a.length, a.addr, a.rkey};
	}
	int write(DataPath &p, uint64_t off, uint8_t v)
	{
		std::memset(region.data(), v, 4096);
		if (int err = p.post_write(slab, off, 4096, region.data())) {
			p.complete();
			return err;
		}
		return p.complete();
	}
	int read(DataPath &p, uint64_t off, uint8_t &v)
	{
		std::byte *dst = region.data() + 4096;
		if (int err = p.post_read(slab, off, 4096, dst)) {
			p.complete();
			return err;
		}
		const int err = p.complete();
		v = uint8_t(dst[0]);
		return err;
	}
	Endpoint ep;
	std::chrono::milliseconds timeout;
	rdma::ClientContext ctx;
	ControlClient cc;
	std::vector<std::byte> region = std::vector<std::byte>(1 << 16);
	std::shared_ptr<std::atomic<bool>> lost = std::make_shared<std::atomic<bool>>(false);
	std::shared_ptr<rdma::RdmaSession> session = rdma::make_rdma_session();
	SlabGrant slab;
};
} // namespace

// Issue 25 (docs/architecture.md, "A failed write's outcome"): a connect names the memserver's
// QPs of the session that may still execute a failed write; they execute nothing after it.
// (The late packets themselves: tests/vm/rdmafence.cpp, with tc in the VM.)
TEST_CASE("A connect naming a QP of its session fences it: that QP executes nothing more")
{
	TestServer ts(64ull << 20, 8ull << 20);
	FenceClient c(ts.endpoint(), std::chrono::seconds(1));
	auto a = c.open();
	auto b = c.open();
	c.grant();
	REQUIRE(c.write(*a, 0, 0x11) == 0);
	const uint32_t qa = rdma::remote_qp_num(*a), qb = rdma::remote_qp_num(*b);
	REQUIRE(qa != 0); // the accept told it
	REQUIRE(qb != 0);
	CHECK(qa != qb);
	// Reads go on while a QP is unfenced; a write first fences it (here: a number the
	// memserver does not have, which is fenced already).
	c.session->unfenced(0xfffff0);
	uint8_t v = 0;
	REQUIRE(c.read(*b, 0, v) == 0);
	CHECK(v == 0x11);
	CHECK(rdma::remote_qp_num(*b) == qb);
	REQUIRE(c.write(*b, 4096, 0x22) == 0);
	CHECK(c.session->unfenced_count() == 0);
	const uint32_t qb2 = rdma::remote_qp_num(*b);
	CHECK(qb2 != qb); // B reconnected to name it
	// As if A's last batch of writes had failed: its QP is unfenced. B's next write fences
	// it (B reconnects naming it) before it goes out.
	c.session->unfenced(qa);
	REQUIRE(c.write(*b, 4096, 0x23) == 0);
	CHECK(c.session->unfenced_count() == 0);
	// A's QP at the memserver executes nothing more: A's write fails and never lands.
	CHECK(c.write(*a, 0, 0x33) == EIO);
	REQUIRE(c.read(*b, 0, v) == 0);
	CHECK(v == 0x11);
	REQUIRE(c.read(*b, 4096, v) == 0);
	CHECK(v == 0x23);
	// A's failed write was fenced by A's own reconnect at once: A works again.
	CHECK(c.session->unfenced_count() == 0);
	REQUIRE(c.write(*a, 0, 0x44) == 0);
	REQUIRE(c.read(*b, 0, v) == 0);
	CHECK(v == 0x44);
}

TEST_CASE("A connect never fences another session's QP")
{
	TestServer ts(64ull << 20, 8ull << 20);
	FenceClient c1(ts.endpoint(), std::chrono::seconds(1));
	FenceClient c2(ts.endpoint(), std::chrono::seconds(1));
	auto p1 = c1.open();
	auto p2 = c2.open();
	c1.grant();
	c2.grant();
	REQUIRE(c1.write(*p1, 0, 0x55) == 0);
	const uint32_t q1 = rdma::remote_qp_num(*p1);
	REQUIRE(q1 != 0);
	// Session 2 names session 1's QP: its connect is taken, and the QP left alone.
	c2.session->unfenced(q1);
	REQUIRE(c2.write(*p2, 0, 0x66) == 0);
	CHECK(c2.session->unfenced_count() == 0);
	REQUIRE(c1.write(*p1, 4096, 0x77) == 0);
	uint8_t v = 0;
	REQUIRE(c1.read(*p1, 4096, v) == 0);
	CHECK(v == 0x77);
	CHECK(rdma::remote_qp_num(*p1) == q1);
}

namespace {
DataPathCounters minus(const DataPathCounters &a, const DataPathCounters &b)
{
	DataPathCounters d;
	d.posts = a.posts - b.posts;
	d.doorbells = a.doorbells - b.doorbells;
	d.polls = a.polls - b.polls;
	d.polls_empty = a.polls_empty - b.polls_empty;
	d.completions = a.completions - b.completions;
	d.arms = a.arms - b.arms;
	d.sleeps = a.sleeps - b.sleeps;
	d.batches = a.batches - b.batches;
	return d;
}

// The value of `key=` in a status report (UINT64_MAX if the line is missing).
uint64_t status_value(const std::string &text, const std::string &key)
{
	const std::string k = "\n" + key + "=";
	const size_t at = ("\n" + text).find(k);
	if (at == std::string::npos)
		return UINT64_MAX;
	return std::stoull(text.substr(at + k.size() - 1));
}
} // namespace

// Issue 13, "RDMA path accounting": a batch of k work requests is one ibv_post_send (doorbell)
// and one work completion (only its last request is signaled), whatever k is.
TEST_CASE("RDMA accounting: one doorbell and one completion per batch, whatever its size")
{
	TestServer ts;
	Client c(ts.endpoint());
	SlabGrant g;
	REQUIRE(c.server->alloc_slab(g) == 0);
	fill(c.region.data(), 1 << 20, 3);
	for (unsigned k : {1u, 4u, kMaxBatch}) {
		INFO("batch of " << k);
		const DataPathCounters w0 = c.path->counters();
		for (unsigned i = 0; i < k; i++) // small ones go inline
			REQUIRE(c.path->post_write(g, i * 8192, i % 2 ? 64 : 8192,
						   c.region.data() + i * 8192) == 0);
		REQUIRE(c.path->complete() == 0);
		const DataPathCounters r0 = c.path->counters();
		for (unsigned i = 0; i < k; i++)
			REQUIRE(c.path->post_read(g, i * 8192, 4096, c.region.data() + (2 << 20) + i * 8192) == 0);
		REQUIRE(c.path->complete() == 0);
		for (unsigned i = 0; i < k; i++)
			REQUIRE(std::memcmp(c.region.data() + (2 << 20) + i * 8192,
					    c.region.data() + i * 8192, i % 2 ? 64 : 4096) == 0);
		const DataPathCounters w = minus(r0, w0), r = minus(c.path->counters(), r0);
		for (const DataPathCounters &d : {w, r}) {
			CHECK(d.posts == k);
			CHECK(d.doorbells == 1);
			CHECK(d.batches == 1);
			CHECK(d.completions == 1);
			CHECK(d.polls >= 1);
			CHECK(d.polls - d.polls_empty == 1); // the one poll that found the completion
			CHECK(d.sleeps <= d.arms);
		}
	}
	// complete() with nothing posted rings no doorbell and polls nothing.
	const DataPathCounters e0 = c.path->counters();
	REQUIRE(c.path->complete() == 0);
	const DataPathCounters e = minus(c.path->counters(), e0);
	CHECK(e.batches == 1);
	CHECK(e.doorbells == 0);
	CHECK(e.polls == 0);
}

// The same through the Volume and its status report: every request crosses a slab boundary,
// so it is two work requests on one QP, rung with one doorbell.
TEST_CASE("RDMA accounting through the Volume: one doorbell per request, summed in the status")
{
	constexpr uint64_t kSlab = 1 << 20;
	TestServer ts(64ull << 20, kSlab);
	auto ctx = std::make_unique<rdma::ClientContext>(ts.endpoint(), std::chrono::seconds(5));
	RemoteServerOptions o;
	o.endpoint = ts.endpoint();
	o.kind = TransportKind::Rdma;
	o.rdma = ctx.get();
	o.auth_key = test_key();
	std::vector<std::unique_ptr<Server>> servers;
	servers.push_back(std::make_unique<RemoteServer>(o));
	VolumeOptions vo;
	vo.size = 16 * kSlab;
	vo.channels = 2;
	Volume vol(std::move(servers), vo);
	std::vector<std::byte> buf(8192), back(8192);
	for (uint64_t s = 1; s < 16; s++) { // allocate every slab first (control path)
		fill(buf.data(), buf.size(), s);
		REQUIRE(vol.pwrite(buf.data(), 4096, s * kSlab - 4096) == 0);
		REQUIRE(vol.pwrite(buf.data(), 4096, s * kSlab) == 0);
	}
	const std::string before = vol.status_text();
	constexpr unsigned kRequests = 200;
	for (unsigned i = 0; i < kRequests; i++) {
		const uint64_t off = ((i / 2) % 15 + 1) * kSlab - 4096; // read i: where i-1 wrote
		if (i % 2 == 0) {
			fill(buf.data(), buf.size(), 1000 + i);
			REQUIRE(vol.pwrite(buf.data(), 8192, off) == 0);
		} else {
			REQUIRE(vol.pread(back.data(), 8192, off) == 0);
			fill(buf.data(), buf.size(), 1000 + i - 1);
			REQUIRE(std::memcmp(back.data(), buf.data(), 8192) == 0);
		}
	}
	const std::string after = vol.status_text();
	INFO(after);
	auto delta = [&](const char *key) {
		REQUIRE(status_value(after, key) != UINT64_MAX);
		return status_value(after, key) - status_value(before, key);
	};
	CHECK(delta("io_requests") == kRequests);
	CHECK(delta("rdma_posts") == 2 * kRequests);
	CHECK(delta("rdma_doorbells") == kRequests); // one doorbell per WR would be 2x
	CHECK(delta("data_batches") == kRequests);
	CHECK(delta("rdma_completions") == kRequests);
	CHECK(delta("rdma_polls") >= kRequests);
	CHECK(delta("rdma_sleeps") <= delta("rdma_arms"));
}

int main(int argc, char **argv)
{
	const char *addr = std::getenv("RDMASWAP_TEST_RDMA_ADDR");
	if (!addr || !*addr || !rdma::devices_present()) {
		std::fprintf(stderr, "skip: needs an RDMA device and RDMASWAP_TEST_RDMA_ADDR\n");
		return 77;
	}
	g_addr = addr;
	set_log_level(std::getenv("RDMASWAP_TEST_LOG") ? std::getenv("RDMASWAP_TEST_LOG") : "warn");
	return Catch::Session().run(argc, argv);
}
