// SPDX-License-Identifier: MIT
// Unit tests for the memserver's metrics endpoint (memserver/metrics_http.h): --metrics-listen
// parsing, GET /metrics answered with what `render` returns, other paths and methods refused,
// a port in use reported with its cause, a render that throws answered 500 (the request
// handler is an exception boundary: the library's thread serves on), and a request trickled
// a byte at a time cut at the request deadline (issue 26, S12).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>

#include "common/net/socket.h"
#include "memserver/metrics_http.h"

using namespace rdmaswap;

namespace {
// One HTTP/1.0 request to 127.0.0.1:port; the whole answer (the server closes).
std::string http(uint16_t port, const std::string &request)
{
	Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
	REQUIRE(fd);
	timeval tv{5, 0};
	setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	sockaddr_in sa{};
	sa.sin_family = AF_INET;
	sa.sin_port = htons(port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0);
	REQUIRE(::send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) == ssize_t(request.size()));
	std::string out;
	char buf[4096];
	for (ssize_t n; (n = ::recv(fd.get(), buf, sizeof buf, 0)) > 0;)
		out.append(buf, size_t(n));
	return out;
}

// The status code of an HTTP answer ("HTTP/1.x NNN ..."), or "" if it is none.
std::string status(const std::string &answer)
{
	return answer.rfind("HTTP/1.", 0) == 0 && answer.size() > 12 ? answer.substr(9, 3) : "";
}
} // namespace

TEST_CASE("metrics listen address: numeric ADDR:PORT only", "[metrics]")
{
	auto a = parse_listen_addr("127.0.0.1:9471");
	REQUIRE(a);
	CHECK(a->host == "127.0.0.1");
	CHECK(a->port == 9471);
	CHECK(a->str() == "127.0.0.1:9471");
	a = parse_listen_addr("[::1]:0");
	REQUIRE(a);
	CHECK(a->host == "::1");
	CHECK(a->port == 0);
	CHECK(a->str() == "[::1]:0");
	for (const char *bad : {"", "127.0.0.1", "127.0.0.1:", ":9471", "localhost:9471",
				"127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:9x", "::1:9471",
				"[::1]9471", "[::1]:", "[127.0.0.1]:9471", "1.2.3:80"})
		CHECK_FALSE(parse_listen_addr(bad));
}

TEST_CASE("metrics server: GET /metrics renders, other paths and methods do not", "[metrics]")
{
	std::atomic<int> calls{0};
	MetricsServer srv(*parse_listen_addr("127.0.0.1:0"), [&calls] {
		calls++;
		return std::string("# HELP x X.\n# TYPE x gauge\nx 1\n");
	});
	REQUIRE(srv.port() != 0);
	const std::string ok = http(srv.port(), "GET /metrics HTTP/1.0\r\n\r\n");
	CHECK(status(ok) == "200");
	CHECK(ok.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n") !=
	      std::string::npos);
	CHECK(ok.find("\r\n\r\n# HELP x X.\n# TYPE x gauge\nx 1\n") != std::string::npos);
	CHECK(calls == 1);
	CHECK(status(http(srv.port(), "GET /other HTTP/1.0\r\n\r\n")) == "404");
	CHECK(status(http(srv.port(), "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n")) ==
	      "405");
	CHECK(calls == 1);
}

TEST_CASE("metrics server: a render that throws is answered 500; the next GET is served",
	  "[metrics][boundary]")
{
	std::atomic<int> calls{0};
	MetricsServer srv(*parse_listen_addr("127.0.0.1:0"), [&calls]() -> std::string {
		if (++calls == 1)
			throw std::out_of_range("test fault");
		return "x 1\n";
	});
	CHECK(status(http(srv.port(), "GET /metrics HTTP/1.0\r\n\r\n")) == "500");
	const std::string ok = http(srv.port(), "GET /metrics HTTP/1.0\r\n\r\n");
	CHECK(status(ok) == "200");
	CHECK(ok.find("\r\n\r\nx 1\n") != std::string::npos);
	CHECK(calls == 2);
}

TEST_CASE("metrics server: a port in use is an error that says so", "[metrics]")
{
	MetricsServer first(*parse_listen_addr("127.0.0.1:0"), [] { return std::string(); });
	ListenAddr same{"127.0.0.1", first.port()};
	try {
		MetricsServer second(same, [] { return std::string(); });
		FAIL("a second server bound the same port");
	} catch (const std::runtime_error &e) {
		CHECK(std::string(e.what()) ==
		      "--metrics-listen: cannot listen on " + same.str() + ": Address already in use");
	}
}

TEST_CASE("metrics server: a request trickled a byte at a time is cut at the deadline",
	  "[metrics]")
{
	MetricsServer srv(*parse_listen_addr("127.0.0.1:0"), [] { return std::string("x 1\n"); });
	Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
	REQUIRE(fd);
	sockaddr_in sa{};
	sa.sin_family = AF_INET;
	sa.sin_port = htons(srv.port());
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0);
	const auto start = std::chrono::steady_clock::now();
	const auto limit = start + MetricsServer::kRequestDeadline + std::chrono::seconds(3);
	bool cut = false;
	// One byte every 100 ms (each would restart an idle timeout), never a whole request.
	while (!cut && std::chrono::steady_clock::now() < limit) {
		if (::send(fd.get(), "G", 1, MSG_NOSIGNAL) != 1)
			break;
		pollfd p{fd.get(), POLLIN, 0};
		char c;
		if (::poll(&p, 1, 100) == 1 && ::recv(fd.get(), &c, 1, MSG_DONTWAIT) <= 0)
			cut = true;
	}
	const auto took = std::chrono::steady_clock::now() - start;
	CHECK(cut);
	CHECK(took >= MetricsServer::kRequestDeadline - std::chrono::milliseconds(100));
	CHECK(took < MetricsServer::kRequestDeadline + std::chrono::seconds(1));
	CHECK(srv.deadlines_hit() == 1);
	// The server serves on.
	CHECK(status(http(srv.port(), "GET /metrics HTTP/1.0\r\n\r\n")) == "200");
}
