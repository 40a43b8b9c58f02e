// SPDX-License-Identifier: MIT
// RDMA connection private data: parsing and the connect MAC.
#include "common/wire/rdma_connect.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace rdmaswap::rdma {

int parse_connect_data(const void *data, size_t len, ConnectData &out)
{
	if (!data || len < kConnectDataV2Size)
		return EPROTO;
	std::array<std::byte, sizeof(ConnectData)> raw{};
	std::memcpy(raw.data(), data, std::min(len, raw.size()));
	ConnectData cd;
	std::memcpy(&cd, raw.data(), sizeof cd);
	if (cd.magic != kConnectMagic)
		return EPROTO;
	if (cd.version == 2)
		std::fill(std::begin(cd.replaces), std::end(cd.replaces), 0u); // (IB's padding)
	else if (cd.version != 3 || len < sizeof cd)
		return EPROTO;
	out = cd;
	return 0;
}

bool parse_accept_data(const void *data, size_t len, AcceptData &out)
{
	AcceptData a;
	if (!data || len < sizeof a)
		return false;
	std::memcpy(&a, data, sizeof a);
	if (a.magic != kConnectMagic || a.version < 3)
		return false;
	out = a;
	return true;
}

std::array<std::byte, kAttachMacSize> connect_mac(const Mac &attach_key, const ConnectData &cd)
{
	if (cd.version == 2)
		return attach_mac(attach_key, cd.session_id, cd.token, cd.cm_nonce);
	std::array<std::byte, 8 * 3 + 4 * kMaxReplaces> msg;
	size_t n = 0;
	auto put = [&](uint64_t v, int bytes) {
		for (int i = 0; i < bytes; i++)
			msg[n++] = std::byte((v >> (8 * i)) & 0xff);
	};
	put(cd.session_id, 8);
	put(cd.token, 8);
	put(cd.cm_nonce, 8);
	for (uint32_t q : cd.replaces)
		put(q, 4);
	const AuthKey key(attach_key); // (HMAC under the attach key)
	const Mac m = key.mac("rdmaswap-rdma-attach-v3", {msg});
	std::array<std::byte, kAttachMacSize> out;
	std::memcpy(out.data(), m.data(), out.size());
	return out;
}

} // namespace rdmaswap::rdma
