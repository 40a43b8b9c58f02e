// SPDX-License-Identifier: MIT
// SlabPool: preallocated, locked memory with per-slab ownership; the scrubber thread zeroes
// released slabs.
#include "memserver/slab_pool.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/obs/guarded_main.h"
#include "common/util/err_text.h"
#include "common/util/swap_safety.h"

namespace rdmaswap {

namespace {
constexpr size_t npos = ~size_t(0);
} // namespace

SlabPool::SlabPool(uint64_t capacity, uint64_t slab_size, bool lock)
	: capacity_(capacity), slab_size_(slab_size), lock_(lock)
{
	if (slab_size < 65536 || (slab_size & (slab_size - 1)) != 0)
		throw std::runtime_error("slab size must be a power of two of at least 64K");
	if (capacity == 0 || capacity % slab_size != 0)
		throw std::runtime_error("capacity must be a non-zero multiple of the slab size");
	if (capacity / slab_size > UINT32_MAX - 1)
		throw std::runtime_error("too many slabs");
	nslabs_ = uint32_t(capacity / slab_size);

	void *p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (p == MAP_FAILED)
		throw std::runtime_error("cannot map " + std::to_string(capacity) +
					 " bytes: " + err_text(errno));
	base_ = static_cast<std::byte *>(p);
	if (lock && mlock(base_, capacity) != 0) {
		const int err = errno;
		munmap(base_, capacity);
		rlimit rl{};
		getrlimit(RLIMIT_MEMLOCK, &rl);
		std::string msg = "cannot lock " + std::to_string(capacity) +
				  " bytes of memory: " + err_text(err);
		if (err == EPERM || err == ENOMEM)
			msg += " (RLIMIT_MEMLOCK is " +
			       (rl.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
							     : std::to_string(rl.rlim_cur)) +
			       " bytes; raise it with `ulimit -l unlimited`, or "
			       "LimitMEMLOCK=infinity in the systemd unit, or lower --capacity)";
		throw std::runtime_error(msg);
	}
	slabs_ = std::make_unique<Slab[]>(nslabs_);
	free_.reserve(nslabs_);
	dirty_.reserve(nslabs_);
	flags_.assign(nslabs_, 0);
	for (uint32_t i = nslabs_; i-- > 0;)
		free_.push_back(i);
	publish();
	scrubber_ = std::thread([this] {
		prefault_stack();
		pthread_setname_np(pthread_self(), "rdmaswap-scrub");
		// The thread's exception boundary: the pool serves on (ALLOC zeroes a slab itself
		// when none is zeroed, bounded) and the scrubber starts again a second later.
		guarded_thread("memserver", "the slab scrubber", "it starts again in 1 s",
			       [this] { scrub_loop(); },
			       [this](const char *) {
				       std::unique_lock guard(mu_);
				       scrub_cv_.wait_for(guard, std::chrono::seconds(1),
							  [this] { return stop_; });
				       return stop_ ? AfterFailure::End : AfterFailure::Again;
			       });
	});
}

SlabPool::~SlabPool()
{
	{
		std::lock_guard lock(mu_);
		stop_ = true;
	}
	scrub_cv_.notify_all();
	if (scrubber_.joinable())
		scrubber_.join();
	if (base_)
		munmap(base_, capacity_);
}

void SlabPool::publish()
{
	free_n_.store(uint32_t(free_.size()) + pending_, std::memory_order_relaxed);
	withdrawn_n_.store(withdrawn_, std::memory_order_relaxed);
	wanted_n_.store(wanted_, std::memory_order_relaxed);
	zeroing_n_.store(uint32_t(dirty_.size()) + scrubbing_, std::memory_order_relaxed);
}

SlabPool::Counts SlabPool::counts() const
{
	Counts c;
	c.total = nslabs_;
	c.free = free_n_.load(std::memory_order_relaxed);
	c.withdrawn = withdrawn_n_.load(std::memory_order_relaxed);
	c.wanted = wanted_n_.load(std::memory_order_relaxed);
	c.zeroing = zeroing_n_.load(std::memory_order_relaxed);
	return c;
}

uint32_t SlabPool::slabs_free() const
{
	std::lock_guard lock(mu_);
	return uint32_t(free_.size()) + pending_;
}

size_t SlabPool::ready_dirty(uint8_t flags) const
{
	// A slab is released (owner kReleasing) before it is put here, so an access that starts
	// later is refused and touches nothing; one that passed the owner check before counts
	// itself first, so a zero count here means no access to the slab is open.
	for (size_t i = 0; i < dirty_.size(); i++)
		if (flags_[dirty_[i]] == flags && slabs_[dirty_[i]].inflight.load() == 0)
			return i;
	return npos;
}

uint32_t SlabPool::take_dirty(size_t i)
{
	const uint32_t id = dirty_[i];
	dirty_[i] = dirty_.back();
	dirty_.pop_back();
	return id;
}

std::optional<uint32_t> SlabPool::allocate(uint64_t owner, bool *over_quota)
{
	if (over_quota)
		*over_quota = false;
	if (owner == 0 || owner == kReleasing)
		return std::nullopt;
	std::unique_lock lock(mu_);
	// Counted first (so that two ALLOCs of one quota owner cannot both take its last slab),
	// taken back if no slab is granted.
	if (!accounts_.charge(owner)) {
		if (over_quota)
			*over_quota = true;
		return std::nullopt;
	}
	const auto deadline = std::chrono::steady_clock::now() + kAllocWait;
	for (;;) {
		if (!free_.empty()) {
			const uint32_t id = free_.back();
			free_.pop_back();
			publish();
			slabs_[id].owner.store(owner);
			return id;
		}
		// None zeroed: zero a released one here rather than wait for the scrubber.
		if (const size_t i = ready_dirty(0); i != npos) {
			const uint32_t id = take_dirty(i);
			pending_--;
			scrubbing_++;
			publish();
			lock.unlock();
			wipe(id);
			lock.lock();
			scrubbing_--;
			slabs_[id].tag = Tag{};
			publish();
			done_cv_.notify_all();
			slabs_[id].owner.store(owner);
			return id;
		}
		// The scrubber is zeroing one (or dropping one): it is back within one wipe.
		if (scrubbing_ == 0 ||
		    done_cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
			accounts_.uncharge(owner, 1);
			return std::nullopt;
		}
	}
}

void SlabPool::wipe(uint32_t id)
{
	// Zero before anyone else can be granted this slab: another tenant must never see these
	// bytes.
	std::memset(slab_base(id), 0, slab_size_);
}

bool SlabPool::release(uint32_t id, uint64_t owner)
{
	if (id >= nslabs_ || owner == 0)
		return false;
	uint64_t expected = owner;
	// One release per slab: the exchange admits one. From here every new access is refused.
	if (!slabs_[id].owner.compare_exchange_strong(expected, kReleasing))
		return false;
	{
		std::lock_guard lock(mu_);
		// withdraw() marks slabs under mu_ and skips those being released, so the flag
		// read here is final. Wanted back: out of the pool (counted withdrawn from now)
		// instead of onto the free list.
		if (flags_[id] & kWanted) {
			flags_[id] = kTransit;
			wanted_--;
			withdrawn_++;
		} else {
			pending_++;
		}
		accounts_.uncharge(owner, 1);
		slabs_[id].tag = Tag{};
		dirty_.push_back(id); // reserved: no allocation
		publish();
	}
	scrub_cv_.notify_one();
	return true;
}

void SlabPool::scrub_loop()
{
	std::unique_lock lock(mu_);
	while (!stop_) {
		size_t i = ready_dirty(0);
		if (i == npos)
			i = ready_dirty(kTransit);
		if (i == npos) {
			// Nothing, or only slabs whose accesses are still open (a slow reader's
			// replies: at most the message timeout), which are looked at again soon.
			if (dirty_.empty())
				scrub_cv_.wait(lock);
			else
				scrub_cv_.wait_for(lock, kAccessPoll);
			continue;
		}
		const uint32_t id = take_dirty(i);
		const bool drop = flags_[id] == kTransit;
		scrubbing_++;
		publish();
		lock.unlock();
		// Zeroed before anyone else can be granted it; a wanted slab's pages go back to the
		// kernel (they read as zeros after).
		if (drop)
			drop_pages(id);
		else
			wipe(id);
		lock.lock();
		scrubbing_--;
		slabs_[id].owner.store(0);
		if (drop) {
			flags_[id] = kWithdrawn;
		} else {
			pending_--;
			free_.push_back(id);
		}
		publish();
		done_cv_.notify_all();
	}
}

bool SlabPool::settle(std::chrono::steady_clock::time_point deadline) const
{
	std::unique_lock lock(mu_);
	return done_cv_.wait_until(lock, deadline,
				   [this] { return dirty_.empty() && scrubbing_ == 0; });
}

uint32_t SlabPool::release_all(uint64_t owner)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < nslabs_; i++)
		if (slabs_[i].owner.load() == owner && release(i, owner))
			n++;
	std::lock_guard lock(mu_);
	accounts_.forget(owner);
	return n;
}

