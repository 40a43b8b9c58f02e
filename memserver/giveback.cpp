// SPDX-License-Identifier: MIT
// Memserver: giving memory back to the host (GIVEBACK, and --reserve's watch of MemAvailable).
#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "common/obs/log.h"
#include "memserver/server.h"

namespace rdmaswap {

namespace {
// `bytes` in whole slabs (rounded up), at most the pool's.
uint32_t slabs_for(const SlabPool &pool, uint64_t bytes)
{
	const uint64_t n = bytes / pool.slab_size() + (bytes % pool.slab_size() != 0);
	return uint32_t(std::min<uint64_t>(n, pool.slabs_total()));
}
} // namespace

proto::GiveBackReply Memserver::give_back_status() const
{
	proto::GiveBackReply r;
	r.slabs_withdrawn = pool_.slabs_withdrawn();
	r.slabs_wanted = pool_.slabs_wanted();
	r.slabs_total = pool_.slabs_total();
	return r;
}

proto::GiveBackReply Memserver::give_back(uint64_t bytes)
{
	const auto w = pool_.withdraw(slabs_for(pool_, bytes));
	proto::GiveBackReply r = give_back_status();
	r.withdrawn_now = w.now;
	r.wanted_now = w.wanted;
	logger("memserver")->info("give-back of {} bytes: {} free slabs withdrawn now, {} granted "
				  "slabs wanted back from their clients; {} of {} slabs withdrawn, "
				  "{} moves pending",
				  bytes, w.now, w.wanted, r.slabs_withdrawn, r.slabs_total,
				  r.slabs_wanted);
	return r;
}

proto::GiveBackReply Memserver::lend(uint64_t bytes)
{
	const uint32_t slabs = slabs_for(pool_, bytes);
	const uint32_t cancelled = pool_.cancel_wanted(slabs);
	const uint32_t restored = pool_.restore(slabs - cancelled);
	proto::GiveBackReply r = give_back_status();
	r.withdrawn_now = restored;
	r.wanted_now = cancelled;
	logger("memserver")->info("lend of {} bytes: {} pending moves cancelled, {} withdrawn slabs "
				  "offered again; {} of {} slabs withdrawn, {} moves pending",
				  bytes, cancelled, restored, r.slabs_withdrawn, r.slabs_total,
				  r.slabs_wanted);
	return r;
}

std::optional<uint64_t> read_mem_available(const std::string &path)
{
	std::ifstream f(path);
	std::string key;
	uint64_t kb = 0;
	std::string unit;
	while (f >> key >> kb) {
		std::getline(f, unit);
		if (key == "MemAvailable:")
			return kb * 1024;
	}
	return std::nullopt;
}

void Memserver::reserve_loop()
{
	auto log = logger("memserver");
	const uint64_t slab = pool_.slab_size();
	const uint64_t reserve = opts_.reserve;
	// Take memory back only when MemAvailable is this far above the reserve (and never more
	// than would bring it back below that), so that the pool does not flap.
	const uint64_t hysteresis = std::max<uint64_t>(2 * slab, reserve / 4);
	// After acting, wait for the kernel's accounting and the clients' moves to show.
	const auto settle = 3 * opts_.reserve_interval;
	auto next_action = std::chrono::steady_clock::now();
	uint32_t mine = 0; // slabs withdrawn (or wanted back) by this loop and not yet restored
	bool warned_read = false, warned_empty = false;
	while (!stop_.load()) {
		for (auto end = std::chrono::steady_clock::now() + opts_.reserve_interval;
		     !stop_.load() && std::chrono::steady_clock::now() < end;)
			std::this_thread::sleep_for(std::chrono::milliseconds(50));
		if (stop_.load())
			break;
		const auto avail = read_mem_available(opts_.meminfo);
		if (!avail) {
			if (!warned_read)
				log->warn("--reserve: cannot read MemAvailable from {}", opts_.meminfo);
			warned_read = true;
			continue;
		}
		warned_read = false;
		const auto now = std::chrono::steady_clock::now();
		if (now < next_action)
			continue;
		// An admin's LEND may have put back what this loop withdrew.
		mine = std::min(mine, pool_.slabs_withdrawn() + pool_.slabs_wanted());
		// Slabs already wanted back will be freed: count them as given.
		const uint64_t pending = uint64_t(pool_.slabs_wanted()) * slab;
		if (*avail + pending < reserve) {
			const uint64_t need = reserve - *avail - pending;
			const auto w = pool_.withdraw(uint32_t(
				std::min<uint64_t>((need + slab - 1) / slab, pool_.slabs_total())));
			if (w.now + w.wanted == 0) {
				if (!warned_empty)
					log->warn("--reserve: MemAvailable {} is below the reserve of {} "
						  "bytes, and every slab is already given back or wanted "
						  "back",
						  *avail, reserve);
				warned_empty = true;
				continue;
			}
			mine += w.now + w.wanted;
			next_action = now + settle;
			log->info("--reserve: MemAvailable {} below {}: {} free slabs withdrawn, {} "
				  "granted slabs wanted back ({} withdrawn in all)",
				  *avail, reserve, w.now, w.wanted, pool_.slabs_withdrawn());
		} else if (mine > 0 && *avail > reserve + hysteresis + slab) {
			warned_empty = false;
			const uint64_t room = (*avail - reserve - hysteresis) / slab;
			const uint32_t n = pool_.restore(uint32_t(std::min<uint64_t>(mine, room)));
			if (n == 0)
				continue;
			mine -= n;
			next_action = now + settle;
			log->info("--reserve: MemAvailable {} is well above {}: {} slabs taken back "
				  "({} still withdrawn)",
				  *avail, reserve, n, pool_.slabs_withdrawn());
		} else {
			warned_empty = false;
		}
	}
}

} // namespace rdmaswap
