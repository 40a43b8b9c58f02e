// SPDX-License-Identifier: MIT
// PLACEHOLDER until the RDMA client lands: reports devices, refuses to connect.
#include "common/rdma/rdma_client.h"

#include <infiniband/verbs.h>

#include <stdexcept>

namespace rdmaswap::rdma {

bool devices_present()
{
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	if (list)
		ibv_free_device_list(list);
	return n > 0;
}

bool can_reach(const Endpoint &, std::chrono::milliseconds, std::string &why)
{
	why = "RDMA client not built";
	return false;
}

struct ClientContext::Impl {};

ClientContext::ClientContext(const Endpoint &, std::chrono::milliseconds)
{
	throw std::runtime_error("RDMA client not built");
}
ClientContext::~ClientContext() = default;

std::unique_ptr<DataPath> ClientContext::open_data_path(const Endpoint &, uint64_t, uint64_t,
							 std::chrono::milliseconds,
							 std::span<std::byte>,
							 std::shared_ptr<std::atomic<bool>>)
{
	throw std::runtime_error("RDMA client not built");
}

} // namespace rdmaswap::rdma