bool SlabPool::set_tag(uint32_t id, uint64_t owner, const Tag &tag)
{
	std::lock_guard lock(mu_);
	if (!owns(id, owner))
		return false;
	slabs_[id].tag = tag;
	return true;
}

SlabPool::Tag SlabPool::tag(uint32_t id) const
{
	std::lock_guard lock(mu_);
	return id < nslabs_ ? slabs_[id].tag : Tag{};
}

uint32_t SlabPool::reassign(uint64_t from, uint64_t to)
{
	if (from == 0 || from == kReleasing || to == 0 || to == kReleasing)
		return 0;
	uint32_t n = 0;
	for (uint32_t i = 0; i < nslabs_; i++) {
		uint64_t expected = from;
		n += slabs_[i].owner.compare_exchange_strong(expected, to);
	}
	std::lock_guard lock(mu_);
	accounts_.move(from, to, n);
	accounts_.forget(from);
	return n;
}

void SlabPool::set_owner_limit(uint32_t slabs)
{
	std::lock_guard lock(mu_);
	accounts_.set_limit(slabs);
}

uint32_t SlabPool::owner_limit() const
{
	std::lock_guard lock(mu_);
	return accounts_.limit();
}

int SlabPool::assign(uint64_t session, const std::string &qowner, bool force)
{
	std::lock_guard lock(mu_);
	return accounts_.assign(session, qowner, force);
}

