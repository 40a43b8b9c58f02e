// SPDX-License-Identifier: MIT
// RemoteServer: session setup and the choice of data path.
#include "common/remote_server.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/log.h"
#include "common/rdma/rdma_client.h"
#include "common/tcp/tcp_data_path.h"

namespace rdmaswap {

RemoteServer::RemoteServer(const RemoteServerOptions &opts)
	: opts_(opts), name_(opts.endpoint.str())
{
	addr_ = resolve(opts_.endpoint);
	control_ = std::make_unique<ControlClient>(addr_, opts_.timeout);
	const bool rdma = opts_.kind == TransportKind::Rdma;
	if (rdma && !opts_.rdma)
		throw std::logic_error("RemoteServer: RDMA requested without a device context");
	proto::HelloReply hello;
	if (int r = control_->open_session(rdma, hello))
		throw std::runtime_error("memserver " + name_ + ": " +
					 (r == EPROTO ? std::string("protocol error (not a memserver, "
								    "or an incompatible version)")
						      : std::string(std::strerror(r))));
	if (rdma && !(hello.server_flags & proto::kServerRdma))
		throw std::runtime_error("memserver " + name_ +
					 " does not serve RDMA (start it with --transport rdma)");
	info_.slab_size = hello.slab_size;
	info_.slabs_total = hello.slabs_total;
	info_.slabs_free = hello.slabs_free;
	info_.max_io = hello.max_io;
	info_.rdma = hello.server_flags & proto::kServerRdma;
	logger("client")->debug("memserver {}: session {} slab size {} slabs {} free {}", name_,
				hello.session_id, hello.slab_size, hello.slabs_total,
				hello.slabs_free);
}

int RemoteServer::alloc_slab(SlabGrant &out)
{
	proto::AllocReply r;
	const int err = control_->alloc(r);
	if (control_->session_lost())
		lost_->store(true);
	if (err)
		return err;
	if (r.length != info_.slab_size)
		return EPROTO;
	if (opts_.kind == TransportKind::Rdma && r.rkey == 0 && r.addr == 0)
		return EPROTO;
	out = SlabGrant{r.slab_id, r.length, r.addr, r.rkey};
	return 0;
}

int RemoteServer::free_slab(uint32_t id)
{
	const int err = control_->free_slab(id);
	if (control_->session_lost())
		lost_->store(true);
	return err;
}

int RemoteServer::stats(proto::StatsReply &out)
{
	return control_->stats(out);
}

bool RemoteServer::session_alive() const
{
	return !lost_->load() && !control_->session_lost();
}

std::unique_ptr<DataPath> RemoteServer::open_data_path(std::span<std::byte> region)
{
	if (opts_.kind == TransportKind::Rdma)
		return opts_.rdma->open_data_path(opts_.endpoint, control_->session_id(),
						  control_->token(), opts_.timeout, region, lost_);
	return std::make_unique<TcpDataPath>(addr_, control_->session_id(), control_->token(),
					     opts_.timeout, region, lost_);
}

} // namespace rdmaswap
