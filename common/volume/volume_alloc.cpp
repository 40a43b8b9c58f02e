// SPDX-License-Identifier: MIT
// Volume: placement, allocation of a slab's replicas on its first write, and giving slabs
// back (trim). Control calls here run with no slab lock and no channel held; the slab's
// `maint` lock orders them.
#include "common/volume/volume.h"

#include <cerrno>
#include <cstring>

#include "common/obs/log.h"
#include "common/util/err_text.h"
#include "common/volume/placement.h"
#include "common/volume/volume_internal.h"

namespace rdmaswap {

bool Volume::lock_maint(Slab &s, Clock::time_point until)
{
	s.yield.fetch_add(1); // a copy in progress gives way (CloneJob)
	const bool got = s.maint.try_lock_until(until);
	s.yield.fetch_sub(1);
	return got;
}

unsigned Volume::place(unsigned want, std::span<const uint16_t> exclude, bool down_too,
		       uint16_t *out)
{
	unsigned n = 0;
	bool asked = false; // no donor inside the set could take it: wake membership
	{
		std::lock_guard lock(place_mu_); // the rng and the load table; held for no network call
		DonorLoad *loads = place_loads_.get();
		const size_t nserv = servers();
		const int64_t now = now_ns();
		// Pass 1: donors inside the set, not cooling down; 2: cooling down too if `down_too`
		// (every donor with room recently failed: a write that needs a slab tries them rather
		// than give up; a copy waits for the next pass); 3: outside the set too (the set's
		// members are full or gone and membership has not replaced them yet).
		auto fill = [&](bool allow_down, bool allow_outside) {
			for (size_t i = 0; i < nserv; i++) {
				const ServerInfo &info = servers_[i]->info();
				const uint32_t free = servers_[i]->slabs_free();
				uint32_t used = info.slabs_total - std::min(free, info.slabs_total);
				// ALLOCs in flight add load; they never make a donor with a free slab
				// ineligible (they may fail, and its free count says what it has).
				if (used < info.slabs_total)
					used = std::min(used + sstate_[i].placing.load(), info.slabs_total - 1);
				loads[i] = DonorLoad{
					used, info.slabs_total,
					servers_[i]->session_alive() && !sstate_[i].retired.load() &&
						!sstate_[i].closed.load() &&
						(allow_outside || !sstate_[i].outside.load()) &&
						(allow_down || now >= sstate_[i].down_until.load())};
			}
		};
		for (int pass = 0; pass < 3 && n == 0; pass++) {
			fill(pass >= 1 && down_too, pass >= 2);
			n = place_slab(std::span(loads, nserv), want, exclude, rng_, out);
			asked = asked || (pass == 1 && n == 0);
		}
		for (unsigned k = 0; k < n; k++)
			sstate_[out[k]].placing.fetch_add(1); // grant() takes it back once answered
	}
	if (asked)
		need_donor();
	return n;
}

void Volume::donors_changed()
{
	{
		std::lock_guard lock(donors_mu_);
		donors_epoch_.fetch_add(1);
	}
	donors_cv_.notify_all();
}

bool Volume::wait_for_donors(uint64_t seen)
{
	std::unique_lock lock(donors_mu_);
	return donors_cv_.wait_for(lock, timeout_, [&] {
		return donors_epoch_.load() != seen || stop_.load();
	}) && !stop_.load();
}

void Volume::need_donor()
{
	struct Call { // counted while it runs, however it ends
		std::atomic<unsigned> &n;
		explicit Call(std::atomic<unsigned> &c) : n(c) { n.fetch_add(1, std::memory_order_seq_cst); }
		~Call() { n.fetch_sub(1, std::memory_order_seq_cst); }
		Call(const Call &) = delete;
		Call &operator=(const Call &) = delete;
	} call(need_donor_calls_);
	if (const NeedDonorHook *h = need_donor_.load(std::memory_order_seq_cst); h && h->fn)
		h->fn(h->arg);
}

unsigned Volume::grant(uint64_t slab, uint64_t epoch, unsigned want,
		       std::span<const uint16_t> exclude, bool down_too, Replica *out, int &err)
{
	// Donors that were tried (or are excluded) are not chosen again; free counts are always
	// a little stale, so a donor that turns out full sends us to the next one.
	uint16_t tried[kMaxServers];
	unsigned ntried = 0, got = 0;
	for (uint16_t e : exclude)
		tried[ntried++] = e;
	err = ENOSPC;
	bool waited = false;
	while (got < want && ntried < servers()) {
		if (ntried > exclude.size() && request_out_of_time()) {
			err = EIO; // (another donor to ask, but the request is out of time)
			break;
		}
		uint16_t chosen[kMaxReplicas];
		const uint64_t seen = donors_epoch_.load();
		const unsigned n = place(want - got, std::span(tried, ntried), down_too, chosen);
		if (n == 0) {
			// No donor with room: membership (the hook) was asked for one; wait once for
			// its pass (a new member connected, or none to be had), then try again.
			if (!waited && need_donor_.load() && wait_for_donors(seen)) {
				waited = true;
				continue;
			}
			break;
		}
		for (unsigned k = 0; k < n; k++) {
			const uint16_t i = chosen[k];
			tried[ntried++] = i;
			SlabGrant g;
			const uint32_t gen = sstate_[i].gen.load();
			const int r = servers_[i]->alloc_tagged(slab, epoch, g);
			sstate_[i].placing.fetch_sub(1);
			if (r == 0) {
				out[got++] = Replica{i, gen, g, epoch};
				sstate_[i].used.fetch_add(1);
				// Nearly full (membership's reserve): time to find the next member.
				if (servers_[i]->slabs_free() <= servers_[i]->info().slabs_total / 8)
					need_donor();
			} else if (r != ENOSPC) {
				err = EIO;
				mark_down(i);
			} else {
				need_donor(); // a member is full: membership replaces it
			}
		}
	}
	return got;
}

int Volume::ensure_allocated(uint64_t first, uint64_t last)
{
	for (uint64_t slab = first; slab <= last; slab++) {
		Slab &s = slabs_[slab];
		auto state = [&] { // 1: has replicas, 0: empty, -1: lost, -2: lock timed out
			if (!s.mu.lock_shared_until(deadline()))
				return -2;
			const int st = s.nrep ? 1 : s.lost ? -1 : 0;
			s.mu.unlock_shared();
			return st;
		};
		int st = state();
		if (st == 1 || (st == -1 && backed(slab)))
			continue; // (held by the backup alone: the write goes there)
		if (st == -1)
			return EIO; // lost at reattach: a write must not make the rest read zeros
		// One allocation of this slab at a time; it may take a control call per donor.
		if (st == -2 || !lock_maint(s, std::min(Clock::now() + 2 * timeout_, deadline()))) {
			logger("volume")->error("slab {}: allocation timed out", slab);
			return EIO;
		}
		std::unique_lock maint(s.maint, std::adopt_lock);
		if ((st = state()) != 0) {
			if (st == 1 || (st == -1 && backed(slab)))
				continue;
			return EIO;
		}
		uint64_t epoch;
		{
			std::lock_guard lock(s.epoch_mu);
			epoch = s.epoch;
		}
		Replica reps[kMaxReplicas];
		int err = 0;
		const unsigned n = grant(slab, epoch, replicas_, {}, true, reps, err);
		if (n == 0 && backed(slab)) {
			// No donor has room or answers: the backup alone holds it until the repair
			// thread can copy it onto one.
			SlabGuard ex(s.mu, SlabGuard::Exclusive, deadline());
			if (!ex)
				return EIO;
			s.lost = true;
			ex.release();
			const int64_t now = now_ns();
			int64_t logged = backup_only_logged_.load();
			if (now - logged > 10'000'000'000 &&
			    backup_only_logged_.compare_exchange_strong(logged, now))
				logger("volume")->warn("cannot allocate slab {} on any memserver ({}): it "
						       "is kept in the backup file alone until one has "
						       "room",
						       slab, err_text(err));
			kick_repair();
			continue;
		}
		if (n == 0) {
			logger("volume")->error("cannot allocate slab {}: {}", slab, err_text(err));
			return err == ENOSPC ? ENOSPC : EIO;
		}
		SlabGuard ex(s.mu, SlabGuard::Exclusive, deadline());
		if (!ex) {
			for (unsigned k = 0; k < n; k++)
				release_replica(reps[k]);
			logger("volume")->error("slab {}: allocation timed out", slab);
			return EIO;
		}
		for (unsigned k = 0; k < n; k++)
			s.rep[k] = reps[k];
		s.nrep = uint8_t(n);
		ex.release();
		if (n < replicas_)
			kick_repair(); // degraded from birth: the repair thread adds the missing copies
	}
	return 0;
}

int Volume::give_back(uint64_t slab)
{
	Slab &s = slabs_[slab];
	// `maint` orders this against allocation, fencing and copies of the slab (a copy in
	// progress gives way); the exclusive section only waits for I/O in flight.
	if (!lock_maint(s, deadline())) {
		logger("volume")->warn("trim of slab {}: the slab stayed busy for the timeout", slab);
		return EIO;
	}
	std::unique_lock maint(s.maint, std::adopt_lock);
	Replica old[kMaxReplicas];
	unsigned nold = 0;
	uint64_t epoch = 0;
	{
		SlabGuard ex(s.mu, SlabGuard::Exclusive, deadline());
		if (!ex) {
			logger("volume")->warn("trim of slab {}: I/O in flight did not end in time", slab);
			return EIO;
		}
		nold = s.nrep;
		for (unsigned i = 0; i < nold; i++)
			old[i] = s.rep[i];
		s.nrep = 0;
		s.lost = false; // trimmed whole: reads zeros from now on
		if (tagged_ && nold) {
			std::lock_guard lock(s.epoch_mu);
			// Replicas written from now on get a higher epoch than the ones given back.
			epoch = ++s.epoch;
		}
	}
	// The backup reads zeros there from now on (or, if that cannot be queued, no longer
	// backs the slab: it would hold stale bytes once the slab is written again).
	if (backup_) {
		const uint64_t off = slab * slab_size_;
		if (backup_->punch(off, std::min(slab_size_, size_ - off), deadline()) != 0)
			backup_->distrust(slab);
	}
	bool confirmed = true;
	for (unsigned i = 0; i < nold; i++)
		confirmed = release_replica(old[i]) && confirmed;
	if (tagged_ && nold && !confirmed) {
		// A donor may still hold a replica with our tag: a restart must not bring its bytes
		// back. The floor makes the chunk read EIO after a restart if nothing newer exists.
		// (Under `maint`: floors of one chunk are recorded in order.)
		record_floor(slab, epoch, {});
	}
	// The content is discarded either way; a slab a server kept is reclaimed when our
	// session ends (or by reconciliation after an unknown outcome).
	return 0;
}

bool Volume::release_replica(const Replica &r)
{
	sstate_[r.server].used.fetch_sub(1);
	Server &srv = *servers_[r.server];
	if (!srv.session_alive())
		return true; // gone with its session
	if (!valid(r) || is_down(r.server)) { // its donor failed and may hang: do not wait on it
		srv.forget_slab(r.grant.id);
		return false;
	}
	if (int err = srv.free_slab(r.grant.id)) {
		logger("volume")->warn("memserver {} did not take back slab {}: {}", srv.name(),
				       r.grant.id, err_text(err));
		mark_down(r.server);
		return false;
	}
	return true;
}

} // namespace rdmaswap
