// SPDX-License-Identifier: MIT
// The private data of an RDMA data connection (rdma_cm's connect, accept and reject): which
// session a data QP joins and the proof that the client holds the session, the memserver's QP
// number, and why a connect was refused. The TCP control messages are in protocol.h.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "common/wire/auth.h"

namespace rdmaswap::rdma {

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

} // namespace rdmaswap::rdma
