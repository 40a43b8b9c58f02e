// SPDX-License-Identifier: MIT
// The plugin's start (plugin.h): before the fork, the donors (server=, etcd, the donor cache, the
// holders record) and which of them answer; after it, the process made safe for a swap server,
// the transport chosen, the Volume and its Membership started. And the holders record, which
// the start reads and the membership thread keeps.
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/cluster/holders.h"
#include "common/cluster/probe.h"
#include "common/cluster/start.h"
#include "common/net/socket.h"
#include "common/net/verbs.h"
#include "common/obs/log.h"
#include "common/transport/control_client.h"
#include "common/transport/data_path_base.h"
#include "common/transport/rdma/client.h"
#include "common/transport/remote_server.h"
#include "common/util/err_text.h"
#include "common/util/swap_safety.h"
#include "nbdkit-plugin/plugin.h"

namespace rdmaswap::plugin {

// (In this order: destroyed in reverse, the membership before the volume before the RDMA
// context; stop_threads() does the same explicitly.)
std::vector<Endpoint> g_servers;   // server= and the donors etcd (or its cache) gave
std::vector<Endpoint> g_reachable; // servers that answered in get_ready
// What the start knows of each donor (get_ready): its hint, whether it answered the probe (only
// those that may hold slabs, and server= entries, are probed) and whether it may hold slabs
// of the volume (in the holders record; every donor without a record).
std::vector<Membership::Candidate> g_candidates;
bool g_recording = false; // the holders record is kept (spread > 0)
std::unique_ptr<rdma::ClientContext> g_rdma;
std::unique_ptr<Volume> g_volume;
std::unique_ptr<Membership> g_membership; // after g_volume: destroyed first
TransportKind g_chosen = TransportKind::Tcp;
std::unique_ptr<StatusWriter, ThreadDeleter> g_status;
std::unique_ptr<ShutdownWatcher, ThreadDeleter> g_shutdown;

static discovery::ListOptions etcd_list_options()
{
	discovery::ListOptions o;
	o.endpoints = g_cfg.etcd;
	o.prefix = g_cfg.etcd_prefix;
	o.verifier = g_cfg.donor_verifier; // (donor-ca=: signed registrations only)
	o.timeout = g_cfg.timeout;
	o.credentials = g_cfg.etcd_credentials; // (etcd-cacert= ...: TLS and etcd's auth)
	return o;
}

// The hints etcd published at start (discovery), for donors the start does not probe.
std::vector<discovery::Donor> g_registered;
discovery::Ignored g_ignored; // the entries the start's listing left out
int64_t g_listed_revision = 0; // the start's listing's revision (0: none)
// The donors etcd's copy of the holders record names (read_holders): contacted at start, but on
// etcd's word alone none counts as missing or enters the local record (issue 26, S2).
std::vector<Endpoint> g_etcd_holders;
uint64_t g_holders_ignored = 0; // etcd's copy ignored: not signed by the volume key

// The holders record's unreachable times (holders::Unreachable): as the start read them
// (read_holders), and as this run keeps them (bound_holders), cleared for a donor as it is
// connected (holder_reached). The latter with the donors last recorded, under g_holders_mu:
// the membership thread writes the record too.
holders::Unreachable g_read_unreachable;
std::mutex g_holders_mu;
holders::Unreachable g_unreachable;
std::vector<Endpoint> g_recorded; // the record as last stored

// The holders record (spread > 0; common/cluster/membership.h): the donors that may hold slabs of
// the volume. The local file decides; without it (a first start, or a lost file) every donor
// may hold slabs and the start contacts them all. etcd's copy only adds donors to contact
// (g_etcd_holders), never to the record.
static std::optional<std::vector<Endpoint>> read_holders()
{
	std::optional<std::vector<Endpoint>> record;
	try {
		record = holders::read_file(g_cfg.holders_file, g_cfg.volume, &g_read_unreachable);
	} catch (const std::exception &e) {
		warn("%s: every donor is contacted at this start", e.what());
	}
	if (!g_cfg.etcd.empty()) {
		const auto got = holders::get_etcd(etcd_list_options(), g_cfg.volume,
						   &g_cfg.volume_key->public_key());
		if (got.status == holders::EtcdRecord::Status::Failed) {
			nbdkit_debug("rdmaswap: etcd: the holders record not read: %s",
				     got.why.c_str());
		} else if (got.status == holders::EtcdRecord::Status::Ignored) {
			g_holders_ignored++; // (issue 26: only a copy this volume's key signed)
			warn("etcd: the holders record ignored: %s", got.why.c_str());
		} else
			for (const auto &ep : got.donors) {
				// Not into the record: a donor named by etcd alone is contacted, kept
				// only if it hands slabs of the volume back (issue 26, S2).
				g_etcd_holders.push_back(ep);
				if (std::find(g_servers.begin(), g_servers.end(), ep) == g_servers.end())
					g_servers.push_back(ep); // contacted: it may hold slabs
			}
	}
	return record;
}

// Store the holders record (with g_unreachable's times of its donors): the file, then etcd's
// copy (best effort: the file decides). Fails, saying why, if the file could not be written.
// Caller holds g_holders_mu.
static Result<Ok> store_holders(const std::vector<Endpoint> &donors)
{
	try {
		holders::write_file(g_cfg.holders_file, g_cfg.volume, donors, g_unreachable);
	} catch (const std::exception &e) {
		return Result<Ok>::fail(e.what());
	}
	g_recorded = donors;
	if (!g_cfg.etcd.empty())
		if (const auto put = holders::put_etcd(etcd_list_options(), g_cfg.volume, donors,
						       g_unreachable, g_cfg.volume_key.get());
		    !put)
			logger("membership")->debug("etcd: the holders record not stored: {}",
						    put.error);
	return Result<Ok>::of({});
}

static Result<Ok> write_holders(const std::vector<Endpoint> &donors)
{
	std::lock_guard lock(g_holders_mu);
	return store_holders(donors);
}

// A recorded donor that the start could not reach is connected now: the record no longer says
// it is unreachable, before the connection is made (so that a restart after this run does not
// drop a donor that may hold slabs of it). Throws std::runtime_error if the record cannot be
// stored (the donor is then not connected now: Membership retries it).
static void holder_reached(const Endpoint &ep)
{
	if (!g_recording)
		return;
	std::lock_guard lock(g_holders_mu);
	const auto it = g_unreachable.find(ep.str());
	if (it == g_unreachable.end())
		return;
	const auto since = *it;
	g_unreachable.erase(it);
	if (const auto stored = store_holders(g_recorded); !stored) {
		g_unreachable.insert(since);
		throw std::runtime_error("cannot record that " + ep.str() + " is reachable again: " +
					 stored.error);
	}
}

// With etcd=: g_servers from server=, etcd and the donor cache (discovery::discover), and
// replicas= checked against them. 0, or -1 after an error message.
static int discover_donors()
{
	discovery::DiscoverOptions o;
	o.list = etcd_list_options();
	o.servers = g_cfg.servers;
	o.cache_path = g_cfg.donor_cache;
	auto found = discovery::discover(o);
	if (!found) {
		nbdkit_error("rdmaswap: %s", found.error.c_str());
		return -1;
	}
	g_servers = std::move(found->servers); // (at most discovery::kMaxListed from etcd)
	g_registered = std::move(found->registered);
	g_ignored = std::move(found->ignored);
	g_listed_revision = found->revision;
	if (g_cfg.replicas == 0)
		g_cfg.replicas = g_servers.size() >= 2 ? 2 : 1;
	if (g_cfg.replicas > g_servers.size()) {
		nbdkit_error("rdmaswap: replicas=%u needs at least %u memservers, %zu known "
			     "(server= and etcd)",
			     g_cfg.replicas, g_cfg.replicas, g_servers.size());
		return -1;
	}
	return 0;
}

// A probe of memserver `ep` (probe.h): an authenticated STATS on a connection of its own, done
// by `deadline`. Its counts, or nullopt with `why` set. Throws std::runtime_error when the
// name does not resolve (a failure to probe_all).
static Result<DonorLoad> probe_donor(const Endpoint &ep, ProbeClock::time_point deadline)
{
	const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
		deadline - ProbeClock::now());
	if (left.count() <= 0)
		return Result<DonorLoad>::fail("no time left");
	ControlClient cc(resolve(ep), left, g_cfg.auth_key);
	proto::StatsReply st;
	if (const int err = cc.stats(st))
		return Result<DonorLoad>::fail(connect_error_text(err));
	return Result<DonorLoad>::of(DonorLoad{st.slabs_total - std::min(st.slabs_free, st.slabs_total),
					       st.slabs_total, true, st.sessions});
}

