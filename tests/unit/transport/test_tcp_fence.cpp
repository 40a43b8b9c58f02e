// SPDX-License-Identifier: MIT
// Issue 25, defect 1: a WRITE that failed on one data connection must never land after a newer
// write that another connection of the same session got acknowledged. A real memserver (in
// this process) behind a proxy that can hold one connection's bytes past the timeout and
// deliver them late; two data paths of one session (RemoteServer), as paths= gives.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "common/obs/log.h"
#include "common/transport/remote_server.h"
#include "common/util/deadline.h"
#include "tests/support/loopback.h"
#include "memserver/server.h"

using namespace rdmaswap;
using namespace std::chrono_literals;

namespace {

// A TCP proxy on 127.0.0.1 in front of `port`. Connections are numbered in accept order. Per
// connection it can hold what the client sends (received, kept, not forwarded) and later
// deliver it, in order; and it can refuse new connections (accept and close at once).
class HoldingProxy {
public:
	explicit HoldingProxy(uint16_t upstream) : upstream_(upstream)
	{
		sockaddr_in a{};
		listen_ = test::listen_loopback(a);
		port_ = ntohs(a.sin_port);
		thread_ = std::thread([this] { loop(); });
	}
	~HoldingProxy()
	{
		stop_ = true;
		thread_.join();
		for (Conn &c : conns_) {
			::close(c.client);
			::close(c.server);
		}
	}
	uint16_t port() const { return port_; }
	// The number of the newest connection (-1: none yet).
	int last()
	{
		std::lock_guard l(mu_);
		return int(conns_.size()) - 1;
	}
	void hold(int conn)
	{
		std::lock_guard l(mu_);
		conns_[size_t(conn)].hold = true;
	}
	// Deliver what was held (late), and forward from then on.
	void release(int conn)
	{
		std::lock_guard l(mu_);
		Conn &c = conns_[size_t(conn)];
		c.hold = false;
		if (!c.held.empty() && c.server >= 0)
			(void)::send(c.server, c.held.data(), c.held.size(), MSG_NOSIGNAL);
		c.held.clear();
		if (c.client_eof && c.server >= 0)
			::shutdown(c.server, SHUT_WR);
	}
	void refuse_new(bool on) { refuse_ = on; }

private:
	struct Conn {
		int client = -1, server = -1;
		bool hold = false, client_eof = false;
		std::vector<char> held;
	};

	void loop()
	{
		while (!stop_) {
			std::vector<pollfd> fds{{listen_.get(), POLLIN, 0}};
			{
				std::lock_guard l(mu_);
				for (const Conn &c : conns_) {
					fds.push_back({c.client, POLLIN, 0});
					fds.push_back({c.server, POLLIN, 0});
				}
			}
			if (::poll(fds.data(), fds.size(), 20) <= 0)
				continue;
			std::lock_guard l(mu_);
			if (fds[0].revents & POLLIN)
				accept_one();
			for (size_t i = 1; i < fds.size(); i++)
				if (fds[i].revents & (POLLIN | POLLHUP | POLLERR))
					pump(conns_[(i - 1) / 2], (i - 1) % 2 == 0);
		}
	}
	void accept_one()
	{
		const int c = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC);
		if (c < 0)
			return;
		if (refuse_) {
			::close(c);
			return;
		}
		const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		sockaddr_in a{};
		a.sin_family = AF_INET;
		a.sin_port = htons(upstream_);
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (::connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
			::close(c);
			::close(s);
			return;
		}
		conns_.push_back(Conn{c, s, false, false, {}});
	}
	// One read from the client (to the server) or from the server (to the client).
	void pump(Conn &c, bool from_client)
	{
		int &in = from_client ? c.client : c.server;
		int &out = from_client ? c.server : c.client;
		if (in < 0)
			return;
		char buf[65536];
		const ssize_t n = ::recv(in, buf, sizeof buf, MSG_DONTWAIT);
		if (n > 0) {
			if (from_client && c.hold)
				c.held.insert(c.held.end(), buf, buf + n);
			else if (out >= 0)
				(void)::send(out, buf, size_t(n), MSG_NOSIGNAL);
			return;
		}
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		// The end of one side: pass it on (the server's end only once nothing is held).
		if (from_client) {
			c.client_eof = true;
			if (!c.hold && c.server >= 0)
				::shutdown(c.server, SHUT_WR);
		} else if (c.client >= 0) {
			::shutdown(c.client, SHUT_RDWR);
		}
		::close(in);
		in = -1;
	}

