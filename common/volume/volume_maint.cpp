// SPDX-License-Identifier: MIT
// Volume: maintenance on the repair thread: restoring the replica count (repair), moving
// slabs their donor wants back (give-back), and the clone routine both use. A copy runs while
// the slab keeps serving; writes landing meanwhile are tracked and copied again, and the
// switch-over is a short exclusive section.
#include "common/volume/volume.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "common/obs/log.h"
#include "common/util/err_text.h"
#include "common/volume/volume_internal.h"

namespace rdmaswap {

void Volume::CloneJob::mark(uint64_t off, uint64_t len)
{
	for (uint64_t b = off / block; b <= (off + len - 1) / block; b++)
		dirty[b / 64].fetch_or(uint64_t(1) << (b % 64));
}

bool Volume::CloneJob::take(uint64_t b)
{
	const uint64_t bit = uint64_t(1) << (b % 64);
	return dirty[b / 64].fetch_and(~bit) & bit;
}

uint64_t Volume::CloneJob::count() const
{
	uint64_t n = 0;
	for (uint64_t w = 0; w < (nblocks + 63) / 64; w++)
		n += uint64_t(std::popcount(dirty[w].load()));
	return n;
}

bool Volume::copy_dirty(Slab &s, const Replica &src, const Replica &dst, Channel &ch,
			std::atomic<uint64_t> &bytes, bool may_yield)
{
	// Two windows (CloneJob::window blocks each): the source fills one while the destination
	// takes the other, each with every request of its window in flight. A block's dirty bit
	// is cleared before the block is read, so a write that lands after that read marks it
	// again (writers mark after their write completed).
	const uint64_t bs = clone_job_.block;
	const unsigned per = clone_job_.window;
	std::byte *buf[2] = {ch.buf, ch.buf + bs * per};
	uint64_t blocks[2][kMaxBatch];
	unsigned nb[2] = {0, 0};
	// From the backup file (a slab no replica holds any more) or from a replica.
	DataPath *from = src.server == kBackupSource ? nullptr : ch.paths[src.server].get();
	DataPath &to = *ch.paths[dst.server];
	const uint64_t slab = uint64_t(&s - slabs_.get());
	uint64_t next = 0;
	unsigned cur = 0;
	for (;;) {
		// Read the next window (if any) into buf[cur] while writing the previous one.
		nb[cur] = 0;
		while (next < clone_job_.nblocks && nb[cur] < per) {
			if (clone_job_.take(next))
				blocks[cur][nb[cur]++] = next;
			next++;
		}
		const unsigned prev = cur ^ 1;
		// Reads first (small requests: the source starts sending at once), then the writes
		// (over TCP, their payloads go out while the source's answers come in).
		bool wrote_ok = true, read_ok = true;
		for (unsigned i = 0; i < nb[cur]; i++)
			read_ok = (from ? from->post_read(src.grant, blocks[cur][i] * bs, uint32_t(bs),
							  buf[cur] + i * bs)
					: backup_->read(buf[cur] + i * bs, uint32_t(bs),
							slab * slab_size_ + blocks[cur][i] * bs,
							deadline())) == 0 &&
				  read_ok;
		for (unsigned i = 0; i < nb[prev]; i++)
			wrote_ok = to.post_write(dst.grant, blocks[prev][i] * bs, uint32_t(bs),
						 buf[prev] + i * bs) == 0 && wrote_ok;
		// complete() always runs for a path that was posted to: it ends the batch.
		read_ok = (nb[cur] == 0 || !from || from->complete() == 0) && read_ok;
		wrote_ok = (nb[prev] == 0 || to.complete() == 0) && wrote_ok;
		if (!wrote_ok || !read_ok) {
			if (!wrote_ok || from)
				mark_down(!wrote_ok ? dst.server : src.server);
			return false; // the copy is abandoned (and started over later)
		}
		bytes.fetch_add(nb[prev] * bs);
		nb[prev] = 0;
		if (nb[cur] == 0 && next >= clone_job_.nblocks)
			return true;
		if (may_yield && (s.yield.load() || stop_.load()))
			return false; // I/O waits for `maint`: give way (the copy starts over later)
		cur = prev;
	}
}

bool Volume::clone(uint64_t slab, const Replica src, const Replica dst, int replace, Channel &ch,
		   std::atomic<uint64_t> &bytes)
{
	Slab &s = slabs_[slab];
	// Never called with the slab lock held (giving the copy back is a control call).
	auto abort = [&](const char *why) {
		s.clone.store(nullptr);
		release_replica(dst);
		clone_aborts_.fetch_add(1);
		logger("volume")->debug("slab {}: copy to {} abandoned: {}", slab,
					servers_[dst.server]->name(), why);
		return false;
	};
	// Every block is dirty to begin with; from now on writes mark what they change.
	for (uint64_t w = 0; w < (clone_job_.nblocks + 63) / 64; w++)
		clone_job_.dirty[w].store(w + 1 < (clone_job_.nblocks + 63) / 64 || clone_job_.nblocks % 64 == 0
						  ? ~uint64_t(0)
						  : (uint64_t(1) << (clone_job_.nblocks % 64)) - 1);
	s.clone.store(&clone_job_);
	for (unsigned pass = 0;; pass++) {
		if (!copy_dirty(s, src, dst, ch, bytes, true))
			return abort("a transfer failed, or I/O needed the slab");
		if (clone_job_.count() <= kSwitchDirtyBlocks || pass + 1 >= kMaxCopyPasses)
			break;
	}
	for (unsigned attempt = 0;; attempt++) {
		uint64_t epoch = 0;
		if (tagged_) {
			// The copy's tag (epoch 0 until now: a restart never trusts a half copy). A
			// control call: made before the switch, and made again if a degraded write
			// raised the epoch meanwhile.
			{
				std::lock_guard lock(s.epoch_mu);
				epoch = s.epoch;
			}
			if (servers_[dst.server]->set_tag(dst.grant.id, slab, epoch) != 0) {
				mark_down(dst.server);
				return abort("tagging the copy failed");
			}
		}
		SlabGuard ex(s.mu, SlabGuard::Exclusive, deadline());
		if (!ex)
			return abort("the slab stayed busy for the timeout");
		const auto t0 = Clock::now();
		// Writers are out now. Blocks written since their copy are copied again: outside
		// the exclusive section while that still shrinks them, and here only when they are
		// at most kSwitchDirtyBlocks. Writes that keep dirtying more than that through
		// every pass make the copy give up (it starts over later): the exclusive section
		// never copies more than a few blocks, whatever the load.
		if (const uint64_t dirty = clone_job_.count(); dirty > 0) {
			if (attempt + 1 < kSwitchTries || dirty > kSwitchDirtyBlocks) {
				ex.release();
				if (attempt + 1 >= kSwitchTries + kMaxCopyPasses)
					return abort("writes kept dirtying more of the slab than a "
						     "switch-over may copy");
				if (!copy_dirty(s, src, dst, ch, bytes, true))
					return abort("a transfer failed, or I/O needed the slab");
				continue;
			}
			// The one network wait under the exclusive lock: at most kSwitchDirtyBlocks
			// blocks (one window), bounded by the timeout (docs/architecture.md).
			for (uint64_t m = switch_blocks_max_.load();
			     dirty > m && !switch_blocks_max_.compare_exchange_weak(m, dirty);)
				;
			if (!copy_dirty(s, src, dst, ch, bytes, false)) {
				ex.release();
				return abort("a transfer failed");
			}
		}
		const bool src_ok = src.server == kBackupSource ? backed(slab) : valid(src);
		if (!src_ok || sstate_[dst.server].gen.load() != dst.gen) {
			ex.release();
			return abort("the source or the destination failed during the copy");
		}
		bool retag;
		{
			std::lock_guard lock(s.epoch_mu);
			retag = tagged_ && s.epoch != epoch;
			if (!retag) {
				Replica r = dst;
				r.epoch = epoch;
				if (replace >= 0)
					s.rep[replace] = r;
				else
					s.rep[s.nrep++] = r;
				s.lost = false; // (a slab the backup alone held has a replica again)
			}
		}
		if (retag) { // a degraded write raised the epoch: tag the copy with it first
			ex.release();
			if (attempt + 1 >= kSwitchTries + 2)
				return abort("the epoch kept changing");
			continue;
		}
		s.clone.store(nullptr);
		ex.release();
		const uint64_t ns = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
						     Clock::now() - t0)
						     .count());
		for (uint64_t m = switch_ns_max_.load(); ns > m && !switch_ns_max_.compare_exchange_weak(m, ns);)
			;
		return true;
	}
}