// Before nbdkit forks: find the donors in etcd (etcd=), then check which memservers answer,
// so that a typo or a dead donor is a clear startup error rather than EIO later. Unreachable
// donors are tolerated (with a warning) while at least `replicas` answer. Only plain sockets
// here: RDMA resources come after the fork.
int get_ready()
{
	if (g_cfg.etcd.empty()) {
		g_servers = g_cfg.servers;
	} else {
		try {
			if (discover_donors() < 0)
				return -1;
		} catch (const std::exception &e) {
			nbdkit_error("rdmaswap: etcd: %s", e.what());
			return -1;
		}
	}
	g_recording = g_cfg.spread > 0;
	const size_t nlisted = g_servers.size(); // server=, and etcd's listing (or its cache)
	std::optional<std::vector<Endpoint>> record;
	if (g_recording)
		record = read_holders();
	if (record)
		for (const auto &ep : *record)
			if (std::find(g_servers.begin(), g_servers.end(), ep) == g_servers.end())
				g_servers.push_back(ep); // no longer listed: it may still hold slabs
	// Which donors answer (common/cluster/start.h); a single server= that does not is an error.
	StartProbe in;
	in.known = g_servers;
	in.listed = nlisted;
	in.record = record ? &*record : nullptr;
	in.etcd_holders = g_etcd_holders;
	in.configured = g_cfg.servers;
	in.registered = g_registered;
	in.spread = g_cfg.spread;
	in.replicas = g_cfg.replicas;
	in.timeout = g_cfg.timeout;
	StartProbeResult probed = probe_start(in, probe_donor);
	g_candidates = std::move(probed.candidates);
	g_reachable = std::move(probed.reachable);
	auto &unreachable = probed.unreachable;
	if (g_servers.size() == 1 && unreachable.size() == 1) {
		nbdkit_error("rdmaswap: memserver %s is not reachable: %s",
			     unreachable[0].first.c_str(), unreachable[0].second.c_str());
		unreachable.clear();
	}
	// One line for them all (a record may name many donors gone for good).
	if (unreachable.size() == 1)
		warn("memserver %s is not reachable: %s", unreachable[0].first.c_str(),
		     unreachable[0].second.c_str());
	else if (!unreachable.empty())
		warn("%zu memservers not reachable: %s", unreachable.size(),
		     log_summary(unreachable).c_str());
	nbdkit_debug("rdmaswap: %zu memservers probed in %lld ms: %zu answered, %zu did not, %zu "
		     "left unprobed",
		     probed.probed, (long long)probed.took.count(), g_reachable.size(),
		     probed.failed, probed.not_probed);
	const size_t usable = g_reachable.size();
	if (usable < g_cfg.replicas) {
		nbdkit_error("rdmaswap: %zu of %zu memservers reachable, replicas=%u needs %u",
			     usable, g_servers.size(), g_cfg.replicas, g_cfg.replicas);
		return -1;
	}
	if (g_cfg.transport == TransportKind::Rdma && !rdma::devices_present()) {
		nbdkit_error("rdmaswap: transport=rdma but this host has no RDMA device "
			     "(for Soft-RoCE: rdma link add rxe0 type rxe netdev ETH)");
		return -1;
	}
	return 0;
}

