// SPDX-License-Identifier: MIT
// RAII deleters and bounded rdma_cm helpers.
#include "common/net/verbs.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/obs/log.h"
#include "common/util/deadline.h"
#include "common/util/err_text.h"

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

int device_count()
{
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return 0;
	ibv_free_device_list(list);
	return n;
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
		// Also wake on a stop request (common/util/deadline.h): shutdown must not wait for a connect.
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
		  const char *step, PrivateData *data)
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
	if ((got == RDMA_CM_EVENT_REJECTED || got == RDMA_CM_EVENT_ESTABLISHED) && data &&
	    ev->param.conn.private_data) {
		data->len = std::min<size_t>(ev->param.conn.private_data_len, data->bytes.size());
		std::memcpy(data->bytes.data(), ev->param.conn.private_data, data->len);
	}
	rdma_ack_cm_event(ev);
	if (got != want)
		throw std::runtime_error(std::string(step) + ": got " + rdma_event_str(got) +
					 " (status " + std::to_string(status) + ") instead of " +
					 rdma_event_str(want));
}

std::chrono::milliseconds bounded(std::chrono::milliseconds timeout, Deadline until)
{
	const auto now = Clock::now();
	if (until <= now)
		return std::chrono::milliseconds(0);
	if (until == Deadline::max())
		return timeout;
	return std::min(timeout, std::chrono::ceil<std::chrono::milliseconds>(until - now));
}

void resolve(rdma_cm_id *id, rdma_event_channel *ch, const std::string &host, uint16_t port,
	     std::chrono::milliseconds timeout, Deadline until)
{
	addrinfo hints{};
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	addrinfo *res = nullptr;
	const std::string p = std::to_string(port);
	if (int rc = getaddrinfo(host.c_str(), p.c_str(), &hints, &res))
		throw std::runtime_error("cannot resolve " + host + ": " + gai_strerror(rc));
	auto step = bounded(timeout, until);
	int rc = -1;
	if (step.count() > 0)
		rc = rdma_resolve_addr(id, nullptr, res->ai_addr, int(step.count()));
	else
		errno = ETIMEDOUT;
	const int err = errno;
	freeaddrinfo(res);
	if (rc) {
		errno = err;
		throw std::runtime_error(errno_text("rdma_resolve_addr") +
					 " (no RDMA device routes to " + host + "?)");
	}
	expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED,
		     bounded(timeout + std::chrono::seconds(1), until), "RDMA address resolution");
	step = bounded(timeout, until);
	if (step.count() <= 0)
		throw std::runtime_error("RDMA route resolution: timed out");
	if (rdma_resolve_route(id, int(step.count())))
		throw std::runtime_error(errno_text("rdma_resolve_route"));
	expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED,
		     bounded(timeout + std::chrono::seconds(1), until), "RDMA route resolution");
}

} // namespace rdmaswap::rdma
