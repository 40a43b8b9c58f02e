// SPDX-License-Identifier: MIT
// The metrics endpoint over libmicrohttpd (contracts in metrics_http.h).
#include "memserver/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <microhttpd.h>

#include "common/err_text.h"
#include "common/guarded_main.h"
#include "common/log.h"
#include "common/tcp/socket.h"

namespace rdmaswap {

namespace {

constexpr const char *kContentType = "text/plain; version=0.0.4; charset=utf-8";

// The library's two callbacks into this file run on its thread: each is an exception boundary
// (guarded_call), so that nothing reaches the library's C code (std::terminate).
void mhd_log(void *, const char *fmt, va_list ap)
{
	char buf[512];
	std::vsnprintf(buf, sizeof buf, fmt, ap);
	size_t n = std::strlen(buf);
	while (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	guarded_call("metrics", "a libmicrohttpd message",
		     [&] { logger("metrics")->warn("{}", buf); });
}

MHD_Result answer(MHD_Connection *conn, unsigned status, const std::string &body)
{
	MHD_Response *r = MHD_create_response_from_buffer(body.size(), const_cast<char *>(body.data()),
							  MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
				status == MHD_HTTP_OK ? kContentType : "text/plain; charset=utf-8");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	const MHD_Result ok = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ok;
}

// The library's access handler: one call per request (a GET has no body to wait for). A
// request whose answer throws (rendering, or making the response) is answered 500 if that can
// still be done, else its connection is closed (MHD_NO); the thread serves on.
MHD_Result on_request(void *cls, MHD_Connection *conn, const char *url, const char *method,
		      const char *, const char *, size_t *upload_size, void **)
{
	auto &render = *static_cast<std::function<std::string()> *>(cls);
	MHD_Result result = MHD_NO;
	if (guarded_call("metrics", "GET /metrics", [&] {
		    if (std::strcmp(url, "/metrics") != 0)
			    result = answer(conn, MHD_HTTP_NOT_FOUND, "only /metrics is served here\n");
		    else if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
			     std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
			    result = answer(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "GET or HEAD\n");
		    else {
			    if (*upload_size) // a GET with a body: ignore it
				    *upload_size = 0;
			    result = answer(conn, MHD_HTTP_OK, render());
		    }
	    }))
		return result;
	guarded_call("metrics", "the answer 500 to GET /metrics", [&] {
		result = answer(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal error\n");
	});
	return result;
}

} // namespace

std::string ListenAddr::str() const
{
	return host.find(':') == std::string::npos ? host + ":" + std::to_string(port)
						   : "[" + host + "]:" + std::to_string(port);
}

std::optional<ListenAddr> parse_listen_addr(const std::string &s)
{
	ListenAddr a;
	std::string port;
	if (!s.empty() && s[0] == '[') {
		const size_t close = s.find(']');
		if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':')
			return std::nullopt;
		a.host = s.substr(1, close - 1);
		port = s.substr(close + 2);
		in6_addr v6;
		if (inet_pton(AF_INET6, a.host.c_str(), &v6) != 1)
			return std::nullopt;
	} else {
		const size_t colon = s.rfind(':');
		if (colon == std::string::npos)
			return std::nullopt;
		a.host = s.substr(0, colon);
		port = s.substr(colon + 1);
		in_addr v4;
		if (inet_pton(AF_INET, a.host.c_str(), &v4) != 1)
			return std::nullopt;
	}
	if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
		return std::nullopt;
	const unsigned long p = std::stoul(port);
	if (p > 65535)
		return std::nullopt;
	a.port = uint16_t(p);
	return a;
}

MetricsServer::MetricsServer(const ListenAddr &at, std::function<std::string()> render)
	: render_(std::move(render))
{
	// The socket is ours to bind, so that a failure says why (the library would only say
	// that it failed); the library closes it when it stops.
	const bool v6 = at.host.find(':') != std::string::npos;
	sockaddr_storage ss{};
	socklen_t len;
	if (v6) {
		auto *sa = reinterpret_cast<sockaddr_in6 *>(&ss);
		sa->sin6_family = AF_INET6;
		sa->sin6_port = htons(at.port);
		inet_pton(AF_INET6, at.host.c_str(), &sa->sin6_addr);
		len = sizeof *sa;
	} else {
		auto *sa = reinterpret_cast<sockaddr_in *>(&ss);
		sa->sin_family = AF_INET;
		sa->sin_port = htons(at.port);
		inet_pton(AF_INET, at.host.c_str(), &sa->sin_addr);
		len = sizeof *sa;
	}
	Fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
	const int one = 1;
	if (fd)
		setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr *>(&ss), len) < 0 ||
	    ::listen(fd.get(), 16) < 0 ||
	    fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) | O_NONBLOCK) < 0)
		throw std::runtime_error("--metrics-listen: cannot listen on " + at.str() + ": " +
					 err_text(errno));
	socklen_t sl = sizeof ss;
	getsockname(fd.get(), reinterpret_cast<sockaddr *>(&ss), &sl);
	port_ = ntohs(v6 ? reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port
			 : reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
	if (v6)
		flags |= MHD_USE_IPv6;
	// (The logger first: the library's messages about the other options go to it.)
	daemon_ = MHD_start_daemon(flags, 0, nullptr, nullptr, &on_request, &render_,
				   MHD_OPTION_EXTERNAL_LOGGER, &mhd_log, nullptr,
				   MHD_OPTION_LISTEN_SOCKET, MHD_socket(fd.get()),
				   MHD_OPTION_CONNECTION_LIMIT, kMaxConnections,
				   MHD_OPTION_CONNECTION_TIMEOUT, kIdleTimeoutSeconds,
				   MHD_OPTION_CONNECTION_MEMORY_LIMIT, size_t(64 * 1024),
				   MHD_OPTION_END);
	if (!daemon_)
		throw std::runtime_error("--metrics-listen: cannot start the HTTP server on " +
					 at.str() + " (libmicrohttpd; see the warning above)");
	(void)fd.release(); // the library owns it now
	ListenAddr bound = at;
	bound.port = port_;
	logger("memserver")->info("serving metrics on http://{}/metrics", bound.str());
}

MetricsServer::~MetricsServer()
{
	MHD_stop_daemon(daemon_); // joins its thread, closes its connections and the socket
}

} // namespace rdmaswap
