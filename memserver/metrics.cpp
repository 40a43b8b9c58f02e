// SPDX-License-Identifier: MIT
// Memserver: its counters in the Prometheus text format (the --metrics-listen endpoint).
#include "memserver/server.h"

#include <algorithm>

#include "common/obs/metrics_text.h"

namespace rdmaswap {

std::string Memserver::metrics_text() const
{
	const MemserverSnapshot s = snapshot();
	MetricsText m;
	m.single("rdmaswap_memserver_capacity_bytes", "gauge", "Memory donated (--capacity).",
		 s.capacity);
	m.single("rdmaswap_memserver_slab_size_bytes", "gauge", "Slab size (--slab-size).",
		 s.slab_size);
	// used: granted to a session, or on its way out of or back into the pool.
	const uint64_t used =
		s.slabs.total - std::min<uint64_t>(s.slabs.total, uint64_t(s.slabs.free) + s.slabs.withdrawn);
	m.family("rdmaswap_memserver_slabs", "gauge",
		 "Slabs by state: free, used (granted to a client) or withdrawn (given back to "
		 "the host); they add up to the capacity in slabs.");
	m.sample("rdmaswap_memserver_slabs", {{"state", "free"}}, uint64_t(s.slabs.free));
	m.sample("rdmaswap_memserver_slabs", {{"state", "used"}}, used);
	m.sample("rdmaswap_memserver_slabs", {{"state", "withdrawn"}}, uint64_t(s.slabs.withdrawn));
	m.single("rdmaswap_memserver_slabs_zeroing", "gauge",
		 "Released slabs not yet zeroed by the scrubber thread (counted as free, or as "
		 "withdrawn if wanted back); a slab whose accesses are still open waits for them.",
		 s.slabs.zeroing);
	m.single("rdmaswap_memserver_giveback_pending_slabs", "gauge",
		 "Granted slabs wanted back (give-back), waiting for their client to move them.",
		 s.slabs.wanted);
	m.family("rdmaswap_memserver_sessions", "gauge",
		 "Client sessions: attached (with a connection) or detached (kept for their "
		 "lease).");
	m.sample("rdmaswap_memserver_sessions", {{"state", "attached"}},
		 uint64_t(s.sessions.sessions - std::min(s.sessions.sessions, s.sessions.detached)));
	m.sample("rdmaswap_memserver_sessions", {{"state", "detached"}},
		 uint64_t(s.sessions.detached));
	m.single("rdmaswap_memserver_rdma_sessions", "gauge", "Sessions that use RDMA.",
		 s.sessions.rdma);
	m.single("rdmaswap_memserver_connections", "gauge", "TCP connections open.",
		 s.connections);
	m.single("rdmaswap_memserver_rdma_qps", "gauge", "RDMA queue pairs connected.", s.rdma_qps);
	m.single("rdmaswap_memserver_rdma_enabled", "gauge", "1 if the RDMA service runs.",
		 uint64_t(s.rdma));
	m.single("rdmaswap_memserver_connections_accepted_total", "counter",
		 "TCP connections admitted by the accept loop.", s.accepted);
	static constexpr const char *kVerdict[PeerTable::kVerdicts] = {
		nullptr, "connect_rate", "peer_connections", "max_connections", "peer_table_full"};
	m.family("rdmaswap_memserver_connections_refused_total", "counter",
		 "TCP connections closed at once by the accept loop, by the limit they hit.");
	for (size_t i = 1; i < PeerTable::kVerdicts; i++)
		m.sample("rdmaswap_memserver_connections_refused_total", {{"reason", kVerdict[i]}},
			 s.refused[i]);
	static constexpr const char *kEvent[4] = {"auth", "limit", "slow", "protocol"};
	m.family("rdmaswap_memserver_peer_errors_total", "counter",
		 "Things peers did wrong, by kind: auth (failed authentication, or an op refused "
		 "for want of it or of the admin key), limit (a per-peer limit hit), slow (a "
		 "deadline missed), protocol (a malformed message).");
	for (size_t i = 0; i < 4; i++)
		m.sample("rdmaswap_memserver_peer_errors_total", {{"kind", kEvent[i]}},
			 s.peer_events[i]);
	// RDMA reads and writes are one-sided: this host's CPU never sees them.
	m.family("rdmaswap_memserver_requests_total", "counter",
		 "READ and WRITE requests served, by transport and direction (TCP only: RDMA "
		 "transfers are one-sided and never reach the memserver).");
	m.sample("rdmaswap_memserver_requests_total", {{"transport", "tcp"}, {"direction", "read"}},
		 s.tcp_read_ops);
	m.sample("rdmaswap_memserver_requests_total", {{"transport", "tcp"}, {"direction", "write"}},
		 s.tcp_write_ops);
	m.family("rdmaswap_memserver_bytes_total", "counter",
		 "Bytes read and written by clients, by transport and direction (TCP only).");
	m.sample("rdmaswap_memserver_bytes_total", {{"transport", "tcp"}, {"direction", "read"}},
		 s.tcp_read_bytes);
	m.sample("rdmaswap_memserver_bytes_total", {{"transport", "tcp"}, {"direction", "write"}},
		 s.tcp_write_bytes);
	m.single("rdmaswap_memserver_requests_refused_total", "counter",
		 "READ and WRITE requests refused (EACCES): the slab is not the session's, or "
		 "the range lies outside it.",
		 s.tcp_refused);
	return m.take();
}

} // namespace rdmaswap