int SlabPool::check_assign(uint64_t session, const std::string &qowner) const
{
	std::lock_guard lock(mu_);
	return accounts_.check_assign(session, qowner);
}

uint32_t SlabPool::owner_held(uint64_t session) const
{
	std::lock_guard lock(mu_);
	return accounts_.held_by_owner_of(session);
}

std::string SlabPool::owner_name(uint64_t session) const
{
	std::lock_guard lock(mu_);
	return accounts_.owner_of(session);
}

uint32_t SlabPool::owner_left(uint64_t session) const
{
	std::lock_guard lock(mu_);
	return accounts_.left(session);
}

void SlabPool::drop_pages(uint32_t id)
{
	std::byte *p = slab_base(id);
	// Locked pages cannot be dropped: unlock first (also undoes mlockall's lock). Anonymous
	// private pages read as zeros after MADV_DONTNEED, so nothing of the old tenant remains.
	munlock(p, slab_size_);
	if (madvise(p, slab_size_, MADV_DONTNEED) != 0)
		wipe(id); // memory not given back, but the next tenant still gets zeros
}

SlabPool::Withdrawal SlabPool::withdraw(uint32_t n)
{
	std::lock_guard resize(resize_mu_);
	Withdrawal w;
	std::vector<uint32_t> drop;
	uint32_t dropped_dirty = 0;
	{
		std::lock_guard lock(mu_);
		while (drop.size() < n && !free_.empty()) {
			const uint32_t id = free_.back();
			free_.pop_back();
			flags_[id] = kTransit;
			withdrawn_++;
			drop.push_back(id);
		}
		// Released slabs the scrubber has not zeroed yet: it drops them instead.
		for (uint32_t id : dirty_) {
			if (drop.size() + dropped_dirty >= n)
				break;
			if (flags_[id] != 0)
				continue;
			flags_[id] = kTransit;
			pending_--;
			withdrawn_++;
			dropped_dirty++;
		}
		for (uint32_t i = nslabs_; i-- > 0 && drop.size() + dropped_dirty + w.wanted < n;) {
			const uint64_t o = slabs_[i].owner.load();
			if (o == 0 || o == kReleasing || flags_[i] != 0)
				continue;
			flags_[i] = kWanted;
			wanted_++;
			w.wanted++;
		}
		publish();
	}
	for (uint32_t id : drop)
		drop_pages(id);
	std::lock_guard lock(mu_);
	for (uint32_t id : drop)
		flags_[id] = kWithdrawn;
	w.now = uint32_t(drop.size()) + dropped_dirty;
	return w;
}

