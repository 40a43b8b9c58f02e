// SPDX-License-Identifier: MIT
// RemoteServer: session setup and the choice of data path.
#include "common/transport/remote_server.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/obs/log.h"
#include "common/transport/rdma/client.h"
#include "common/transport/tcp/data_path.h"
#include "common/util/deadline.h"
#include "common/util/err_text.h"

namespace rdmaswap {

RemoteServer::RemoteServer(const RemoteServerOptions &opts)
	: opts_(opts), name_(opts.endpoint.str())
{
	addr_ = resolve(opts_.endpoint);
	control_ = std::make_unique<ControlClient>(addr_, opts_.timeout, opts_.auth_key);
	const bool rdma = opts_.kind == TransportKind::Rdma;
	if (rdma && !opts_.rdma)
		throw std::logic_error("RemoteServer: RDMA requested without a device context");
	proto::HelloReply hello;
	if (int r = control_->open_session(rdma, hello))
		throw std::runtime_error("memserver " + name_ + ": " + connect_error_text(r));
	if (rdma && !(hello.server_flags & proto::kServerRdma))
		throw std::runtime_error("memserver " + name_ +
					 " does not serve RDMA (start it with --transport rdma)");
	info_.slab_size = hello.slab_size;
	info_.slabs_total = hello.slabs_total;
	info_.slabs_free = hello.slabs_free;
	info_.max_io = hello.max_io;
	info_.rdma = hello.server_flags & proto::kServerRdma;
	free_.store(hello.slabs_free);
	granted_.assign(hello.slabs_total, 0);
	forgotten_ = std::make_unique<std::atomic<uint8_t>[]>(hello.slabs_total);
	list_ids_.resize(std::min<uint32_t>(hello.slabs_total, proto::kMaxListIds));
	logger("client")->debug("memserver {}: session {} slab size {} slabs {} free {}", name_,
				hello.session_id, hello.slab_size, hello.slabs_total,
				hello.slabs_free);
	if (!opts_.volume.empty()) {
		if (!opts_.volume_key || opts_.volume_key->name() != opts_.volume)
			throw std::logic_error("RemoteServer: volume= without its volume key");
		bind_volume();
	}
}

void RemoteServer::bind_volume()
{
	auto log = logger("client");
	const auto deadline = std::chrono::steady_clock::now() + opts_.timeout;
	auto pause = std::chrono::milliseconds(100);
	for (;;) {
		proto::BindReply r;
		const int err = control_->bind(*opts_.volume_key, opts_.lease_s, r);
		if (err == 0) {
			reattached_ = r.reattached;
			adopting_ = r.reattached;
			if (r.reattached)
				log->info("memserver {}: volume {} reattached: {} slabs kept for it "
					  "(detached for {} ms)",
					  name_, opts_.volume, r.slabs, r.detached_ms);
			else
				log->info("memserver {}: volume {} bound (lease {} s); nothing was kept "
					  "for it here",
					  name_, opts_.volume, opts_.lease_s);
			return;
		}
		if (err == EPERM)
			throw VolumeProofRefused(
				"memserver " + name_ + " refused the proof of volume " + opts_.volume +
				"'s key (EPERM): it did not accept our signature of its challenge; nothing of "
				"this volume is served from it");
		if (err != EBUSY || std::chrono::steady_clock::now() + pause > deadline) {
			if (err == EBUSY)
				throw std::runtime_error(
					"memserver " + name_ + ": volume " + opts_.volume +
					" is held by another live client (is another nbdkit with the same "
					"volume= running? never two owners; retried for " +
					std::to_string(opts_.timeout.count() / 1000) + " s)");
			throw std::runtime_error("memserver " + name_ + ": cannot bind volume " +
						 opts_.volume + ": " +
						 (err == EBADRQC || err == EPROTO
							  ? std::string("the memserver does not support volumes "
									"(too old?)")
						  : err == ERANGE
							  ? "the memserver's --max-lease refused lease=" +
								    std::to_string(opts_.lease_s)
						  : err == EUSERS
							  ? std::string("the memserver's --max-peer-owners "
									"refused another volume key from "
									"this address (EUSERS)")
							  : connect_error_text(err)));
		}
		log->debug("memserver {}: volume {} busy, retrying", name_, opts_.volume);
		if (sleep_until(deadline_after(pause)) == ECANCELED)
			throw std::runtime_error("memserver " + name_ + ": stopped while binding volume " +
						 opts_.volume);
		pause = std::min(pause * 2, std::chrono::milliseconds(1000));
	}
}

void RemoteServer::absorb_forgotten()
{
	if (!any_forgotten_.exchange(false))
		return;
	bool some = false;
	for (size_t id = 0; id < granted_.size(); id++)
		if (forgotten_[id].load(std::memory_order_relaxed) &&
		    forgotten_[id].exchange(0, std::memory_order_acquire)) {
			granted_[id] = 0;
			some = true;
		}
	// The server still holds them: the next reconcile's LIST finds and frees them.
	if (some)
		control_->set_outcome_unknown();
}

void RemoteServer::reconcile()
{
	absorb_forgotten();
	if (!control_->outcome_unknown() || adopting_)
		return;
	const long n = control_->list(list_ids_);
	if (n < 0)
		return; // still unknown: try again at the next control call
	control_->clear_outcome_unknown();
	for (long i = 0; i < n; i++) {
		const uint32_t id = list_ids_[size_t(i)];
		if (id < granted_.size() && granted_[id])
			continue;
		const int err = control_->free_slab(id);
		logger("client")->warn("memserver {}: gave back slab {} granted by a request whose "
				       "answer was lost: {}",
				       name_, id, err ? err_text(err) : "done");
	}
}

int RemoteServer::alloc_slab(SlabGrant &out)
{
	return alloc_impl(nullptr, out);
}

int RemoteServer::alloc_tagged(uint64_t chunk, uint64_t epoch, SlabGrant &out)
{
	if (!bound())
		return alloc_slab(out);
	const uint64_t tag[2] = {chunk, epoch};
	return alloc_impl(tag, out);
}

int RemoteServer::set_tag(uint32_t id, uint64_t chunk, uint64_t epoch)
{
	std::lock_guard lock(mu_);
	if (id == proto::kNoSlab)
		floors_ = true; // before it is sent: the server may record it whatever we hear
	const int err = control_->set_tag(id, chunk, epoch);
	if (control_->session_lost())
		lost_->store(true);
	return err;
}

int RemoteServer::set_floor(uint64_t chunk, uint64_t epoch)
{
	return set_tag(proto::kNoSlab, chunk, epoch);
}

int RemoteServer::list_volume(std::vector<proto::VolumeEntry> &slabs,
			      std::vector<proto::VolumeEntry> &floors)
{
	std::lock_guard lock(mu_);
	slabs.clear();
	floors.clear();
	for (auto what : {proto::ListWhat::Slabs, proto::ListWhat::Floors}) {
		auto &dst = what == proto::ListWhat::Slabs ? slabs : floors;
		uint64_t start = 0;
		for (;;) {
			std::vector<proto::VolumeEntry> page;
			if (int err = control_->volume_list(what, start, page))
				return err;
			for (const auto &e : page) {
				if (what == proto::ListWhat::Slabs &&
				    (e.slab_id >= granted_.size() ||
				     (opts_.kind == TransportKind::Rdma && e.rkey == 0 && e.addr == 0)))
					return EPROTO;
				dst.push_back(e);
			}
			if (page.size() < proto::kMaxVolumeEntries)
				break;
			start = (what == proto::ListWhat::Slabs ? page.back().slab_id : page.back().chunk) + 1;
		}
	}
	for (const auto &e : slabs)
		granted_[e.slab_id] = 1;
	floors_ = floors_ || !floors.empty();
	adopting_ = false;
	return 0;
}

bool RemoteServer::close_if_idle()
{
	{
		std::lock_guard lock(mu_);
		if (closed_.load())
			return true;
		reconcile(); // slabs forgotten or of unknown outcome: given back, or it stays open
		if (adopting_ || floors_ || control_->outcome_unknown() ||
		    std::find(granted_.begin(), granted_.end(), uint8_t(1)) != granted_.end())
			return false;
		closed_.store(true);
		control_->close();
	}
	std::lock_guard poll(poll_mu_);
	poll_fd_.reset();
	logger("client")->debug("memserver {}: idle session closed", name_);
	return true;
}

int RemoteServer::alloc_impl(const uint64_t *tag, SlabGrant &out)
{
	std::lock_guard lock(mu_);
	reconcile();
	proto::AllocReply r;
	const int err = tag ? control_->alloc_tagged(tag[0], tag[1], r) : control_->alloc(r);
	if (control_->session_lost())
		lost_->store(true);
	if (err == ENOSPC)
		free_.store(0); // full, whatever the hint said (others filled it): until a refresh
	if (err)
		return err;
	if (r.length != info_.slab_size || r.slab_id >= granted_.size() ||
	    (opts_.kind == TransportKind::Rdma && r.rkey == 0 && r.addr == 0)) {
		control_->free_slab(r.slab_id);
		return EPROTO;
	}
	granted_[r.slab_id] = 1;
	free_.store(r.slabs_free);
	out = SlabGrant{r.slab_id, r.length, r.addr, r.rkey};
	return 0;
}

int RemoteServer::free_slab(uint32_t id)
{
	std::lock_guard lock(mu_);
	reconcile();
	// Forget it whatever happens: the caller discards the content; if the server kept the
	// slab (outcome unknown), the next reconcile gives it back.
	if (id < granted_.size())
		granted_[id] = 0;
	const int err = control_->free_slab(id);
	if (control_->session_lost())
		lost_->store(true);
	if (!err)
		free_.fetch_add(1);
	return err;
}

void RemoteServer::forget_slab(uint32_t id)
{
	// No lock: a control call in flight holds mu_ for up to the timeout. Only atomics here;
	// the next reconcile (under mu_) drops the grant and gives the slab back.
	if (id >= granted_.size())
		return;
	forgotten_[id].store(1, std::memory_order_release);
	any_forgotten_.store(true, std::memory_order_release);
}

void RemoteServer::housekeeping()
{
	std::lock_guard lock(mu_);
	reconcile();
}

int RemoteServer::poll_connection()
{
	if (closed_.load())
		return ENOTCONN;
	if (poll_fd_)
		return 0;
	int err = 0;
	uint64_t conn_id = 0;
	poll_fd_ = join_session(addr_, deadline_after(opts_.timeout), opts_.auth_key.get(),
				control_->session_id(), control_->token(),
				opts_.kind == TransportKind::Rdma, 0, conn_id, err);
	if (!poll_fd_) {
		if (err == ENOENT)
			lost_->store(true); // the server no longer knows our session
		return err ? err : EIO;
	}
	poll_buf_.resize(proto::kMaxIo);
	return 0;
}

int RemoteServer::wanted_slabs(std::vector<uint32_t> &ids)
{
	ids.clear();
	std::lock_guard poll(poll_mu_);
	if (const int err = poll_connection())
		return err;
	size_t len = 0;
	int err = rpc_var(poll_fd_.get(), poll_id_++, proto::Op::Wanted, {}, poll_buf_, len,
			  deadline_after(opts_.timeout));
	ids.resize(list_ids_.size());
	const long n = err ? -1 : proto::decode_list(std::span(poll_buf_).first(len), ids);
	if (n < 0) {
		poll_fd_.reset(); // WANTED changes nothing: simply ask again on a new connection
		ids.clear();
		return err ? err : EPROTO;
	}
	ids.resize(size_t(n));
	return 0;
}

int RemoteServer::refresh_hint()
{
	std::lock_guard poll(poll_mu_);
	const auto now = Clock::now();
	if (now - hint_refreshed_ < kHintRefresh)
		return 0;
	if (const int err = poll_connection())
		return err;
	std::array<std::byte, proto::kStatsReplySize> reply;
	proto::StatsReply st;
	const int err =
		rpc(poll_fd_.get(), poll_id_++, proto::Op::Stats, {}, reply, deadline_after(opts_.timeout));
	if (err || !proto::decode(reply, st).ok) {
		poll_fd_.reset(); // asked again on a new connection at the next poll
		return err ? err : EPROTO;
	}
	hint_refreshed_ = now;
	free_.store(std::min(st.slabs_free, st.slabs_total));
	return 0;
}

int RemoteServer::stats(proto::StatsReply &out)
{
	return control_->stats(out);
}

bool RemoteServer::session_alive() const
{
	return !closed_.load() && !lost_->load() && !control_->session_lost();
}

std::unique_ptr<DataPath> RemoteServer::open_data_path(std::span<std::byte> region)
{
	if (opts_.kind == TransportKind::Rdma)
		return opts_.rdma->open_data_path(opts_.endpoint, control_->session_id(),
						  control_->token(), control_->attach_key(),
						  opts_.timeout, region, lost_, rdma_session_);
	return std::make_unique<TcpDataPath>(addr_, opts_.auth_key, control_->session_id(),
					     control_->token(), opts_.timeout, region, lost_,
					     tcp_session_);
}

unsigned RemoteServer::path_sharing() const
{
	return opts_.kind == TransportKind::Rdma ? 1 : TcpDataPath::kMaxSharing;
}

std::unique_ptr<DataPath> RemoteServer::share_data_path(DataPath &with)
{
	auto *tcp = opts_.kind == TransportKind::Rdma ? nullptr : dynamic_cast<TcpDataPath *>(&with);
	if (!tcp)
		return nullptr;
	try {
		return std::make_unique<TcpDataPath>(*tcp);
	} catch (const std::runtime_error &) {
		return nullptr; // it carries kMaxSharing already
	}
}

} // namespace rdmaswap