bool Volume::grant_copy(uint64_t slab, std::unique_lock<TimedMutex> &maint, Replica &dst)
{
	const Slab &s = slabs_[slab];
	// What the copy was decided on: rep[] (fixed while `maint` is held) and which replicas
	// are valid (that may change at any time).
	struct Seen {
		uint8_t nrep = 0;
		bool lost = false;
		std::array<uint16_t, kMaxReplicas> server{};
		std::array<uint32_t, kMaxReplicas> id{};
		std::array<bool, kMaxReplicas> valid{};
		bool operator==(const Seen &) const = default;
	};
	const auto seen = [&] {
		Seen v;
		v.nrep = s.nrep;
		v.lost = s.lost;
		for (unsigned i = 0; i < s.nrep; i++) {
			v.server[i] = s.rep[i].server;
			v.id[i] = s.rep[i].grant.id;
			v.valid[i] = valid(s.rep[i]);
		}
		return v;
	};
	const Seen before = seen();
	maint.unlock();
	int err = 0;
	// Epoch 0 until the copy is complete: a restart never trusts a half copy. Never on a
	// donor on cooldown (it failed a moment ago and may hang).
	const bool got =
		grant(slab, 0, 1, std::span(before.server.data(), before.nrep), false, &dst, err) == 1;
	if (!got)
		return false;
	if (maint.try_lock_for(timeout_) && seen() == before)
		return true;
	release_replica(dst); // changed meanwhile (a trim, an invalidation): next pass
	return false;
}

