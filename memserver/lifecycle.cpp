// SPDX-License-Identifier: MIT
// Memserver: the session transitions (join, leave -> detached or ended, bind with takeover,
// lease expiry), each made in one step under the lifecycle mutex.
#include <malloc.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "common/obs/log.h"
#include "memserver/rdma_service.h"
#include "memserver/server.h"

namespace rdmaswap {

namespace {
// Hand freed heap memory back to the system (malloc_trim) once this many epoch floors and
// sessions have been freed since the last time: a trim walks the heap, so not after every
// small session.
constexpr uint64_t kTrimAfter = 4096;
} // namespace

void Memserver::lifecycle_pause(const char *step, uint64_t session)
{
	if (opts_.test_lifecycle_pause.count() <= 0)
		return;
	logger("memserver")->info("test hook: lifecycle pause of {} ms in the {} of session {:016x}",
				  opts_.test_lifecycle_pause.count(), step, session);
	std::this_thread::sleep_for(opts_.test_lifecycle_pause);
}

bool Memserver::join_session(uint64_t id, uint64_t token)
{
	// Not while another transition of the session is half done: a session that is being
	// detached is joined after its RDMA state is gone (so a new QP gets a new PD), and one
	// that ended can no longer be joined.
	std::lock_guard life(lifecycle_mu_);
	return sessions_.join(id, token);
}

void Memserver::leave_session(uint64_t session)
{
	std::unique_lock life(lifecycle_mu_);
	const SessionTable::Left left = sessions_.leave(session);
	if (left == SessionTable::Left::Live)
		return;
	const bool detached = left == SessionTable::Left::Detached;
	if (detached)
		lifecycle_pause("detach", session);
	if (rdma_)
		rdma_->end_session(session); // its rkeys die with its PD, before any slab is freed
	if (detached) {
		session_info(peers_.session_owner(session),
			     "session {:016x} detached: its slabs are kept for its volume's lease",
			     session);
		return;
	}
	// Ended: no transition can name the session any more (a join answers ENOENT, a bind and
	// lease expiry do not see it), so its slabs are freed (each one zeroed after its
	// in-flight accesses) without holding up other sessions' transitions.
	life.unlock();
	const auto owner = peers_.end_session(session); // --max-peer-sessions: one less
	const uint32_t n = pool_.release_all(session);
	session_info(owner, "session {:016x} ended; {} slabs freed", session, n);
}

void Memserver::expire_leases()
{
	// The lease thread calls this every 200 ms (not the accept loop: freeing and zeroing the
	// slabs of an expired session must not hold up accepting).
	std::unique_lock life(lifecycle_mu_);
	const auto gone = sessions_.expire(SessionTable::Clock::now());
	if (gone.empty())
		return;
	if (rdma_)
		for (const auto &e : gone)
			rdma_->end_session(e.id); // none: dropped when it detached
	// Removed from the table under the lock: no join or takeover can reach them now.
	life.unlock();
	for (const auto &e : gone) {
		const auto owner = peers_.end_session(e.id);
		const uint32_t n = pool_.release_all(e.id);
		session_info(owner, "volume {} (session {:016x}, last client {}): lease expired; {} "
			     "slabs freed",
			     e.name, e.id, e.peer, n);
	}
}

void Memserver::lease_loop()
{
	while (!stop_.load()) {
		std::this_thread::sleep_for(std::chrono::milliseconds(200));
		expire_leases();
		// Off every lock: glibc takes its arena locks, which the data path (it allocates
		// nothing) does not need.
		freed_since_trim_ += sessions_.take_freed();
		if (freed_since_trim_ >= kTrimAfter) {
			malloc_trim(0);
			freed_since_trim_ = 0;
		}
	}
}

Memserver::Bound Memserver::bind_volume(uint64_t session, const std::string &scoped,
					const std::string &name, uint32_t lease_s)
{
	// The takeover and the move of the slabs in one step: the detached session cannot end,
	// expire or be joined between them (its slabs would be freed under the new owner).
	std::lock_guard life(lifecycle_mu_);
	Bound b;
	b.bind = sessions_.bind(session, scoped, name, lease_s);
	if (b.bind.err == 0 && b.bind.took_over) {
		lifecycle_pause("takeover", session);
		b.slabs = pool_.reassign(b.bind.took_over, session);
		peers_.end_session(b.bind.took_over); // gone: its creator's count drops
	}
	return b;
}

} // namespace rdmaswap
