// SPDX-License-Identifier: MIT
// Volume: the I/O path (reads with failover, writes to every valid replica, trim, zero).
// Nothing here allocates; every wait ends at the timeout.
#include "common/volume/volume.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/obs/log.h"
#include "common/util/err_text.h"
#include "common/volume/volume_internal.h"

namespace rdmaswap {

static_assert(ChunkDonors::kCapacity >= kMaxPieces * Volume::kMaxReplicas);

namespace {
// The bound of the request this thread serves (Volume::RequestScope; max: none).
thread_local std::chrono::steady_clock::time_point t_request_until =
	std::chrono::steady_clock::time_point::max();
} // namespace

class Volume::RequestScope {
public:
	explicit RequestScope(const Volume &v) : prev_(t_request_until)
	{
		if (prev_ == Clock::time_point::max()) // (zero() calls trim(): one request)
			t_request_until = Clock::now() + kRequestWaits * v.timeout_;
	}
	~RequestScope() { t_request_until = prev_; }
	RequestScope(const RequestScope &) = delete;
	RequestScope &operator=(const RequestScope &) = delete;

private:
	const Clock::time_point prev_;
};

Volume::Clock::time_point Volume::request_deadline()
{
	return t_request_until;
}

Volume::Clock::time_point Volume::deadline() const
{
	return std::min(Clock::now() + (kMaxReplicas + 2) * timeout_, t_request_until);
}

namespace {
// Unlocks the first `n` slabs of `pieces` that were locked shared.
template <typename Slabs, typename Pieces>
void unlock_pieces(Slabs &slabs, const Pieces *pieces, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		slabs[pieces[i].slab].mu.unlock_shared();
}
} // namespace

// The shared I/O paths of one chunk's round (at most one per replica of each piece), one per
// donor: any of the donor's paths that is free, starting from the channel's usual one (index
// % its paths), else the first one to come free (DonorPaths::take). Waits happen in ascending
// donor order, with at most one path per donor held, so two threads wanting paths of the
// same donors never wait for each other in a cycle. Holders of a path are inside one bounded
// batch (post, complete; or the reconnect a post makes), which ends within the timeout: then
// it either succeeded, or the donor failed and (if another replica can serve) was
// invalidated, and the waiters that get a path next see that and skip it. So a waiter waits
// until the operation's deadline, not one timeout: giving up earlier would fail requests
// whose only replica left is on a donor whose paths another thread is just re-establishing
// (the VM fault soak: a donor killed while the other holder's paths reconnected after a
// partition). Given back together, at the latest when destroyed.
class Volume::HeldPaths {
public:
	HeldPaths(const Volume &v, const Channel &ch) : v_(v), ch_(ch) {}
	~HeldPaths() { release(); }
	HeldPaths(const HeldPaths &) = delete;
	HeldPaths &operator=(const HeldPaths &) = delete;

	// Add `server` (once), not locked yet.
	void want(uint16_t server)
	{
		for (unsigned k = 0; k < n_; k++)
			if (ids_[k] == server)
				return;
		ids_[n_] = server;
		held_[n_++] = nullptr;
	}
	bool empty() const { return n_ == 0; }
	// Lock a path of every donor wanted, in ascending donor order, each by `until` (the
	// operation's deadline). True if all were had; a donor whose paths stayed busy that long
	// has none (locked() is false for it: the caller counts it as failed).
	bool lock(Clock::time_point until)
	{
		std::sort(ids_, ids_ + n_); // (nothing is held yet)
		bool all = true;
		for (unsigned k = 0; k < n_; k++) {
			DonorPaths &d = *v_.io_paths_[ids_[k]];
			held_[k] = d.take(ch_.index % d.n, until);
			all = all && held_[k];
		}
		return all;
	}
	bool locked(uint16_t server) const { return find(server) != nullptr; }
	// The path held for `server` (locked(server) must be true).
	DataPath &path(uint16_t server) const { return *find(server)->dp; }
	void release()
	{
		for (unsigned k = 0; k < n_; k++)
			if (held_[k])
				v_.io_paths_[ids_[k]]->give(*held_[k]);
		n_ = 0;
	}

private:
	SharedPath *find(uint16_t server) const
	{
		for (unsigned k = 0; k < n_; k++)
			if (ids_[k] == server)
				return held_[k];
		return nullptr;
	}

