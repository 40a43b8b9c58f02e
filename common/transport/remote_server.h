// SPDX-License-Identifier: MIT
// A real memserver reached over the network: TCP control connection plus TCP or RDMA data paths.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/transport/control_client.h"
#include "common/transport/tcp/data_path.h"
#include "common/transport/transport.h"
#include "common/util/config.h"

namespace rdmaswap {

namespace rdma {
class ClientContext;
class RdmaSession;
std::shared_ptr<RdmaSession> make_rdma_session();
} // namespace rdma

struct RemoteServerOptions {
	Endpoint endpoint;
	TransportKind kind = TransportKind::Tcp; // Tcp or Rdma (Auto is resolved by the caller)
	std::chrono::milliseconds timeout{10000};
	// Required when kind == Rdma: the device context data paths are made on. Borrowed.
	rdma::ClientContext *rdma = nullptr;
	// The cluster key (auth-key=); null only for memservers run with --insecure.
	std::shared_ptr<const AuthKey> auth_key;
	// volume=: bind the session to this volume id ("" : do not bind), kept `lease_s` seconds
	// after the session's last connection. While another live client holds the volume the
	// bind is retried (the server may not have noticed yet that the old client died) until
	// `timeout` has passed.
	std::string volume;
	uint32_t lease_s = 0;
	// Required with `volume`: the volume's key (volume-key=), derived for `volume`; every
	// BIND proves it (volume_key.h).
	std::shared_ptr<const VolumeKey> volume_key;
};

// Thrown by RemoteServer's constructor when the memserver refused the proof of the volume key
// (EPERM): the caller treats that server as failed for this volume and never serves from it.
class VolumeProofRefused : public std::runtime_error {
public:
	using std::runtime_error::runtime_error;
};

class RemoteServer final : public Server {
public:
	// Resolves, connects and opens a session. Throws std::runtime_error with a message that
	// names the server and what failed (unreachable, refused, protocol mismatch, no RDMA).
	explicit RemoteServer(const RemoteServerOptions &opts);

	const ServerInfo &info() const override { return info_; }
	const std::string &name() const override { return name_; }
	int alloc_slab(SlabGrant &out) override;
	int free_slab(uint32_t id) override;
	void forget_slab(uint32_t id) override;
	void housekeeping() override;
	int wanted_slabs(std::vector<uint32_t> &ids) override;
	int refresh_hint() override;
	int stats(proto::StatsReply &out) override;
	std::unique_ptr<DataPath> open_data_path(std::span<std::byte> region) override;
	unsigned path_sharing() const override;
	std::unique_ptr<DataPath> share_data_path(DataPath &with) override;
	bool session_alive() const override;
	uint32_t slabs_free() const override { return free_.load(); }
	bool bound() const override { return !opts_.volume.empty(); }
	bool reattached() const override { return reattached_; }
	int alloc_tagged(uint64_t chunk, uint64_t epoch, SlabGrant &out) override;
	int set_tag(uint32_t id, uint64_t chunk, uint64_t epoch) override;
	int set_floor(uint64_t chunk, uint64_t epoch) override;
	int list_volume(std::vector<proto::VolumeEntry> &slabs,
			std::vector<proto::VolumeEntry> &floors) override;
	bool close_if_idle() override;

private:
	// After a control call with an unknown outcome (e.g. an ALLOC that timed out but that the
	// server may still execute), ask the server which slabs we hold and give back any we do
	// not know about, so nothing leaks. Caller holds mu_.
	void reconcile();
	// Drop the grants forget_slab() marked, and mark the outcome unknown so that reconcile()
	// gives them back. Caller holds mu_.
	void absorb_forgotten();
	// BIND with retries while the volume has a live owner. Throws std::runtime_error, or
	// VolumeProofRefused for EPERM.
	void bind_volume();
	// ALLOC or ALLOC_TAGGED (tag != nullptr).
	int alloc_impl(const uint64_t *tag, SlabGrant &out);

	const RemoteServerOptions opts_;
	const std::string name_;
	SockAddr addr_;
	std::unique_ptr<ControlClient> control_;
	ServerInfo info_;
	std::atomic<uint32_t> free_{0};  // server's free slabs as last reported
	std::mutex mu_;                  // alloc/free/reconcile (control path)
	std::vector<uint8_t> granted_;   // by slab id: 1 if this session holds it (under mu_)
	// By slab id: 1 once forget_slab() dropped it (set without mu_, consumed under it by
	// absorb_forgotten()); any_forgotten_ says some may be set. Sized once: no allocation.
	std::unique_ptr<std::atomic<uint8_t>[]> forgotten_;
	std::atomic<bool> any_forgotten_{false};
	std::vector<uint32_t> list_ids_; // reconcile's LIST reply
	bool reattached_ = false;
	// Between a BIND that took over slabs and list_volume(), the session holds slabs granted_
	// does not know yet: reconcile() must not give them back.
	bool adopting_ = false;
	std::shared_ptr<std::atomic<bool>> lost_ = std::make_shared<std::atomic<bool>>(false);
	// The session's data connections, which fence each other: TCP (tcp_data_path.h) or RDMA
	// (rdma_client.h), whichever the transport is.
	const std::shared_ptr<TcpSession> tcp_session_ = make_tcp_session();
	const std::shared_ptr<rdma::RdmaSession> rdma_session_ = rdma::make_rdma_session();
	// A floor was (or may have been) recorded here, or kept from an earlier run: the session
	// holds something of the volume even without a slab (under mu_).
	bool floors_ = false;
	std::atomic<bool> closed_{false}; // close_if_idle()
	// wanted_slabs() and refresh_hint() poll on a connection of its own (the poll thread
	// only), so that a poll of a hung server never holds up ALLOC or FREE on the control
	// connection. poll_mu_ (held for a poll; never with mu_) lets close_if_idle() close it.
	std::mutex poll_mu_;
	Fd poll_fd_;
	// The poll connection, joined to the session if it is not (under poll_mu_). 0 or errno.
	int poll_connection();
	uint64_t poll_id_ = 1;
	std::vector<std::byte> poll_buf_;
	// The free slab count (placement's hint) is refreshed on the poll connection
	// (refresh_hint), with a STATS at most every kHintRefresh: a donor that others fill or
	// empty stops looking as it did at HELLO. (An ALLOC that gets ENOSPC sets it to 0 at
	// once.)
	static constexpr std::chrono::seconds kHintRefresh{5};
	Clock::time_point hint_refreshed_{};
};

} // namespace rdmaswap
