// SPDX-License-Identifier: MIT
// Volume: counters and the status report (control path).
#include "common/volume/volume.h"

#include "common/volume/volume_internal.h"

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
		// No valid replica: served by the backup if it has the slab, else lost (EIO).
		const bool backup = backed(i);
		if (nrep == 0 && lost) {
			st.slabs_live += backup;
			(backup ? st.backup_only : st.lost)++;
		}
		if (nrep == 0)
			continue;
		st.slabs_live++;
		if (v == 0)
			(backup ? st.backup_only : st.lost)++;
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
	st.switch_blocks_max = switch_blocks_max_.load();
	if (backup_) {
		st.backup_unbacked = backup_->untrusted_count();
		st.backup_errors = backup_->write_errors();
		st.backup_full_waits = backup_->full_waits();
		st.backup_queued = backup_->queued_bytes();
	}
	return st;
}

VolumeReport Volume::report() const
{
	VolumeReport r;
	r.st = stats();
	r.size = size_;
	r.slab_size = slab_size_;
	r.replicas = replicas_;
	const size_t nserv = servers();
	// The I/O channels' and paths' counters are summed without taking a lock: SoloCounters
	// and the data paths' counters() are read relaxed (docs/performance.md, "RDMA path
	// accounting").
	for (const auto &ch : channels_) {
		r.reads += ch->reads.get();
		r.writes += ch->writes.get();
		r.read_bytes += ch->read_bytes.get();
		r.write_bytes += ch->write_bytes.get();
		r.read_latency += ch->read_latency.snapshot();
		r.write_latency += ch->write_latency.snapshot();
	}
	for (size_t k = 0; k < nserv; k++)
		for (unsigned p = 0; p < io_paths_[k]->n; p++)
			r.dp += io_paths_[k]->path[p].dp->counters();
	for (size_t op = 0; op < kVolumeOps; op++)
		for (size_t e = 0; e < kVolumeErrs; e++)
			r.errors[op][e] = errors_[op][e].load(std::memory_order_relaxed);
	r.lock_timeouts = lock_timeouts_.load(std::memory_order_relaxed);
	const int64_t now = now_ns();
	for (size_t i = 0; i < nserv; i++) {
		const bool alive = servers_[i]->session_alive();
		const bool down = now < sstate_[i].down_until.load();
		r.donors.push_back({servers_[i]->name(),
				    sstate_[i].closed.load()	 ? "closed"
				    : !alive			 ? "lost"
				    : down			 ? "failed"
				    : sstate_[i].retired.load() ? "retired"
				    : sstate_[i].outside.load() ? "outside"
								 : "ok",
				    sstate_[i].used.load(), sstate_[i].gen.load(),
				    servers_[i]->slabs_free()});
	}
	return r;
}

std::string Volume::status_text() const
{
	const VolumeReport r = report();
	const VolumeStats &st = r.st;
	std::string out;
	auto kv = [&](const std::string &k, const std::string &v) { out += k + "=" + v + "\n"; };
	kv("size", std::to_string(r.size));
	kv("slab_size", std::to_string(r.slab_size));
	kv("replicas", std::to_string(r.replicas));
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
	kv("switch_blocks_max", std::to_string(st.switch_blocks_max));
	if (backup_) {
		kv("backup", backup_->path());
		kv("backup_only", std::to_string(st.backup_only));
		kv("backup_unbacked", std::to_string(st.backup_unbacked));
		kv("backup_errors", std::to_string(st.backup_errors));
		kv("backup_full_waits", std::to_string(st.backup_full_waits));
		kv("backup_queued_bytes", std::to_string(st.backup_queued));
	}
	kv("io_requests", std::to_string(r.reads + r.writes));
	kv("io_reads", std::to_string(r.reads));
	kv("io_writes", std::to_string(r.writes));
	kv("io_read_bytes", std::to_string(r.read_bytes));
	kv("io_write_bytes", std::to_string(r.write_bytes));
	kv("data_batches", std::to_string(r.dp.batches));
	kv("rdma_posts", std::to_string(r.dp.posts));
	kv("rdma_doorbells", std::to_string(r.dp.doorbells));
	kv("rdma_polls", std::to_string(r.dp.polls));
	kv("rdma_polls_empty", std::to_string(r.dp.polls_empty));
	kv("rdma_completions", std::to_string(r.dp.completions));
	kv("rdma_arms", std::to_string(r.dp.arms));
	kv("rdma_sleeps", std::to_string(r.dp.sleeps));
	for (size_t i = 0; i < r.donors.size(); i++) {
		const auto &d = r.donors[i];
		kv("donor." + std::to_string(i),
		   d.name + " state=" + d.state + " slabs=" + std::to_string(d.slabs) +
			   " generation=" + std::to_string(d.generation) +
			   " free_on_donor=" + std::to_string(d.free_on_donor));
	}
	return out;
}