// The holders record stays bounded (issue 29): a host restarted many times over a day with new
// donors each time would otherwise name every donor it ever used, and contact (probe) each of
// them at every start. The record of this start keeps every donor of this run (plan.start);
// of the recorded donors that could not be contacted now (they hold nothing of this run) it
// drops (holders::age_record)
// - with lease=0 all: nothing of the volume outlives a run (a donor frees it when its session
//   ends), so they hold nothing of it;
// - otherwise those not reachable for longer than the lease (since a start first found them
//   so: the record keeps that time): whatever they held of an earlier run has expired;
// and keeps at most kMaxUncontacted of the others, the first by name (they may still hold
// slabs of an earlier run, which this run already counts as missing).
static constexpr size_t kMaxUncontacted = 32;

static void bound_holders(Membership::StartPlan &plan)
{
	std::vector<Endpoint> reached;
	for (const auto &s : plan.start)
		reached.push_back(s.ep);
	const auto now = std::chrono::duration_cast<std::chrono::seconds>(
				 std::chrono::system_clock::now().time_since_epoch())
				 .count();
	std::lock_guard lock(g_holders_mu);
	holders::AgedRecord aged = holders::age_record(plan.record, reached, g_read_unreachable,
						       now, g_cfg.lease, kMaxUncontacted);
	if (aged.dropped_lease)
		logger("plugin")->info("the holders record drops {} donor(s) not contacted now ({})",
				       aged.dropped_lease,
				       g_cfg.lease == 0
					       ? "lease=0: they hold nothing of the volume"
					       : fmt::format("not reachable for longer than lease={} s: "
							     "what they held of the volume has expired",
							     g_cfg.lease));
	if (aged.dropped_cap)
		logger("plugin")->info("the holders record drops {} donor(s) not contacted now (more "
				       "than {} such donors)",
				       aged.dropped_cap, kMaxUncontacted);
	plan.record = std::move(aged.donors);
	g_unreachable = std::move(aged.unreachable);
}

