// SPDX-License-Identifier: MIT
// RAII owners for rdma_cm and verbs objects, and the helpers both sides use to drive
// rdma_cm with bounded waits. Each handle is owned by exactly one unique_ptr; deleters log
// failures and never throw. Declare members in creation order so that they are destroyed in
// reverse: QP -> CQ -> completion channel -> MR -> PD -> cm id -> event channel.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/util/deadline.h"
#include "common/util/err_text.h"

namespace rdmaswap::rdma {

struct EventChannelDeleter { void operator()(rdma_event_channel *p) const; };
struct CmIdDeleter { void operator()(rdma_cm_id *p) const; };
struct PdDeleter { void operator()(ibv_pd *p) const; };
struct MrDeleter { void operator()(ibv_mr *p) const; };
struct CompChannelDeleter { void operator()(ibv_comp_channel *p) const; };
struct CqDeleter { void operator()(ibv_cq *p) const; };
// Destroys the QP attached to a cm id (rdma_destroy_qp); the id itself is owned elsewhere.
struct QpDeleter { void operator()(rdma_cm_id *id) const; };

using EventChannel = std::unique_ptr<rdma_event_channel, EventChannelDeleter>;
using CmId = std::unique_ptr<rdma_cm_id, CmIdDeleter>;
using Pd = std::unique_ptr<ibv_pd, PdDeleter>;
using Mr = std::unique_ptr<ibv_mr, MrDeleter>;
using CompChannel = std::unique_ptr<ibv_comp_channel, CompChannelDeleter>;
using Cq = std::unique_ptr<ibv_cq, CqDeleter>;
using Qp = std::unique_ptr<rdma_cm_id, QpDeleter>;

// Number of RDMA devices libibverbs lists (0 on error).
int device_count();
inline bool devices_present() { return device_count() > 0; }

// A new event channel whose fd is non-blocking (so waits can be bounded). Throws.
EventChannel make_event_channel();

// Wait up to `timeout` for the next event on `ch`. Returns the event (caller acks it) or
// nullptr with `why` set (timeout, or the error). Use expect_event for the common case.
rdma_cm_event *next_event(rdma_event_channel *ch, std::chrono::milliseconds timeout,
			  std::string &why);
// The private data of a connection event (an accept's, a reject's), copied out before the
// event is acked. `len` is 0 when the event carried none.
struct PrivateData {
	std::array<std::byte, 56> bytes{}; // (an RC connection's private data is at most 56 bytes)
	size_t len = 0;
};

// Wait for the next event and check it is `want`; acks it. Throws std::runtime_error naming
// `step` and what came instead (rdma_event_str). If `data` is non-null, the private data of a
// REJECTED or ESTABLISHED event is copied there first (whichever came, so that a caller reads
// why it was refused).
void expect_event(rdma_event_channel *ch, rdma_cm_event_type want, std::chrono::milliseconds timeout,
		  const char *step, PrivateData *data = nullptr);

// Resolve address and route for `id` to host:port, each step bounded by `timeout` and all of it
// by `until`. Throws.
void resolve(rdma_cm_id *id, rdma_event_channel *ch, const std::string &host, uint16_t port,
	     std::chrono::milliseconds timeout, Deadline until = Deadline::max());
// What is left of `timeout` before `until` (0 when it has passed).
std::chrono::milliseconds bounded(std::chrono::milliseconds timeout, Deadline until);

// "errno-style" text for a failed verbs/cm call: "<call>: <err_text(errno)>".
std::string errno_text(const char *call);

} // namespace rdmaswap::rdma