	const Volume &v_;
	const Channel &ch_;
	uint16_t ids_[ChunkDonors::kCapacity];
	SharedPath *held_[ChunkDonors::kCapacity];
	unsigned n_ = 0;
};

Volume::SharedPath *Volume::DonorPaths::take(unsigned usual, Clock::time_point until)
{
	// A free path that is ready (DataPath::ready: connected, or may reconnect now). A free
	// one that is not is taken only when no path of the donor is ready, free or busy (the
	// donor is down: it fails, or reconnects, at once): while another is ready, waiting for
	// it beats failing a request that a healthy connection of the donor could serve.
	auto any = [&]() -> SharedPath * {
		SharedPath *unready = nullptr;
		bool ready_busy = false;
		for (unsigned j = 0; j < n; j++) {
			SharedPath &p = path[(usual + j) % n];
			if (!p.mu.try_lock()) {
				ready_busy = ready_busy || p.dp->ready();
				continue;
			}
			if (p.dp->ready()) {
				if (unready)
					unready->mu.unlock();
				return &p;
			}
			if (unready)
				p.mu.unlock();
			else
				unready = &p;
		}
		if (unready && ready_busy) {
			unready->mu.unlock();
			unready = nullptr;
		}
		return unready;
	};
	if (SharedPath *p = any())
		return p;
	// All busy: count ourselves as a waiter *before* looking again, under `m`. A give()
	// unlocks its path before it reads `waiters` (both ordered by the path's own mutex), so
	// either we see its path free, or it sees us and hands us a path (it takes `m` to do
	// so, which it cannot while we look and queue).
	Waiter w;
	std::unique_lock l(m);
	waiters.fetch_add(1);
	if (SharedPath *p = any()) {
		waiters.fetch_sub(1);
		return p;
	}
	(tail ? tail->next : head) = &w;
	tail = &w;
	while (!w.got && w.cv.wait_until(l, until) == std::cv_status::no_timeout) {
	}
	if (!w.got) { // out of time, still queued: leave the queue
		Waiter **at = &head;
		Waiter *prev = nullptr;
		while (*at != &w) {
			prev = *at;
			at = &(*at)->next;
		}
		*at = w.next;
		if (tail == &w)
			tail = prev;
	}
	waiters.fetch_sub(1);
	return w.got;
}

void Volume::DonorPaths::give(SharedPath &p)
{
	p.mu.unlock();
	if (waiters.load() == 0)
		return;
	std::lock_guard l(m);
	// Lock it again for the first waiter (unless a newcomer took it in between: then that
	// one gives it back later, and hands it over then).
	if (!head || !p.mu.try_lock())
		return;
	Waiter *w = head;
	head = w->next;
	if (!head)
		tail = nullptr;
	w->got = &p;
	w->cv.notify_one();
}

int Volume::read_chunk(Channel &ch, uint64_t at, uint32_t len)
{
	Piece pieces[kMaxPieces];
	const unsigned n = split(at, len, pieces);
	const auto until = deadline();
	for (unsigned i = 0; i < n; i++)
		if (!slabs_[pieces[i].slab].mu.lock_shared_until(until)) {
			unlock_pieces(slabs_, pieces, i);
			lock_timeouts_.fetch_add(1, std::memory_order_relaxed);
			logger("volume")->debug("read at {}: slab {} not free within the timeout", at,
						pieces[i].slab);
			return EIO;
		}
	uint8_t tried[kMaxPieces] = {};   // replica indices tried, per piece
	int8_t posted[kMaxPieces];        // replica posted this round, -1 if none
	bool done[kMaxPieces] = {};
	int err = 0;
	for (unsigned round = 0; round <= kMaxReplicas && !err; round++) {
		if (round && request_out_of_time())
			break; // (what is not done yet fails: the request is out of time)
		ChunkDonors used;
		HeldPaths held(*this, ch);
		std::fill(posted, posted + n, int8_t(-1)); // every piece, even after a break
		for (unsigned i = 0; i < n && !err; i++) {
			if (done[i])
				continue;
			const Piece &p = pieces[i];
			const Slab &s = slabs_[p.slab];
			// No replica to read: the backup's copy, if it has one (else EIO).
			auto from_backup = [&] {
				if (!backed(p.slab) ||
				    backup_->read(ch.buf + p.pos, p.len, p.slab * slab_size_ + p.off,
						  until) != 0)
					return false;
				done[i] = true;
				return true;
			};
			if (s.nrep == 0 && s.lost) { // lost at reattach, or held by the backup alone
				if (!from_backup())
					err = EIO;
				continue;
			}
			if (s.nrep == 0) { // never written: zeros, no round trip
				std::memset(ch.buf + p.pos, 0, p.len);
				done[i] = true;
				continue;
			}
			int r = -1;
			for (unsigned k = 0; k < s.nrep && r < 0; k++)
				if (!(tried[i] & (1u << k)) && valid(s.rep[k]))
					r = int(k);
			if (r < 0) {
				if (!from_backup())
					err = EIO; // no valid replica left to read from
				continue;
			}
			tried[i] |= uint8_t(1u << r);
			posted[i] = int8_t(r);
			held.want(s.rep[r].server);
		}
		if (held.empty())
			break;
		// The paths, then the posts. A donor whose path was not had by the deadline counts
		// as failed (the request is out of time anyway).
		if (!held.lock(until))
			lock_timeouts_.fetch_add(1, std::memory_order_relaxed);
		for (unsigned i = 0; i < n; i++) {
			if (posted[i] < 0)
				continue;
			const Piece &p = pieces[i];
			const Replica &rep = slabs_[p.slab].rep[posted[i]];
			if (!valid(rep)) { // invalidated while we waited: another replica next round
				posted[i] = -1;
				continue;
			}
			used.add(rep.server,
				 !held.locked(rep.server) ||
					 held.path(rep.server).post_read(rep.grant, p.off, p.len,
									 ch.buf + p.pos) != 0);
		}
		for (unsigned k = 0; k < used.size(); k++)
			if (held.locked(used.id(k)) && held.path(used.id(k)).complete() != 0)
				used.set_failed(k);
		for (unsigned i = 0; i < n; i++) {
			if (posted[i] < 0)
				continue;
			const Slab &s = slabs_[pieces[i].slab];
			const uint16_t srv = s.rep[posted[i]].server;
			if (!used.failed(srv)) {
				done[i] = true;
				continue;
			}
			// Another valid replica (or the backup) can serve it: stop using this donor.
			bool other = backed(pieces[i].slab);
			for (unsigned k = 0; k < s.nrep && !other; k++)
				other = s.rep[k].server != srv && valid(s.rep[k]);
			if (other && sstate_[srv].gen.load() == s.rep[posted[i]].gen)
				invalidate(srv);
		}
		// Only now: a thread waiting for one of these paths sees the donors given up on.
		held.release();
	}
	for (unsigned i = 0; i < n; i++)
		if (!done[i])
			err = EIO;
	unlock_pieces(slabs_, pieces, n);
	if (err)
		logger("volume")->debug("read of {} bytes at {} failed", len, at);
	return err;
}

int Volume::write_chunk(Channel &ch, uint64_t at, uint32_t len, uint64_t *fence,
			unsigned &nfence)
{
	nfence = 0;
	Piece pieces[kMaxPieces];
	const unsigned n = split(at, len, pieces);
	const auto until = deadline();
	for (unsigned i = 0; i < n; i++) {
		Slab &s = slabs_[pieces[i].slab];
		if (!s.mu.lock_shared_until(until)) {
			unlock_pieces(slabs_, pieces, i);
			lock_timeouts_.fetch_add(1, std::memory_order_relaxed);
			logger("volume")->debug("write at {}: slab {} not free within the timeout", at,
						pieces[i].slab);
			return EIO;
		}
		if (s.nrep == 0 && s.lost && backed(pieces[i].slab))
			continue; // held by the backup alone: the write went there (write_range)
		if (s.nrep == 0) { // trimmed since it was allocated (or lost at reattach)
			const bool lost = s.lost;
			unlock_pieces(slabs_, pieces, i + 1);
			return lost ? EIO : EAGAIN;
		}
	}
	uint8_t posted[kMaxPieces] = {}; // replica indices written, per piece
	HeldPaths held(*this, ch);
	for (unsigned i = 0; i < n; i++) {
		const Slab &s = slabs_[pieces[i].slab];
		for (unsigned k = 0; k < s.nrep; k++)
			if (valid(s.rep[k])) {
				posted[i] |= uint8_t(1u << k);
				held.want(s.rep[k].server);
			}
	}
	// The paths, then the posts. A donor whose path was not had by the deadline counts as
	// failed (the request is out of time anyway). A replica invalidated while we waited is
	// skipped (it is never read again).
	if (!held.lock(until))
		lock_timeouts_.fetch_add(1, std::memory_order_relaxed);
	ChunkDonors used;
	for (unsigned i = 0; i < n; i++) {
		const Piece &p = pieces[i];
		const Slab &s = slabs_[p.slab];
		for (unsigned k = 0; k < s.nrep; k++) {
			const Replica &rep = s.rep[k];
			if (!(posted[i] & (1u << k)))
				continue;
			if (!valid(rep)) {
				posted[i] &= uint8_t(~(1u << k));
				continue;
			}
			used.add(rep.server,
				 !held.locked(rep.server) ||
					 held.path(rep.server).post_write(rep.grant, p.off, p.len,
									  ch.buf + p.pos) != 0);
		}
	}
	for (unsigned k = 0; k < used.size(); k++)
		if (held.locked(used.id(k)) && held.path(used.id(k)).complete() != 0)
			used.set_failed(k);
	const bool any_failed = used.any_failed();
	// A copy of the slab in progress copies these blocks again (after our write completed,
	// so that it reads what we wrote; see CloneJob).
	for (unsigned i = 0; i < n; i++)
		if (CloneJob *job = slabs_[pieces[i].slab].clone.load())
			job->mark(pieces[i].off, pieces[i].len);
	// A replica that failed a write another replica (or the backup) took now differs from
	// it: invalidate its donor. (If every replica failed and there is no backup, the range
	// is simply unspecified, as after any failed write, and the request fails.)
	for (unsigned i = 0; i < n && any_failed; i++) {
		const Slab &s = slabs_[pieces[i].slab];
		bool took = backed(pieces[i].slab);
		for (unsigned k = 0; k < s.nrep; k++)
			took = took || ((posted[i] & (1u << k)) && !used.failed(s.rep[k].server));
		if (!took)
			continue;
		for (unsigned k = 0; k < s.nrep; k++)
			if ((posted[i] & (1u << k)) && used.failed(s.rep[k].server) &&
			    sstate_[s.rep[k].server].gen.load() == s.rep[k].gen)
				invalidate(s.rep[k].server);
	}
	// Only now: a thread waiting for one of these paths sees the donors given up on.
	held.release();
	// Done only if some replica that took the write is still valid afterwards (a replica
	// invalidated meanwhile may have missed an earlier write).
	int err = 0;
	for (unsigned i = 0; i < n && !err; i++) {
		const Slab &s = slabs_[pieces[i].slab];
		uint8_t took = 0;
		unsigned ntook = 0;
		for (unsigned k = 0; k < s.nrep; k++)
			if ((posted[i] & (1u << k)) &&
			    !used.failed(s.rep[k].server) && valid(s.rep[k])) {
				took |= uint8_t(1u << k);
				ntook++;
			}
		if (ntook == 0) {
			// Taken by the backup alone (write_range put it there first), or lost.
			if (!backed(pieces[i].slab))
				err = EIO;
			else if (tagged_ && s.nrep && !fenced(s, 0))
				fence[nfence++] = pieces[i].slab; // its stale replicas: floor above them
		} else if (tagged_ && ntook < replicas_ && !fenced(s, took)) {
			// Degraded, and the epochs must be raised first: done by the caller with no
			// lock held (control calls).
			fence[nfence++] = pieces[i].slab;
		}
	}
	unlock_pieces(slabs_, pieces, n);
	if (err)
		logger("volume")->debug("write of {} bytes at {} failed: {}", len, at,
					err_text(err));
	return err;
}

int Volume::pread(void *buf, uint32_t count, uint64_t offset)
{
	const RequestScope request(*this);
	const int64_t start = now_ns();
	if (int r = check_range(count, offset))
		return count_error(VolumeOp::Read, r);
	int err = 0;
	{
		ChannelRef ch = channel();
		if (!ch)
			return count_error(VolumeOp::Read, EIO);
		ch->reads.add();
		auto *dst = static_cast<std::byte *>(buf);
		uint64_t done = 0;
		while (done < count && !err) {
			const uint64_t at = offset + done;
			const uint32_t len = chunk_len(at, count - done);
			if (done && request_out_of_time()) {
				logger("volume")->debug("read at {}: out of time after {} bytes", offset,
							done);
				err = EIO;
				break;
			}
			if ((err = read_chunk(*ch, at, len)))
				break;
			std::memcpy(dst + done, ch->buf, len);
			done += len;
		}
		if (!err)
			ch->read_bytes.add(count);
	}
	stripe().read_latency.record(uint64_t(now_ns() - start));
	return count_error(VolumeOp::Read, err);
}

int Volume::write_range(const std::byte *src, uint64_t count, uint64_t offset, bool allocate)
{
	if (count == 0)
		return 0;
	uint64_t done = 0;
	// A slab trimmed between its allocation and the write is allocated again, until the
	// deadline (a trim loop racing us), then the write fails.
	const auto until = deadline();
	bool counted = false; // a pwrite (src set) counts once, on the first channel it takes
	while (done < count) {
		const uint64_t at = offset + done;
		uint32_t len = chunk_len(at, count - done);
		if (done && request_out_of_time()) {
			logger("volume")->debug("write at {}: out of time after {} bytes", offset, done);
			return EIO;
		}
		if (!allocate) // one slab at a time: an empty one is skipped, not written
			len = uint32_t(std::min<uint64_t>(len, slab_size_ - at % slab_size_));
		else if (int err = ensure_allocated(at / slab_size_, (at + len - 1) / slab_size_))
			return err; // (before taking a channel: allocating makes control calls)
		uint64_t fence[kMaxPieces];
		unsigned nfence = 0;
		int r;
		{
			ChannelRef ch = channel();
			if (!ch)
				return EIO;
			if (src && !counted) {
				ch->writes.add();
				counted = true;
			}
			if (src)
				std::memcpy(ch->buf, src + done, len);
			else
				std::memset(ch->buf, 0, len);
			// The backup gets it first: by the time any replica has it, a read that finds
			// no valid replica and waits for the backup's queue finds it there.
			if (backup_ && backup_->put(ch->index, at, src ? ch->buf : nullptr, len,
						    Clock::now() + timeout_) != 0)
				r = EIO;
			else
				r = write_chunk(*ch, at, len, fence, nfence);
			if (src && r == 0)
				ch->write_bytes.add(len);
		}
		if (r == EAGAIN && !allocate) {
			r = 0; // zero(): an empty slab reads zeros already
		} else if (r == EAGAIN) {
			if (Clock::now() < until)
				continue;
			break;
		}
		if (r)
			return r;
		for (unsigned i = 0; i < nfence; i++) // degraded: fence before acknowledging
			if (int err = request_out_of_time() ? EIO : fence_write(fence[i]))
				return err;
		done += len;
	}
	if (done == count)
		return 0;
	logger("volume")->warn("write at {}: its slab was given back again and again while it was "
			       "being written; failing the write",
			       offset + done);
	return EIO;
}

int Volume::pwrite(const void *buf, uint32_t count, uint64_t offset)
{
	const RequestScope request(*this);
	const int64_t start = now_ns();
	if (int r = check_range(count, offset))
		return count_error(VolumeOp::Write, r);
	const int err = write_range(static_cast<const std::byte *>(buf), count, offset, true);
	stripe().write_latency.record(uint64_t(now_ns() - start));
	return count_error(VolumeOp::Write, err);
}

int Volume::trim(uint32_t count, uint64_t offset)
{
	const RequestScope request(*this);
	if (int r = check_range(count, offset))
		return count_error(VolumeOp::Trim, r);
	const uint64_t end = offset + count;
	// Whole slabs only; the volume's last slab counts as whole when the range reaches the end.
	const uint64_t first = (offset + slab_size_ - 1) / slab_size_;
	const uint64_t last = (end == size_) ? nslabs_ : end / slab_size_;
	int err = 0;
	for (uint64_t i = first; i < last; i++) {
		if (i > first && request_out_of_time())
			return count_error(VolumeOp::Trim, EIO);
		if (int r = give_back(i); r && !err)
			err = r;
	}
	return count_error(VolumeOp::Trim, err);
}

int Volume::zero(uint32_t count, uint64_t offset, bool fast_only)
{
	const RequestScope request(*this);
	if (int r = check_range(count, offset))
		return count_error(VolumeOp::Zero, r);
	if (count == 0)
		return 0;
	const uint64_t end = offset + count;
	const uint64_t first = (offset + slab_size_ - 1) / slab_size_;
	const uint64_t last = (end == size_) ? nslabs_ : end / slab_size_;
	// The partial head and tail (if any) need zeros written where their slab holds data.
	struct Range { uint64_t at, len; } partial[2];
	unsigned np = 0;
	if (first >= last) {
		partial[np++] = {offset, count};
	} else {
		if (offset < first * slab_size_)
			partial[np++] = {offset, first * slab_size_ - offset};
		if (last * slab_size_ < end)
			partial[np++] = {last * slab_size_, end - last * slab_size_};
	}
	auto has_data = [&](uint64_t slab) {
		const Slab &s = slabs_[slab];
		s.mu.lock_shared(); // holders never wait on the network exclusively
		const bool data = s.nrep != 0 || s.lost; // (lost: EIO, or held by the backup)
		s.mu.unlock_shared();
		return data;
	};
	auto needs_write = [&](const Range &r) {
		for (uint64_t s = r.at / slab_size_; s <= (r.at + r.len - 1) / slab_size_; s++)
			if (has_data(s))
				return true;
		return false;
	};
	if (fast_only)
		for (unsigned i = 0; i < np; i++)
			if (needs_write(partial[i]))
				return ENOTSUP;
	int err = 0;
	if (first < last) // (its errors count as the trim's)
		err = trim(uint32_t(std::min<uint64_t>(end, last * slab_size_) - first * slab_size_),
			   first * slab_size_);
	// Zeros go only to slabs that hold data: an empty slab already reads as zeros.
	for (unsigned i = 0; i < np && !err; i++)
		err = count_error(VolumeOp::Zero,
				  write_range(nullptr, partial[i].len, partial[i].at, false));
	return err;
}

} // namespace rdmaswap