bool Volume::migrate(uint64_t slab, uint16_t server, uint32_t id, Channel &ch)
{
	Slab &s = slabs_[slab];
	std::unique_lock maint(s.maint, std::defer_lock);
	if (!maint.try_lock_for(std::chrono::milliseconds(100)))
		return false; // busy (a trim or an allocation): at the next pass
	// rep[] changes only under `maint`: read it without the slab lock.
	int k = -1;
	for (unsigned i = 0; i < s.nrep; i++)
		if (s.rep[i].server == server && s.rep[i].grant.id == id)
			k = int(i);
	if (k < 0)
		return true; // trimmed or repaired meanwhile: nothing of ours to move
	// The source: a valid replica on another donor if there is one, else the wanted
	// replica itself (replicas=1: it is still valid and still served).
	int src = -1;
	for (unsigned i = 0; i < s.nrep; i++)
		if (valid(s.rep[i]) && (src < 0 || int(i) != k))
			src = int(i);
	if (src < 0)
		return false; // lost: keep the replica so that reads fail with EIO
	if (!valid(s.rep[k])) {
		// A stale copy: the repair drops it (raising the epoch of the good ones first
		// when the volume is bound) and restores the count; nothing to move.
		kick_repair();
		return true;
	}
	// Not onto a donor holding a copy (the one asking among them).
	Replica dst;
	if (!grant_copy(slab, maint, dst))
		return false; // no other donor has room (or the slab changed): it stays where it is
	const Replica old = s.rep[k];
	const int64_t t0 = now_ns();
	const bool ok = clone(slab, s.rep[src], dst, k, ch, migrate_bytes_);
	migrate_ns_.fetch_add(uint64_t(now_ns() - t0));
	if (!ok)
		return false; // try again at the next pass
	// Switched over: only now give the old slab back (the donor then withdraws it).
	release_replica(old);
	migrated_.fetch_add(1);
	return true;
}

