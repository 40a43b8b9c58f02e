// SPDX-License-Identifier: MIT
// Volume: epochs and floors of bound volumes (docs/replication.md, "Restart"). A write taken
// by fewer than `replicas` replicas is acknowledged only once the replicas that took it carry
// an epoch above every other replica of the chunk, recorded as a floor on the other donors.
#include "common/volume/volume.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/obs/log.h"
#include "common/util/deadline.h"
#include "common/util/err_text.h"
#include "common/volume/volume_internal.h"

namespace rdmaswap {

Volume::Epochs Volume::epochs(const Slab &s, uint8_t took)
{
	Epochs r;
	for (unsigned k = 0; k < s.nrep; k++) {
		const uint64_t e = s.rep[k].epoch;
		if (took & (1u << k))
			r.min_took = std::min(r.min_took, e);
		else
			r.max_other = std::max(r.max_other, e);
		r.max_all = std::max(r.max_all, e);
	}
	return r;
}

bool Volume::fenced(const Slab &s, uint8_t took) const
{
	std::lock_guard lock(s.epoch_mu);
	return epochs(s, took).fenced(s.floored);
}

int Volume::fence_write(uint64_t slab)
{
	Slab &s = slabs_[slab];
	if (!lock_maint(s, deadline())) {
		logger("volume")->warn("slab {}: a degraded write could not be fenced in time: EIO",
				       slab);
		return EIO;
	}
	std::unique_lock maint(s.maint, std::adopt_lock);
	return fence_slow(slab);
}

int Volume::fence_slow(uint64_t slab)
{
	Slab &s = slabs_[slab];
	// rep[] cannot change while we hold `maint`. Every valid replica holds the write (see
	// volume.h); the others may not, and must end up with a lower epoch.
	uint8_t took = 0;
	for (unsigned k = 0; k < s.nrep; k++)
		if (valid(s.rep[k]))
			took |= uint8_t(1u << k);
	if (!took && backed(slab)) {
		// Held by the backup alone: every replica left is stale. A floor above them all,
		// so that a restart never takes one of them for current.
		uint64_t target;
		{
			std::lock_guard lock(s.epoch_mu);
			const Epochs e = epochs(s, 0);
			if (e.fenced(s.floored))
				return 0;
			target = std::max(s.epoch, e.max_all) + 1;
		}
		record_floor(slab, target, {});
		epoch_raises_.fetch_add(1);
		std::lock_guard lock(s.epoch_mu);
		s.epoch = target;
		s.floored = target;
		return 0;
	}
	if (!took)
		return EIO; // no replica that holds the write is still valid
	uint64_t target, min_took;
	{
		std::lock_guard lock(s.epoch_mu);
		const Epochs e = epochs(s, took);
		if (e.fenced(s.floored))
			return 0; // fenced already (by an earlier write since the replica set shrank)
		min_took = e.min_took;
		target = e.min_took > e.max_other ? e.min_took : e.max_all + 1;
	}
	unsigned holders = 0; // replicas that now carry `target`
	for (unsigned k = 0; k < s.nrep; k++) {
		if (!(took & (1u << k)))
			continue;
		Replica &r = s.rep[k];
		if (r.epoch != target) {
			if (int err = servers_[r.server]->set_tag(r.grant.id, slab, target)) {
				logger("volume")->debug("slab {}: raising the epoch on {} failed: {}", slab,
							servers_[r.server]->name(), err_text(err));
				if (err == ECANCELED && stop_requested())
					return EIO; // stopping: no failure of the donor
				if (sstate_[r.server].gen.load() == r.gen)
					invalidate(r.server);
				continue;
			}
			std::lock_guard lock(s.epoch_mu);
			r.epoch = target;
		}
		holders++;
	}
	if (!holders)
		return EIO; // no replica that took the write could be marked newest
	if (target != min_took)
		epoch_raises_.fetch_add(1);
	{
		std::lock_guard lock(s.epoch_mu);
		s.epoch = target;
	}
	// Witnesses: the other donors (not those holding a replica of this slab, which are
	// stale or failed) learn the floor, so that a restart that finds only an older replica
	// knows it is stale. Best effort, and skipped for donors on cooldown (they may hang).
	uint16_t holding[kMaxReplicas];
	for (unsigned k = 0; k < s.nrep; k++)
		holding[k] = s.rep[k].server;
	record_floor(slab, target, std::span(holding, s.nrep));
	std::lock_guard lock(s.epoch_mu);
	s.floored = target;
	return 0;
}

void Volume::record_floor(uint64_t slab, uint64_t epoch, std::span<const uint16_t> skip)
{
	const size_t nserv = servers();
	for (size_t i = 0; i < nserv; i++) {
		if (std::find(skip.begin(), skip.end(), uint16_t(i)) != skip.end() ||
		    !servers_[i]->session_alive() || sstate_[i].closed.load() ||
		    is_down(uint16_t(i)))
			continue;
		if (int err = servers_[i]->set_floor(slab, epoch)) {
			// A witness that fails (or hangs for the timeout) is not asked again during
			// its cooldown: the next degraded write must not wait on it too.
			logger("volume")->debug("slab {}: floor on {} not recorded: {}", slab,
						servers_[i]->name(), err_text(err));
			mark_down(uint16_t(i));
		}
	}
}

} // namespace rdmaswap
