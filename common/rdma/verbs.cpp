// SPDX-License-Identifier: MIT
// RAII deleters and bounded rdma_cm helpers.
#include "common/rdma/verbs.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/deadline.h"
#include "common/err_text.h"
#include "common/log.h"

namespace rdmaswap::rdma {

namespace {
void log_failure(const char *call, int rc)
{
	if (rc)
		logger("rdma")->warn("{} failed: {}", call, err_text(rc > 0 ? rc : errno));
}
} // namespace

void EventChannelDeleter::operator()(rdma_event_channel *p) const { rdma_destroy_event_channel(p); }
void CmIdDeleter::operator()(rdma_cm_id *p) const { log_failure("rdma_destroy_id", rdma_destroy_id(p)); }
void PdDeleter::operator()(ibv_pd *p) const { log_failure("ibv_dealloc_pd", ibv_dealloc_pd(p)); }
void MrDeleter::operator()(ibv_mr *p) const { log_failure("ibv_dereg_mr", ibv_dereg_mr(p)); }
void CompChannelDeleter::operator()(ibv_comp_channel *p) const
{
	log_failure("ibv_destroy_comp_channel", ibv_destroy_comp_channel(p));
}
void CqDeleter::operator()(ibv_cq *p) const { log_failure("ibv_destroy_cq", ibv_destroy_cq(p)); }
void QpDeleter::operator()(rdma_cm_id *id) const { rdma_destroy_qp(id); }

std::string errno_text(const char *call)
{
	return std::string(call) + ": " + err_text(errno);
}

EventChannel make_event_channel()
{
	EventChannel ch(rdma_create_event_channel());
	if (!ch)
		throw std::runtime_error(errno_text("rdma_create_event_channel") +
					 " (is rdma_ucm loaded and /dev/infiniband/rdma_cm present?)");
	const int flags = fcntl(ch->fd, F_GETFL);
	if (fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0)
		throw std::runtime_error(errno_text("fcntl(event channel)"));
	return ch;
}

rdma_cm_event *next_event(rdma_event_channel *ch, std::chrono::milliseconds timeout,
			  std::string &why)
{
	// Poll before rdma_get_cm_event: librdmacm mallocs the event before it knows whether one is
	// there (and frees it on EAGAIN), and the memserver's event loop waits here every 200 ms for
	// its whole life. Idle, this makes no heap allocation (the VM's allocation proof counts it).
	const auto deadline = std::chrono::steady_clock::now() + timeout;
	for (;;) {
		const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
			deadline - std::chrono::steady_clock::now());
		// Also wake on a stop request (common/deadline.h): shutdown must not wait for a connect.
		if (stop_requested()) {
			why.assign("stopped");
			return nullptr;
		}
		pollfd p[2] = {{ch->fd, POLLIN, 0}, {stop_fd(), POLLIN, 0}};
		const int n = ::poll(p, stop_fd() >= 0 ? 2 : 1, left.count() > 0 ? int(left.count()) : 0);
		if (n < 0 && errno != EINTR) {
			why = errno_text("poll(event channel)");
			return nullptr;
		}
		if (n > 0 && !p[0].revents)
			continue; // the stop fd: reported at the top
		if (n > 0) {
			rdma_cm_event *ev = nullptr;
			if (rdma_get_cm_event(ch, &ev) == 0)
				return ev;
			if (errno != EAGAIN && errno != EINTR) {
				why = errno_text("rdma_get_cm_event");
				return nullptr;
			}
		}
		if (left.count() <= 0) {
			why.assign("timed out"); // fits std::string's inline buffer: no allocation
			return nullptr;
		}
	}
}

void expect_event(rdma_event_channel *ch, rdma_cm_event_type want, std::chrono::milliseconds timeout,
		  const char *step, uint32_t *reject_status)
{
	std::string why;
	rdma_cm_event *ev = next_event(ch, timeout, why);
	if (!ev) {
		if (why == "timed out")
			why += " after " + std::to_string(timeout.count()) + " ms";
		throw std::runtime_error(std::string(step) + ": " + why);
	}
	const rdma_cm_event_type got = ev->event;
	const int status = ev->status;
	if (got == RDMA_CM_EVENT_REJECTED && reject_status &&
	    ev->param.conn.private_data_len >= sizeof(RejectData)) {
		RejectData r;
		std::memcpy(&r, ev->param.conn.private_data, sizeof r);
		*reject_status = r.status;
	}
	rdma_ack_cm_event(ev);
	if (got != want)
		throw std::runtime_error(std::string(step) + ": got " + rdma_event_str(got) +
					 " (status " + std::to_string(status) + ") instead of " +
					 rdma_event_str(want));
}

void resolve(rdma_cm_id *id, rdma_event_channel *ch, const std::string &host, uint16_t port,
	     std::chrono::milliseconds timeout)
{
	addrinfo hints{};
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	addrinfo *res = nullptr;
	const std::string p = std::to_string(port);
	if (int rc = getaddrinfo(host.c_str(), p.c_str(), &hints, &res))
		throw std::runtime_error("cannot resolve " + host + ": " + gai_strerror(rc));
	const int rc = rdma_resolve_addr(id, nullptr, res->ai_addr, int(timeout.count()));
	const int err = errno;
	freeaddrinfo(res);
	if (rc) {
		errno = err;
		throw std::runtime_error(errno_text("rdma_resolve_addr") +
					 " (no RDMA device routes to " + host + "?)");
	}
	expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, timeout + std::chrono::seconds(1),
		     "RDMA address resolution");
	if (rdma_resolve_route(id, int(timeout.count())))
		throw std::runtime_error(errno_text("rdma_resolve_route"));
	expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, timeout + std::chrono::seconds(1),
		     "RDMA route resolution");
}

} // namespace rdmaswap::rdma