// A session with memserver `ep` for the volume, with the plugin's settings (after the fork:
// g_chosen and g_rdma are set). Throws std::runtime_error (VolumeProofRefused for a refused
// proof of the volume key).
static std::unique_ptr<Server> connect_donor(const Endpoint &ep)
{
	holder_reached(ep);
	RemoteServerOptions o;
	o.endpoint = ep;
	o.kind = g_chosen;
	o.timeout = g_cfg.timeout;
	o.rdma = g_rdma.get();
	o.auth_key = g_cfg.auth_key;
	o.volume = g_cfg.volume;
	o.lease_s = g_cfg.lease;
	o.volume_key = g_cfg.volume_key;
	return std::make_unique<RemoteServer>(o);
}

static int start_serving()
{
	log_destination_after_fork();
	// A swap server whose own pages can be swapped out deadlocks under pressure. nbdkit --swap
	// locks memory; if it did not (or the locks were not kept), lock it here.
	// (Only without a finite RLIMIT_MEMLOCK: under one, MCL_FUTURE would make later
	// allocations fail once the limit is reached.)
	rlimit rl{};
	getrlimit(RLIMIT_MEMLOCK, &rl);
	const bool unlimited = geteuid() == 0 || rl.rlim_cur == RLIM_INFINITY;
	if (locked_kib() == 0) {
		if (unlimited && mlockall(MCL_CURRENT | MCL_FUTURE) == 0)
			nbdkit_debug("rdmaswap: memory was not locked (nbdkit without --swap?): "
				     "locked it with mlockall");
		else
			warn("memory is not locked and mlockall failed (%s): run nbdkit with --swap "
			     "and a sufficient RLIMIT_MEMLOCK before using this device as swap",
			     unlimited ? err_text(errno) : "RLIMIT_MEMLOCK is limited");
	}
	// A swap device's server must not wait on memory reclaim that waits on it
	// (PR_SET_IO_FLUSHER, Linux >= 5.6, needs CAP_SYS_RESOURCE). Inherited by the worker
	// threads nbdkit starts after this.
	if (const auto r = set_io_flusher(); !r)
		nbdkit_debug("rdmaswap: %s", r.error.c_str());
	// Real-time threads may take pages from the reserve below the min watermark: when the
	// whole host is short of memory, a reply to the kernel (a socket buffer) must not wait on
	// the reclaim that waits on that reply. Inherited by the threads nbdkit starts after this.
	if (g_cfg.realtime) {
		if (const auto r = set_realtime(int(g_cfg.realtime)); !r) {
			if (g_cfg.realtime_set)
				warn("realtime=%u: %s (needs CAP_SYS_NICE)", g_cfg.realtime,
				     r.error.c_str());
			else
				nbdkit_debug("rdmaswap: %s (needs CAP_SYS_NICE)", r.error.c_str());
		}
	}
	// Spin briefly before sleeping in data path waits only where a core is spare: decided
	// once, before any data path exists (common/transport/data_path_base.h).
	const unsigned cpus = affinity_cpus();
	set_busy_poll(g_cfg.busy_poll < 0 ? cpus >= kBusyPollMinCpus : g_cfg.busy_poll == 1);
	nbdkit_debug("rdmaswap: busy-poll=%s: %s (%u CPUs in the affinity set; auto needs %u)",
		     g_cfg.busy_poll < 0 ? "auto" : g_cfg.busy_poll ? "on" : "off",
		     busy_poll() ? "on" : "off", cpus, kBusyPollMinCpus);
	// Before anything below waits on the network (and after the settings above, which the
	// watcher's thread inherits: every thread of nbdkit's runs real-time).
	g_shutdown = start_shutdown_watcher();
	try {
		g_chosen = g_cfg.transport;
		if (g_chosen == TransportKind::Auto) {
			std::string why = "no RDMA device";
			auto reach = [&why](const Endpoint &ep) {
				auto r = rdma::can_reach(ep, g_cfg.timeout);
				if (!r)
					why = std::move(r.error);
				return bool(r);
			};
			bool ok = rdma::devices_present();
			for (const auto &ep : g_reachable)
				ok = ok && reach(ep);
			if (g_reachable.empty()) // none probed (etcd's donors only): the first of them
				ok = ok && reach(g_candidates[0].ep);
			g_chosen = ok ? TransportKind::Rdma : TransportKind::Tcp;
			nbdkit_debug("rdmaswap: transport=auto chose %s%s%s", transport_name(g_chosen),
				     ok ? "" : ": ", ok ? "" : why.c_str());
		}
		if (g_chosen == TransportKind::Rdma)
			g_rdma = std::make_unique<rdma::ClientContext>(
				g_reachable.empty() ? g_candidates[0].ep : g_reachable[0], g_cfg.timeout);
		// The donors that may hold slabs of the volume, and the donor set's members.
		Membership::StartPlan plan =
			Membership::plan_start(g_cfg.spread, g_candidates, connect_donor);
		if (plan.servers.size() < g_cfg.replicas) {
			nbdkit_error("rdmaswap: %zu of %zu memservers usable for volume %s, replicas=%u "
				     "needs %u",
				     plan.servers.size(), g_servers.size(), g_cfg.volume.c_str(),
				     g_cfg.replicas, g_cfg.replicas);
			return -1;
		}
		bound_holders(plan);
		// The record before any slab or floor can go anywhere new.
		if (g_recording)
			if (const auto stored = write_holders(plan.record); !stored) {
				nbdkit_error("rdmaswap: %s (a restart would not know where the volume's "
					     "slabs are)",
					     stored.error.c_str());
				return -1;
			}
		VolumeOptions vo;
		vo.size = g_cfg.size;
		vo.channels = g_cfg.channels;
		vo.paths = g_cfg.paths ? g_cfg.paths : g_cfg.channels;
		vo.timeout = g_cfg.timeout;
		vo.replicas = g_cfg.replicas;
		vo.missing_servers = plan.missing;
		vo.start_holders = plan.start_holders;
		vo.backup_path = g_cfg.backup;
		vo.backup_volume = g_cfg.volume;
		vo.backup_queue = g_cfg.backup_queue;
		vo.run_id = g_cfg.run_id;
		vo.previous_run_id = g_cfg.previous_run_id;
		g_volume = std::make_unique<Volume>(std::move(plan.servers), vo);
		// Donors that did not answer now, and (etcd=) those registered later, join while
		// the volume serves; with spread= only the donor set's members are connected.
		Membership::Options mo;
		mo.servers = g_cfg.servers;
		if (!g_cfg.etcd.empty())
			mo.registry = etcd_list_options();
		mo.spread = g_cfg.spread;
		mo.idle = std::chrono::seconds(g_cfg.idle_disconnect);
		if (g_recording)
			mo.record = write_holders;
		mo.recorded = plan.record;
		mo.holders_ignored = g_holders_ignored;
		// What the start learnt: etcd's listing (the watch goes on from its revision) and
		// the probes' answers; later registrations are probed before they are used.
		mo.registered = std::move(g_registered);
		mo.ignored = g_ignored;
		mo.revision = g_listed_revision;
		for (const auto &c : g_candidates)
			if (c.probed)
				mo.probed.push_back({c.ep, c.reachable, c.hint});
		mo.probe = probe_donor;
		mo.timeout = g_cfg.timeout;
		if (g_throw_steps)
			mo.fault = [left = g_throw_steps]() mutable {
				if (left > 0 && left--)
					throw std::out_of_range("test fault (RDMASWAP_TEST_THROW=membership)");
			};
		g_membership = std::make_unique<Membership>(*g_volume, connect_donor, std::move(mo),
							    plan.start);
		g_membership->start();
		if (g_throw_start)
			throw std::runtime_error("test fault (RDMASWAP_TEST_THROW=start)");
	} catch (const std::exception &e) {
		nbdkit_error("rdmaswap: %s", e.what());
		return -1;
	}
	if (!g_cfg.statusfile.empty() || !g_cfg.metricsfile.empty())
		g_status = start_status_writer();
	nbdkit_debug("rdmaswap: volume of %llu bytes over %zu memserver(s) via %s, slab size %llu, "
		     "%u replica(s)",
		     (unsigned long long)g_cfg.size, g_reachable.size(), transport_name(g_chosen),
		     (unsigned long long)g_volume->slab_size(), g_cfg.replicas);
	return 0;
}

int after_fork()
{
	const int r = start_serving();
	if (r)
		stop_threads(); // before nbdkit exits (S11)
	return r;
}

void stop_threads()
{
	// Nothing is served any more: no wait of the teardown below (a repair thread's control
	// call) may hold up the exit.
	g_shutdown.reset();
	request_stop();
	g_status.reset();
	g_membership.reset(); // its threads use the volume
	g_volume.reset();
	g_rdma.reset();
}

} // namespace rdmaswap::plugin
