// SPDX-License-Identifier: MIT
// The metrics endpoint over libmicrohttpd (contracts in metrics_http.h).
#include "memserver/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <microhttpd.h>

#include "common/net/socket.h"
#include "common/obs/guarded_main.h"
#include "common/obs/log.h"
#include "common/util/err_text.h"

namespace rdmaswap {

namespace {

constexpr const char *kContentType = "text/plain; version=0.0.4; charset=utf-8";

// The library's callbacks into this file run on the server's thread: each is an exception
// boundary (guarded_call, or noexcept and throwing nothing), so that nothing reaches the
// library's C code (std::terminate).
// `cls` is the server's LogLimiter: the library's messages include one per refused connection
// (over a limit), which a client can provoke at will.
void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char buf[512];
	std::vsnprintf(buf, sizeof buf, fmt, ap);
	size_t n = std::strlen(buf);
	while (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	guarded_call("metrics", "a libmicrohttpd message", [&] {
		uint64_t suppressed = 0;
		if (!static_cast<LogLimiter *>(cls)->allow(suppressed))
			return;
		if (suppressed)
			logger("metrics")->warn("{} ({} similar messages suppressed)", buf, suppressed);
		else
			logger("metrics")->warn("{}", buf);
	});
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
	// One request per connection: its deadline counts from the accept.
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
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

namespace {
// The longest the thread waits in the library between looks at stop_ and the deadlines.
constexpr std::chrono::milliseconds kPollCap{200};
} // namespace

struct MetricsServerCallbacks {
	static void notify(void *cls, MHD_Connection *conn, void **socket_context,
			   MHD_ConnectionNotificationCode what) noexcept
	{
		static_cast<MetricsServer *>(cls)->on_connection(
			conn, socket_context, what == MHD_CONNECTION_NOTIFY_STARTED);
	}
};

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
	// No internal thread: ours runs the library (MHD_run_wait), so that it can cut a
	// connection's socket between the library's runs, when that socket is surely still the
	// connection's. epoll: descriptors above FD_SETSIZE are fine (the library refuses poll
	// without an internal thread, and select stops at FD_SETSIZE).
	unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
	if (v6)
		flags |= MHD_USE_IPv6;
	// The library's own idle timeout (whole seconds, reset by every byte) only backs up the
	// deadline.
	const unsigned idle_seconds =
		unsigned(std::chrono::ceil<std::chrono::seconds>(kRequestDeadline).count()) + 1;
	// (The logger first: the library's messages about the other options go to it.)
	daemon_ = MHD_start_daemon(
		flags, 0, nullptr, nullptr, &on_request, &render_, MHD_OPTION_EXTERNAL_LOGGER,
		&mhd_log, &log_limit_, MHD_OPTION_LISTEN_SOCKET, MHD_socket(fd.get()),
		MHD_OPTION_CONNECTION_LIMIT, kMaxConnections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
		kMaxPerAddress, MHD_OPTION_CONNECTION_TIMEOUT, idle_seconds,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, size_t(64 * 1024), MHD_OPTION_NOTIFY_CONNECTION,
		&MetricsServerCallbacks::notify, this,
		MHD_OPTION_END);
	if (!daemon_)
		throw std::runtime_error("--metrics-listen: cannot start the HTTP server on " +
					 at.str() + " (libmicrohttpd; see the warning above)");
	(void)fd.release(); // the library owns it now
	try {
		thread_ = std::thread([this] {
			pthread_setname_np(pthread_self(), "rdmaswap-metrics");
			guarded_thread("metrics", "the metrics thread",
				       "/metrics is not served any more", [this] { serve(); },
				       [](const char *) { return AfterFailure::End; });
		});
	} catch (...) {
		MHD_stop_daemon(daemon_); // (no destructor runs for a constructor that throws)
		throw;
	}
	ListenAddr bound = at;
	bound.port = port_;
	logger("memserver")->info("serving metrics on http://{}/metrics", bound.str());
}

MetricsServer::~MetricsServer()
{
	stop_.store(true);
	if (thread_.joinable())
		thread_.join(); // within kPollCap
	MHD_stop_daemon(daemon_); // closes its connections and the socket
}

void MetricsServer::on_connection(MHD_Connection *conn, void **socket_context,
				  bool started) noexcept
{
	if (started) {
		const MHD_ConnectionInfo *info =
			MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		if (!info)
			return;
		const int fd = info->connect_fd;
		for (Conn &c : conns_)
			if (!c.used) {
				c.used = true;
				c.cut = false;
				c.fd = fd;
				c.deadline = std::chrono::steady_clock::now() + kRequestDeadline;
				*socket_context = &c;
				return;
			}
		// No slot (the library admits at most kMaxConnections, so never): no deadline
		// could be kept, so the connection goes now; its socket is valid here.
		::shutdown(fd, SHUT_RDWR);
	} else {
		// (The library closes the socket after this: the slot forgets it first.)
		if (auto *c = static_cast<Conn *>(*socket_context)) {
			*c = Conn{};
			*socket_context = nullptr;
		}
	}
}

std::chrono::milliseconds MetricsServer::cut_expired()
{
	const auto now = std::chrono::steady_clock::now();
	auto next = kPollCap;
	for (Conn &c : conns_) {
		if (!c.used || c.cut)
			continue;
		if (now >= c.deadline) {
			// The library sees the end of its stream at its next poll and closes it.
			::shutdown(c.fd, SHUT_RDWR);
			c.cut = true;
			deadlines_hit_.fetch_add(1, std::memory_order_relaxed);
		} else {
			next = std::min(next, std::chrono::ceil<std::chrono::milliseconds>(
						      c.deadline - now));
		}
	}
	return next;
}

void MetricsServer::serve()
{
	while (!stop_.load()) {
		const auto wait = cut_expired();
		if (MHD_run_wait(daemon_, int32_t(wait.count())) != MHD_YES)
			std::this_thread::sleep_for(wait); // (a failed poll: not a busy loop)
	}
}

} // namespace rdmaswap
