// SPDX-License-Identifier: MIT
// RAII owners for rdma_cm and verbs objects, and the helpers both sides use to drive
// rdma_cm with bounded waits. Each handle is owned by exactly one unique_ptr; deleters log
// failures and never throw. Declare members in creation order so that they are destroyed in
// reverse: QP -> CQ -> completion channel -> MR -> PD -> cm id -> event channel.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/err_text.h"

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

// A new event channel whose fd is non-blocking (so waits can be bounded). Throws.
EventChannel make_event_channel();

// Wait up to `timeout` for the next event on `ch`. Returns the event (caller acks it) or
// nullptr with `why` set (timeout, or the error). Use expect_event for the common case.
rdma_cm_event *next_event(rdma_event_channel *ch, std::chrono::milliseconds timeout,
			  std::string &why);
// Wait for the next event and check it is `want`; acks it. Throws std::runtime_error naming
// `step` and what came instead (rdma_event_str). If the event carries private data and
// `reject_status` is non-null, the first 4 bytes of a REJECTED event's data are stored there.
void expect_event(rdma_event_channel *ch, rdma_cm_event_type want, std::chrono::milliseconds timeout,
		  const char *step, uint32_t *reject_status = nullptr);

// Resolve address and route for `id` to host:port, each bounded by `timeout`. Throws.
void resolve(rdma_cm_id *id, rdma_event_channel *ch, const std::string &host, uint16_t port,
	     std::chrono::milliseconds timeout);

// What a data QP's connect request carries: which session it joins.
// Version 2 adds the attach proof: `mac` = attach_mac(session's attach key, session_id, token,
// cm_nonce) (common/auth.h). rdma_cm leaves 56 bytes of private data for an RC connect.
struct ConnectData {
	uint32_t magic = 0x41524453; // "SDRA"
	uint32_t version = 2;
	uint64_t session_id = 0;
	uint64_t token = 0;
	uint64_t cm_nonce = 0;       // fresh random per connect
	uint8_t mac[16] = {};
};
static_assert(sizeof(ConnectData) == 48 && sizeof(ConnectData) <= 56);
// Rejection reason sent back in the REJECT private data (an errno).
struct RejectData {
	uint32_t status = 0;
};

// "errno-style" text for a failed verbs/cm call: "<call>: <err_text(errno)>".
std::string errno_text(const char *call);

} // namespace rdmaswap::rdma