uint64_t Volume::migrate_wanted(Channel &ch)
{
	uint64_t stuck = 0;
	std::vector<uint32_t> ids; // control path: allocating is fine
	const size_t nserv = servers();
	for (size_t i = 0; i < nserv; i++) {
		{
			// The poller's latest list (slabs moved since are simply not found below).
			std::lock_guard lock(wanted_mu_);
			ids = wanted_[i];
		}
		if (ids.empty() || !servers_[i]->session_alive())
			continue;
		std::sort(ids.begin(), ids.end());
		const uint64_t moved_before = migrated_.load();
		const uint64_t bytes_before = migrate_bytes_.load();
		const auto started = std::chrono::steady_clock::now();
		for (uint64_t slab = 0; slab < nslabs_; slab++) {
			uint32_t id = 0;
			bool hit = false;
			{
				const Slab &s = slabs_[slab];
				s.mu.lock_shared(); // holders never wait on the network exclusively
				for (unsigned k = 0; k < s.nrep && !hit; k++) {
					const Replica &r = s.rep[k];
					if (r.server == i &&
					    std::binary_search(ids.begin(), ids.end(), r.grant.id)) {
						id = r.grant.id;
						hit = true;
					}
				}
				s.mu.unlock_shared();
			}
			if (!hit)
				continue;
			if (!migrate(slab, uint16_t(i), id, ch))
				stuck++;
			if (stop_.load())
				return stuck;
		}
		if (const uint64_t n = migrated_.load() - moved_before) {
			const double secs = std::chrono::duration<double>(
						    std::chrono::steady_clock::now() - started)
						    .count();
			const double mib = double(migrate_bytes_.load() - bytes_before) / (1 << 20);
			logger("volume")->info("give-back: moved {} slabs ({:.0f} MiB) off memserver "
					       "{} in {:.2f} s ({:.0f} MiB/s); {} moved so far",
					       n, mib, servers_[i]->name(), secs,
					       secs > 0 ? mib / secs : 0.0, migrated_.load());
		}
	}
	return stuck;
}

void Volume::poll_loop()
{
	// One list per server, kept across polls: its capacity (the server's slab count) is
	// allocated at the server's first poll, which runs at once (or as soon as the server is
	// added), before it holds any slab of ours. Later polls reuse it, and an empty answer
	// (no give-back under way) is copied out without allocating.
	// Only donors holding slabs of ours have anything to give back: they are asked (WANTED)
	// every pass, the others only once (that first poll sizes the list). Every donor's
	// free-slab hint, which placement reads, is refreshed on the same connection
	// (Server::refresh_hint: every few seconds); a donor that does not answer that is hung
	// or gone, as one that does not answer WANTED.
	std::vector<std::vector<uint32_t>> polled(max_servers_);
	std::vector<char> sized(max_servers_, 0); // polled[i] had its first WANTED answer
	for (bool first = true;; first = false) {
		if (!first) {
			std::unique_lock lock(repair_mu_);
			repair_cv_.wait_for(lock, repair_interval_, [this] { return stop_.load(); });
			if (stop_.load())
				return;
		}
		bool any = false;
		const int64_t now = now_ns();
		const size_t nserv = servers();
		for (size_t i = 0; i < nserv; i++) {
			if (now < sstate_[i].down_until.load() || !servers_[i]->session_alive())
				continue;
			const bool holder = sstate_[i].used.load() || sstate_[i].placing.load();
			std::vector<uint32_t> &ids = polled[i];
			const bool ask = holder || !sized[i];
			int err = ask ? servers_[i]->wanted_slabs(ids) : 0;
			sized[i] = sized[i] || (ask && !err);
			if (!err) {
				const int hint = servers_[i]->refresh_hint();
				err = ask ? 0 : hint; // a WANTED answer stands
			}
			if (err) {
				// Hung or gone: do not wait on it again for a while.
				logger("volume")->warn("give-back: polling memserver {} ({}) failed: {}",
						       servers_[i]->name(),
						       ask ? "which slabs it wants back" : "its free slabs",
						       err_text(err));
				mark_down(uint16_t(i));
				continue;
			}
			any = any || !ids.empty();
			std::lock_guard lock(wanted_mu_);
			wanted_[i].assign(ids.begin(), ids.end());
		}
		if (any)
			kick_repair();
	}
}

