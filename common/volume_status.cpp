// SPDX-License-Identifier: MIT
// Volume: counters and the status report (control path).
#include "common/volume.h"

#include "common/volume_internal.h"

namespace rdmaswap {

VolumeStats Volume::stats() const
{
	VolumeStats st;
	st.slabs = nslabs_;
	for (uint64_t i = 0; i < nslabs_; i++) {
		const Slab &s = slabs_[i];
		s.mu.lock_shared(); // holders never wait on the network exclusively
		const unsigned nrep = s.nrep, v = valid_count(s);
		const bool lost = s.lost;
		s.mu.unlock_shared();
		st.lost += nrep == 0 && lost;
		if (nrep == 0)
			continue;
		st.slabs_live++;
		st.lost += v == 0;
		st.degraded += v > 0 && v < replicas_;
	}
	st.repaired = repaired_.load();
	st.repair_bytes = repair_bytes_.load();
	st.server_failures = server_failures_.load();
	st.epoch_raises = epoch_raises_.load();
	st.reattached = reattached_.load();
	st.reattach_stale = reattach_stale_.load();
	st.migrated = migrated_.load();
	st.migrate_bytes = migrate_bytes_.load();
	st.migrate_pending = migrate_pending_.load();
	st.migrate_ms = migrate_ns_.load() / 1000000;
	st.clone_aborts = clone_aborts_.load();
	st.switch_us_max = switch_ns_max_.load() / 1000;
	return st;
}

std::string Volume::status_text() const
{
	const VolumeStats st = stats();
	std::string out;
	auto kv = [&](const std::string &k, const std::string &v) { out += k + "=" + v + "\n"; };
	kv("size", std::to_string(size_));
	kv("slab_size", std::to_string(slab_size_));
	kv("replicas", std::to_string(replicas_));
	kv("slabs", std::to_string(st.slabs));
	kv("slabs_live", std::to_string(st.slabs_live));
	kv("degraded", std::to_string(st.degraded));
	kv("lost", std::to_string(st.lost));
	kv("repaired", std::to_string(st.repaired));
	kv("repair_bytes", std::to_string(st.repair_bytes));
	kv("server_failures", std::to_string(st.server_failures));
	kv("epoch_raises", std::to_string(st.epoch_raises));
	kv("reattached", std::to_string(st.reattached));
	kv("reattach_stale", std::to_string(st.reattach_stale));
	kv("migrated", std::to_string(st.migrated));
	kv("migrate_bytes", std::to_string(st.migrate_bytes));
	kv("migrate_ms", std::to_string(st.migrate_ms));
	kv("migrate_pending", std::to_string(st.migrate_pending));
	kv("clone_aborts", std::to_string(st.clone_aborts));
	kv("switch_us_max", std::to_string(st.switch_us_max));
	// The I/O channels' requests and data path counters (not the repair thread's copies):
	// docs/performance.md, "RDMA path accounting".
	uint64_t reads = 0, writes = 0;
	DataPathCounters dp;
	for (const auto &ch : channels_) {
		reads += ch->reads.get();
		writes += ch->writes.get();
		for (const auto &p : ch->paths)
			dp += p->counters();
	}
	kv("io_requests", std::to_string(reads + writes));
	kv("io_reads", std::to_string(reads));
	kv("io_writes", std::to_string(writes));
	kv("data_batches", std::to_string(dp.batches));
	kv("rdma_posts", std::to_string(dp.posts));
	kv("rdma_doorbells", std::to_string(dp.doorbells));
	kv("rdma_polls", std::to_string(dp.polls));
	kv("rdma_polls_empty", std::to_string(dp.polls_empty));
	kv("rdma_completions", std::to_string(dp.completions));
	kv("rdma_arms", std::to_string(dp.arms));
	kv("rdma_sleeps", std::to_string(dp.sleeps));
	const int64_t now = now_ns();
	for (size_t i = 0; i < servers_.size(); i++) {
		const bool alive = servers_[i]->session_alive();
		const bool down = now < sstate_[i].down_until.load();
		kv("donor." + std::to_string(i),
		   servers_[i]->name() + " state=" + (!alive ? "lost" : down ? "failed" : "ok") +
			   " slabs=" + std::to_string(sstate_[i].used.load()) +
			   " generation=" + std::to_string(sstate_[i].gen.load()) +
			   " free_on_donor=" + std::to_string(servers_[i]->slabs_free()));
	}
	return out;
}

} // namespace rdmaswap