	const uint16_t upstream_;
	uint16_t port_ = 0;
	Fd listen_;
	std::atomic<bool> stop_{false}, refuse_{false};
	std::mutex mu_;
	std::vector<Conn> conns_; // under mu_ (the loop's copy of the fds is taken under it)
	std::thread thread_;
};

// A memserver in this process on a free loopback port: 4 slabs of 1 MiB, TCP, no key.
struct LocalMemserver {
	std::unique_ptr<Memserver> ms;
	std::thread t;
	LocalMemserver()
	{
		MemserverOptions o;
		o.listen = "127.0.0.1";
		o.port = 0;
		o.capacity = 4 << 20;
		o.slab_size = 1 << 20;
		o.transport = TransportKind::Tcp;
		o.lock_memory = false;
		o.insecure = true;
		o.threads = 2;
		ms = std::make_unique<Memserver>(o);
		t = std::thread([this] { ms->run(); });
	}
	~LocalMemserver()
	{
		ms->stop();
		t.join();
	}
};

// One session through the proxy with a slab and two data paths (a and b: two connections).
struct Session {
	LocalMemserver m;
	HoldingProxy px{m.ms->port()};
	std::unique_ptr<RemoteServer> srv;
	SlabGrant g;
	std::vector<std::byte> region = std::vector<std::byte>(3 * 4096);
	std::unique_ptr<DataPath> a, b;
	int conn_a = -1;

	Session()
	{
		RemoteServerOptions o;
		o.endpoint = *parse_endpoint("127.0.0.1:" + std::to_string(px.port()));
		o.kind = TransportKind::Tcp;
		o.timeout = 400ms;
		srv = std::make_unique<RemoteServer>(o);
		REQUIRE(srv->alloc_slab(g) == 0);
		a = srv->open_data_path(region);
		conn_a = px.last();
		b = srv->open_data_path(region);
		REQUIRE(px.last() > conn_a);
	}
	// Write 4 KiB of `v` at the slab's start through `p` (buffer k of the region).
	int write(DataPath &p, unsigned k, uint8_t v)
	{
		std::byte *buf = region.data() + k * 4096;
		std::memset(buf, v, 4096);
		if (int e = p.post_write(g, 0, 4096, buf)) {
			(void)p.complete();
			return e;
		}
		return p.complete();
	}
	// The first byte at the slab's start, read through `p` (-1: the read failed).
	int read(DataPath &p)
	{
		std::byte *buf = region.data() + 2 * 4096;
		if (p.post_read(g, 0, 4096, buf) || p.complete())
			return -1;
		for (size_t i = 1; i < 4096; i++)
			if (buf[i] != buf[0])
				return -2; // torn
		return int(buf[0]);
	}
};

} // namespace

TEST_CASE("TCP fence: a write that timed out on one connection never lands after a newer "
	  "write on another",
	  "[tcp][fence]")
{
	set_log_level("off");
	Session s;
	REQUIRE(s.write(*s.a, 0, 0xaa) == 0);
	s.px.hold(s.conn_a);
	CHECK(s.write(*s.a, 0, 0xbb) == EIO); // held past the timeout: fails
	REQUIRE(s.write(*s.b, 1, 0xcc) == 0); // the newer write, acknowledged
	s.px.release(s.conn_a);               // the failed write's bytes arrive now
	std::this_thread::sleep_for(300ms);   // (anything still applicable lands by now)
	CHECK(s.read(*s.b) == 0xcc);
	CHECK(s.read(*s.a) == 0xcc); // its connection was re-established
}

TEST_CASE("TCP fence: while a failed connection cannot be fenced, no write of the session is "
	  "acknowledged",
	  "[tcp][fence]")
{
	set_log_level("off");
	Session s;
	REQUIRE(s.write(*s.a, 0, 0xaa) == 0);
	s.px.hold(s.conn_a);
	s.px.refuse_new(true); // the memserver looks unreachable to new connections
	CHECK(s.write(*s.a, 0, 0xbb) == EIO);
	CHECK(s.write(*s.b, 1, 0xcc) == EIO); // b is healthy, but a may still apply 0xbb
	CHECK(s.read(*s.b) == 0xaa);          // reads go on (0xbb is still held)
	s.px.refuse_new(false);
	// Once a's connection can be fenced (after its backoff), writes go through again.
	const auto until = Clock::now() + 10s;
	int r = EIO;
	while (Clock::now() < until && (r = s.write(*s.b, 1, 0xdd)) != 0)
		std::this_thread::sleep_for(50ms);
	REQUIRE(r == 0);
	s.px.release(s.conn_a);
	std::this_thread::sleep_for(300ms);
	CHECK(s.read(*s.b) == 0xdd);
}
