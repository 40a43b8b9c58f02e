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

#include "common/wire/auth.h"
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

// A new event channel whose fd is non-blocking (so waits can be bounded). Throws.
EventChannel make_event_channel();

// Wait up to `timeout` for the next event on `ch`. Returns the event (caller acks it) or
// nullptr with `why` set (timeout, or the error). Use expect_event for the common case.
rdma_cm_event *next_event(rdma_event_channel *ch, std::chrono::milliseconds timeout,
			  std::string &why);
struct AcceptData;

// Wait for the next event and check it is `want`; acks it. Throws std::runtime_error naming
// `step` and what came instead (rdma_event_str). If the event carries private data and
// `reject_status` is non-null, the first 4 bytes of a REJECTED event's data are stored there;
// if `accept` is non-null, an ESTABLISHED event's data is parsed into it (parse_accept_data;
// untouched when it holds none).
void expect_event(rdma_event_channel *ch, rdma_cm_event_type want, std::chrono::milliseconds timeout,
		  const char *step, uint32_t *reject_status = nullptr, AcceptData *accept = nullptr);

// Resolve address and route for `id` to host:port, each step bounded by `timeout` and all of it
// by `until`. Throws.
void resolve(rdma_cm_id *id, rdma_event_channel *ch, const std::string &host, uint16_t port,
	     std::chrono::milliseconds timeout, Deadline until = Deadline::max());
// What is left of `timeout` before `until` (0 when it has passed).
std::chrono::milliseconds bounded(std::chrono::milliseconds timeout, Deadline until);

// The first word of a connect request's and an accept's private data.
inline constexpr uint32_t kConnectMagic = 0x41524453; // "SDRA"
// Most QPs one connect request names in `replaces`.
inline constexpr unsigned kMaxReplaces = 2;

// What a data QP's connect request carries: which session it joins (rdma_cm leaves 56 bytes of
// private data for an RC connect; over IB and RoCE the memserver gets all 56, zero-padded).
// Version 2: the attach proof, `mac` = attach_mac(session's attach key, session_id, token,
// cm_nonce) (common/wire/auth.h); 48 bytes, no `replaces`.
// Version 3 adds the fence (docs/architecture.md, "A failed write's outcome"): `replaces` names
// up to kMaxReplaces of the memserver's QPs (their numbers, from AcceptData; 0: none) of the same
// session whose failed writes may still be on the wire. Before it accepts, the memserver moves
// each of them it still has to the error state (it executes nothing more from it); one it no
// longer has is destroyed already; a QP of another session is never touched. The MAC covers
// `replaces` too (connect_mac). The memserver takes both versions; the client sends version 2
// when it names no QP, so that a memserver of version 2 still takes its connects.
struct ConnectData {
	uint32_t magic = kConnectMagic;
	uint32_t version = 3;
	uint64_t session_id = 0;
	uint64_t token = 0;
	uint64_t cm_nonce = 0;       // fresh random per connect
	uint8_t mac[16] = {};
	uint32_t replaces[kMaxReplaces] = {}; // version 3 only
};
inline constexpr size_t kConnectDataV2Size = 48;
static_assert(sizeof(ConnectData) == 56 && offsetof(ConnectData, replaces) == kConnectDataV2Size);

// What the memserver's accept carries (the private data of its REP), since version 3: the
// number of its QP for the connection, which a later connect names in `replaces`. A memserver
// of version 2 sends none: then no failed write of the connection can be fenced.
struct AcceptData {
	uint32_t magic = kConnectMagic;
	uint32_t version = 3;
	uint32_t qp_num = 0;
	uint32_t reserved = 0;
};
static_assert(sizeof(AcceptData) == 16);

// A connect request's private data (`len` bytes) as a ConnectData of version 2 (`replaces` all
// 0, whatever padding follows) or 3. 0, or EPROTO: too short for its version, a bad magic, or
// another version.
int parse_connect_data(const void *data, size_t len, ConnectData &out);
// An accept's private data as AcceptData: true if it is one (long enough, magic, version 3 or
// later); false (and `out` untouched) for none, e.g. from a memserver of version 2.
bool parse_accept_data(const void *data, size_t len, AcceptData &out);
// The MAC `cd` must carry under the session's attach key: version 2, attach_mac(); version 3,
// HMAC-SHA256(attach key, "rdmaswap-rdma-attach-v3" | session_id | token | cm_nonce |
// replaces, each little-endian) truncated to 16 bytes. Throws std::runtime_error if libcrypto
// fails.
std::array<std::byte, kAttachMacSize> connect_mac(const Mac &attach_key, const ConnectData &cd);

// Rejection reason sent back in the REJECT private data (an errno).
struct RejectData {
	uint32_t status = 0;
};

// "errno-style" text for a failed verbs/cm call: "<call>: <err_text(errno)>".
std::string errno_text(const char *call);

} // namespace rdmaswap::rdma