uint32_t SlabPool::cancel_wanted(uint32_t n)
{
	std::lock_guard resize(resize_mu_);
	std::lock_guard lock(mu_);
	uint32_t done = 0;
	// A slab being released already holds kTransit (release() swapped the flag under mu_):
	// only a plain kWanted is still the owner's.
	for (uint32_t i = 0; i < nslabs_ && done < n; i++)
		if (flags_[i] == kWanted) {
			flags_[i] = 0;
			wanted_--;
			done++;
		}
	publish();
	return done;
}

uint32_t SlabPool::restore(uint32_t n)
{
	std::lock_guard resize(resize_mu_);
	std::vector<uint32_t> ids;
	{
		std::lock_guard lock(mu_);
		for (uint32_t i = 0; i < nslabs_ && ids.size() < n; i++)
			if (flags_[i] == kWithdrawn) {
				flags_[i] = kTransit;
				ids.push_back(i);
			}
	}
	uint32_t done = 0;
	for (uint32_t id : ids) {
		// Fault the pages in again (zeros: writing them populates, whatever mlock does — an
		// ASan build's mlock is a no-op) and lock them, as at start.
		wipe(id);
		const bool ok = !lock_ || mlock(slab_base(id), slab_size_) == 0;
		std::lock_guard lock(mu_);
		if (!ok) {
			flags_[id] = kWithdrawn;
			continue;
		}
		flags_[id] = 0;
		withdrawn_--;
		free_.push_back(id);
		publish();
		done++;
	}
	return done;
}

std::vector<uint32_t> SlabPool::wanted_by(uint64_t owner) const
{
	std::vector<uint32_t> v;
	std::lock_guard lock(mu_);
	if (wanted_ == 0)
		return v;
	for (uint32_t i = 0; i < nslabs_; i++)
		if ((flags_[i] & kWanted) && slabs_[i].owner.load() == owner)
			v.push_back(i);
	return v;
}

uint32_t SlabPool::slabs_withdrawn() const
{
	std::lock_guard lock(mu_);
	return withdrawn_;
}

uint32_t SlabPool::slabs_wanted() const
{
	std::lock_guard lock(mu_);
	return wanted_;
}

bool SlabPool::owns(uint32_t id, uint64_t owner) const
{
	return id < nslabs_ && owner != 0 && slabs_[id].owner.load() == owner;
}

std::vector<uint32_t> SlabPool::owned_by(uint64_t owner) const
{
	std::vector<uint32_t> v;
	for (uint32_t i = 0; i < nslabs_; i++)
		if (slabs_[i].owner.load() == owner)
			v.push_back(i);
	return v;
}

std::byte *SlabPool::begin_access(uint32_t id, uint64_t owner, uint64_t off, uint64_t len)
{
	if (id >= nslabs_ || owner == 0 || off > slab_size_ || slab_size_ - off < len)
		return nullptr;
	Slab &s = slabs_[id];
	// Cheap refusal first, so that a stream of refused accesses cannot keep the in-flight
	// count up and stall a concurrent release().
	if (s.owner.load() != owner)
		return nullptr;
	s.inflight.fetch_add(1);
	if (s.owner.load() != owner) {
		end_access(id); // may be the one a release() waits for
		return nullptr;
	}
	return slab_base(id) + off;
}

} // namespace rdmaswap