bool Volume::repair(uint64_t slab, Channel &ch)
{
	Slab &s = slabs_[slab];
	std::unique_lock maint(s.maint, std::defer_lock);
	if (!maint.try_lock_for(std::chrono::milliseconds(100)))
		return false; // busy: at the next pass
	if (s.nrep == 0 && !(s.lost && backed(slab)))
		return false;
	if (tagged_) {
		// Invalid replicas leave the set below, but their donors may still hold them (a
		// hung donor): the good ones get a higher epoch first, so that a restart never
		// takes a dropped replica for a current one. (A donor failing it is invalidated.)
		// With none good, the backup's copy is the current one: a floor above them all.
		const unsigned good = valid_count(s);
		if ((good && good < s.nrep) || (!good && s.nrep && backed(slab)))
			fence_slow(slab);
	}
	Replica good[kMaxReplicas], drop[kMaxReplicas];
	unsigned ngood = 0, ndrop = 0;
	{
		SlabGuard ex(s.mu, SlabGuard::Exclusive, deadline());
		if (!ex)
			return false;
		for (unsigned i = 0; i < s.nrep; i++)
			(valid(s.rep[i]) ? good[ngood++] : drop[ndrop++]) = s.rep[i];
		if (ngood == 0 && !backed(slab))
			return false; // lost: keep the invalid replicas so reads fail with EIO
		for (unsigned i = 0; i < ngood; i++)
			s.rep[i] = good[i];
		s.nrep = uint8_t(ngood);
		if (ngood == 0)
			s.lost = true; // held by the backup alone until copied below
	}
	for (unsigned i = 0; i < ndrop; i++)
		release_replica(drop[i]);
	bool changed = ndrop > 0;
	// Place the missing copies away from the donors that hold a good one, and copy them
	// from a good replica (or the backup, when none is left) while the slab keeps serving.
	while (s.nrep < replicas_ && !stop_.load()) {
		Replica dst;
		if (!grant_copy(slab, maint, dst))
			break; // (and leave the slab alone: `maint` may be gone)
		Replica src;
		if (s.nrep)
			src = s.rep[0];
		else
			src.server = kBackupSource;
		if (!clone(slab, src, dst, -1, ch, repair_bytes_))
			break; // source or destination failed, or I/O needed the slab: next pass
		repaired_.fetch_add(1);
		changed = true;
	}
	return changed;
}

void Volume::guard_failed(const char *what, const char *why, bool again) noexcept
{
	try {
		if (again)
			logger("volume")->debug("the {} thread failed again: {}", what, why);
		else
			logger("volume")->error("the {} thread failed: {}; it starts again (a bug: "
						"please report it)",
						what, why);
	} catch (...) { // (logging itself failed: nothing more to do)
	}
}

void Volume::repair_loop()
{
	auto log = logger("volume");
	Channel &ch = *maint_ch_; // this thread's alone
	uint64_t last_logged = 0;
	for (;;) {
		{
			std::unique_lock lock(repair_mu_);
			repair_cv_.wait_for(lock, repair_interval_,
					    [this] { return stop_.load() || repair_kick_; });
			if (stop_.load())
				return;
			repair_kick_ = false;
		}
		// Give back slabs forgotten on donors that failed, once they answer again.
		for (size_t i = 0, n = servers(); i < n; i++) {
			if (sstate_[i].closed.load()) // (closing a closed path does nothing)
				ch.paths[i]->close_for_good();
			else if (!is_down(uint16_t(i)))
				servers_[i]->housekeeping();
		}
		// Give-back: move the slabs donors want back, before anything else.
		const uint64_t stuck = migrate_wanted(ch);
		if (stuck > migrate_pending_.load())
			log->warn("give-back: {} slabs wanted back by their memserver cannot move (no "
				  "other memserver has room, or no valid copy to move); they stay where "
				  "they are and are moved when they can be",
				  stuck);
		migrate_pending_.store(stuck);
		if (replicas_ < 2 && !backup_)
			continue;
		for (uint64_t i = 0; i < nslabs_ && !stop_.load(); i++) {
			{
				const Slab &s = slabs_[i];
				s.mu.lock_shared(); // holders never wait on the network exclusively
				// (With replicas=1, only the backup can restore a slab.)
				const bool healthy =
					s.nrep == 0 ? !(s.lost && backed(i))
						    : (valid_count(s) >= replicas_ && valid_count(s) == s.nrep) ||
							      (valid_count(s) == 0 && !backed(i));
				s.mu.unlock_shared();
				if (healthy)
					continue;
			}
			repair(i, ch);
		}
		const uint64_t done = repaired_.load();
		if (done != last_logged) {
			const VolumeStats st = stats();
			log->info("repair: {} replicas re-created so far ({} bytes copied); {} slabs "
				  "degraded, {} lost",
				  done, st.repair_bytes, st.degraded, st.lost);
			last_logged = done;
		}
	}
}

} // namespace rdmaswap