std::string Volume::metrics_text() const
{
	const VolumeReport r = report();
	const VolumeStats &st = r.st;
	MetricsText m;
	m.single("rdmaswap_volume_size_bytes", "gauge", "Size of the block device.", r.size);
	m.single("rdmaswap_volume_slab_size_bytes", "gauge", "Slab size (unit of allocation).",
		 r.slab_size);
	m.single("rdmaswap_volume_replicas", "gauge", "Copies wanted of each slab (replicas=).",
		 r.replicas);
	m.single("rdmaswap_volume_slabs", "gauge", "Slabs the volume is cut into.", st.slabs);
	m.single("rdmaswap_volume_slabs_live", "gauge",
		 "Slabs holding data (at least one replica, valid or not).", st.slabs_live);
	m.single("rdmaswap_volume_slabs_degraded", "gauge",
		 "Live slabs with fewer valid replicas than wanted (repair pending).", st.degraded);
	m.single("rdmaswap_volume_slabs_lost", "gauge",
		 "Slabs with no valid replica: their reads and writes fail with EIO.", st.lost);
	if (backup_) {
		m.single("rdmaswap_volume_backup_only_slabs", "gauge",
			 "Slabs with no valid replica, served by the backup file (backup=).",
			 st.backup_only);
		m.single("rdmaswap_volume_backup_unbacked_slabs", "gauge",
			 "Slabs the backup file does not hold (write errors, unclean restart).",
			 st.backup_unbacked);
		m.single("rdmaswap_volume_backup_write_errors_total", "counter",
			 "Writes to the backup file that failed.", st.backup_errors);
		m.single("rdmaswap_volume_backup_full_waits_total", "counter",
			 "Writes that waited for room in the backup queue.", st.backup_full_waits);
		m.single("rdmaswap_volume_backup_queued_bytes", "gauge",
			 "Bytes queued for the backup file.", st.backup_queued);
	}

	static constexpr const char *kDir[2] = {"read", "write"};
	m.family("rdmaswap_volume_requests_total", "counter",
		 "Read and write requests served (failed ones too).");
	m.sample("rdmaswap_volume_requests_total", {{"direction", kDir[0]}}, r.reads);
	m.sample("rdmaswap_volume_requests_total", {{"direction", kDir[1]}}, r.writes);
	m.family("rdmaswap_volume_bytes_total", "counter",
		 "Bytes read and written by requests that succeeded.");
	m.sample("rdmaswap_volume_bytes_total", {{"direction", kDir[0]}}, r.read_bytes);
	m.sample("rdmaswap_volume_bytes_total", {{"direction", kDir[1]}}, r.write_bytes);
	m.family("rdmaswap_volume_request_duration_seconds", "histogram",
		 "Time from the plugin's call to its return, per read or write request.");
	m.histogram("rdmaswap_volume_request_duration_seconds", {{"direction", kDir[0]}},
		    r.read_latency);
	m.histogram("rdmaswap_volume_request_duration_seconds", {{"direction", kDir[1]}},
		    r.write_latency);
	static constexpr const char *kOp[kVolumeOps] = {"read", "write", "trim", "zero"};
	static constexpr const char *kErr[kVolumeErrs] = {"EIO", "ENOSPC", "EINVAL", "other"};
	m.family("rdmaswap_volume_errors_total", "counter",
		 "Requests that failed, by operation and the errno returned to the client.");
	for (size_t op = 0; op < kVolumeOps; op++)
		for (size_t e = 0; e < kVolumeErrs; e++)
			m.sample("rdmaswap_volume_errors_total", {{"op", kOp[op]}, {"errno", kErr[e]}},
				 r.errors[op][e]);
	m.single("rdmaswap_volume_lock_timeouts_total", "counter",
		 "Requests that found no free channel or slab lock within the bound (then EIO).",
		 r.lock_timeouts);

	m.single("rdmaswap_volume_repaired_slabs_total", "counter",
		 "Replicas re-created by the repair thread.", st.repaired);
	m.single("rdmaswap_volume_repaired_bytes_total", "counter",
		 "Bytes copied by the repair thread.", st.repair_bytes);
	m.single("rdmaswap_volume_migrated_slabs_total", "counter",
		 "Slabs moved off a donor that wanted them back (give-back).", st.migrated);
	m.single("rdmaswap_volume_migrated_bytes_total", "counter",
		 "Bytes copied by give-back moves.", st.migrate_bytes);
	m.family("rdmaswap_volume_migrate_seconds_total", "counter",
		 "Time spent copying give-back moves.");
	m.sample("rdmaswap_volume_migrate_seconds_total", {}, double(st.migrate_ms) / 1e3);
	m.single("rdmaswap_volume_migrate_pending_slabs", "gauge",
		 "Slabs wanted back by their donor that could not move at the last pass.",
		 st.migrate_pending);
	m.single("rdmaswap_volume_clone_aborts_total", "counter",
		 "Copies (repair, move) abandoned: a donor failed, or I/O needed the slab.",
		 st.clone_aborts);
	m.family("rdmaswap_volume_switch_max_seconds", "gauge",
		 "Longest exclusive switch-over section after a copy.");
	m.sample("rdmaswap_volume_switch_max_seconds", {}, double(st.switch_us_max) / 1e6);
	m.single("rdmaswap_volume_server_failures_total", "counter",
		 "Calls to a memserver that failed (it is then given no new slabs for a while).",
		 st.server_failures);
	m.single("rdmaswap_volume_epoch_raises_total", "counter",
		 "Degraded writes that raised a chunk's epoch (bound volumes).", st.epoch_raises);
	m.single("rdmaswap_volume_reattached_chunks_total", "counter",
		 "Chunks taken over from a previous plugin at start.", st.reattached);
	m.single("rdmaswap_volume_reattach_stale_total", "counter",
		 "Replicas found at start that were older than another: given back.",
		 st.reattach_stale);

	m.single("rdmaswap_volume_data_batches_total", "counter",
		 "Batches of data transfers completed (complete() calls).", r.dp.batches);
	m.single("rdmaswap_volume_data_posts_total", "counter",
		 "Data transfers handed to the transport (RDMA: work requests).", r.dp.posts);
	m.single("rdmaswap_volume_data_sleeps_total", "counter",
		 "Waits for a completion that slept in the kernel.", r.dp.sleeps);

	m.family("rdmaswap_volume_donor_state", "gauge",
		 "1 for the donor's state: ok, failed (cooling down after a failure), lost "
		 "(its session is gone), retired (no new slabs: its registration vanished), outside "
		 "(not in the donor set: new slabs only when no member has room) or closed "
		 "(disconnected: the volume held nothing there).");
	for (const auto &d : r.donors)
		for (const char *s : {"ok", "failed", "lost", "retired", "outside", "closed"})
			m.sample("rdmaswap_volume_donor_state", {{"donor", d.name}, {"state", s}},
				 uint64_t(std::string_view(d.state) == s));
	m.family("rdmaswap_volume_donor_slabs", "gauge", "Slabs of this volume on the donor.");
	for (const auto &d : r.donors)
		m.sample("rdmaswap_volume_donor_slabs", {{"donor", d.name}}, uint64_t(d.slabs));
	m.family("rdmaswap_volume_donor_free_slabs", "gauge",
		 "Free slabs the donor reported last.");
	for (const auto &d : r.donors)
		m.sample("rdmaswap_volume_donor_free_slabs", {{"donor", d.name}}, d.free_on_donor);
	m.family("rdmaswap_volume_donor_invalidations_total", "counter",
		 "Times the donor's replicas were invalidated (its generation).");
	for (const auto &d : r.donors)
		m.sample("rdmaswap_volume_donor_invalidations_total", {{"donor", d.name}},
			 uint64_t(d.generation));
	return m.take();
}

} // namespace rdmaswap
