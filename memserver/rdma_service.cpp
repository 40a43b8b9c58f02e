// SPDX-License-Identifier: MIT
// PLACEHOLDER until the RDMA service lands.
#include "memserver/rdma_service.h"

#include <stdexcept>

#include "common/rdma/rdma_client.h"

namespace rdmaswap {

struct RdmaService::Impl {};

RdmaService::RdmaService(const std::string &, uint16_t, SlabPool &, SessionTable &, Memserver &)
{
	throw std::runtime_error("RDMA service not built");
}
RdmaService::~RdmaService() = default;
int RdmaService::expose_slab(uint64_t, uint32_t, uint64_t &, uint32_t &) { return ENOTSUP; }
void RdmaService::unexpose_slab(uint64_t, uint32_t) {}
void RdmaService::end_session(uint64_t) {}
uint32_t RdmaService::qps() const { return 0; }
bool RdmaService::devices_present() { return rdma::devices_present(); }

} // namespace rdmaswap
