// SPDX-License-Identifier: MIT
// SessionTable: ids, tokens, references.
#include "memserver/sessions.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <utility>

namespace rdmaswap {

namespace {
size_t floor_count(const auto &entry)
{
	return entry.floors ? entry.floors->map.size() : 0;
}
} // namespace

uint64_t random_u64()
{
	for (;;) {
		uint64_t v = 0;
		ssize_t n = getrandom(&v, sizeof v, 0);
		if (n == sizeof v && v != 0)
			return v;
		if (n < 0 && errno != EINTR)
			throw std::runtime_error("getrandom failed");
	}
}

SessionTable::Creds SessionTable::create(bool rdma, const Mac &attach_key)
{
	std::lock_guard lock(mu_);
	Creds c;
	do
		c.id = random_u64();
	while (map_.count(c.id));
	c.token = random_u64();
	map_[c.id] = Entry{c.token, 1, rdma, attach_key};
	publish();
	return c;
}

bool SessionTable::join(uint64_t id, uint64_t token)
{
	std::lock_guard lock(mu_);
	auto it = map_.find(id);
	if (it == map_.end())
		return false;
	// Constant-time comparison: the time taken must not tell how many bits matched.
	const uint64_t have = it->second.token;
	if (!mac_equal(std::as_bytes(std::span(&have, 1)), std::as_bytes(std::span(&token, 1))))
		return false;
	it->second.refs++;
	it->second.detached = false; // its client came back before the lease ended
	publish();
	return true;
}

SessionTable::Left SessionTable::leave(uint64_t id)
{
	std::lock_guard lock(mu_);
	auto it = map_.find(id);
	if (it == map_.end() || it->second.refs == 0)
		return Left::Live;
	if (--it->second.refs > 0)
		return Left::Live;
	if (!it->second.scoped.empty() && it->second.lease_s > 0) {
		it->second.detached = true;
		it->second.detached_at = Clock::now();
		publish();
		return Left::Detached;
	}
	freed_ += 1 + floor_count(it->second);
	map_.erase(it); // its floors' pages are unmapped
	publish();
	return Left::Ended;
}

void SessionTable::set_peer(uint64_t id, const std::string &peer)
{
	std::lock_guard lock(mu_);
	if (auto it = map_.find(id); it != map_.end())
		it->second.peer = peer;
}

SessionTable::BindResult SessionTable::bind(uint64_t id, const std::string &scoped,
					    const std::string &name, uint32_t lease_s)
{
	std::lock_guard lock(mu_);
	BindResult r;
	auto it = map_.find(id);
	if (it == map_.end() || scoped.empty()) {
		r.err = EINVAL;
		return r;
	}
	Entry &me = it->second;
	if (!me.scoped.empty()) {
		if (me.scoped != scoped)
			r.err = EINVAL;
		else
			me.lease_s = lease_s;
		return r;
	}
	for (auto o = map_.begin(); o != map_.end(); ++o) {
		if (o->first == id || o->second.scoped != scoped)
			continue;
		if (!o->second.detached) { // never two live owners
			r.err = EBUSY;
			r.other_peer = o->second.peer;
			return r;
		}
		r.took_over = o->first;
		r.detached_for = std::chrono::duration_cast<std::chrono::milliseconds>(
			Clock::now() - o->second.detached_at);
		me.floors = std::move(o->second.floors);
		freed_++;
		map_.erase(o);
		publish();
		break;
	}
	me.scoped = scoped;
	me.name = name;
	me.lease_s = lease_s;
	return r;
}

uint64_t SessionTable::take_freed()
{
	std::lock_guard lock(mu_);
	return std::exchange(freed_, 0);
}

bool SessionTable::detached(uint64_t id) const
{
	std::lock_guard lock(mu_);
	auto it = map_.find(id);
	return it != map_.end() && it->second.detached;
}

std::vector<SessionTable::Expired> SessionTable::expire(Clock::time_point now)
{
	std::lock_guard lock(mu_);
	std::vector<Expired> out;
	for (auto it = map_.begin(); it != map_.end();) {
		const Entry &e = it->second;
		if (e.detached && now - e.detached_at >= std::chrono::seconds(e.lease_s)) {
			out.push_back(Expired{it->first, e.name, e.peer});
			freed_ += 1 + floor_count(e);
			it = map_.erase(it);
		} else {
			++it;
		}
	}
	if (!out.empty())
		publish();
	return out;
}

int SessionTable::set_floor(uint64_t id, uint64_t chunk, uint64_t epoch)
{
	std::lock_guard lock(mu_);
	auto it = map_.find(id);
	if (it == map_.end() || it->second.scoped.empty())
		return EINVAL;
	auto &fm = it->second.floors;
	if (epoch == 0) {
		if (fm)
			freed_ += fm->map.erase(chunk);
		return 0;
	}
	if (!fm)
		fm = std::make_unique<FloorMap>();
	auto &f = fm->map;
	if (!f.count(chunk) && f.size() >= max_floors_)
		return ENOSPC;
	f[chunk] = epoch;
	return 0;
}

std::vector<std::pair<uint64_t, uint64_t>> SessionTable::floors(uint64_t id, uint64_t start,
								size_t max) const
{
	std::lock_guard lock(mu_);
	std::vector<std::pair<uint64_t, uint64_t>> out;
	auto it = map_.find(id);
	if (it == map_.end() || !it->second.floors)
		return out;
	const auto &f = it->second.floors->map;
	for (auto i = f.lower_bound(start); i != f.end() && out.size() < max; ++i)
		out.emplace_back(i->first, i->second);
	return out;
}

std::vector<SessionTable::Report> SessionTable::report(Clock::time_point now) const
{
	std::lock_guard lock(mu_);
	std::vector<Report> out;
	for (const auto &[id, e] : map_) {
		Report r;
		r.id = id;
		r.rdma = e.rdma;
		r.bound = !e.scoped.empty();
		r.detached = e.detached;
		r.refs = e.refs;
		r.lease_s = e.lease_s;
		if (e.detached) {
			const auto end = e.detached_at + std::chrono::seconds(e.lease_s);
			r.lease_left = end > now ? std::chrono::duration_cast<std::chrono::milliseconds>(
							   end - now)
						 : std::chrono::milliseconds(0);
		}
		r.name = e.name;
		r.peer = e.peer;
		out.push_back(std::move(r));
	}
	std::sort(out.begin(), out.end(), [](const Report &a, const Report &b) { return a.id < b.id; });
	return out;
}

bool SessionTable::wants_rdma(uint64_t id) const
{
	std::lock_guard lock(mu_);
	auto it = map_.find(id);
	return it != map_.end() && it->second.rdma;
}

bool SessionTable::attach_key(uint64_t id, Mac &out) const
{
	std::lock_guard lock(mu_);
	auto it = map_.find(id);
	if (it == map_.end())
		return false;
	out = it->second.attach;
	return true;
}

void SessionTable::publish()
{
	uint32_t detached = 0, rdma = 0;
	for (const auto &[id, e] : map_) {
		detached += e.detached;
		rdma += e.rdma;
	}
	sessions_n_.store(uint32_t(map_.size()), std::memory_order_relaxed);
	detached_n_.store(detached, std::memory_order_relaxed);
	rdma_n_.store(rdma, std::memory_order_relaxed);
}

SessionTable::Counts SessionTable::counts() const
{
	Counts c;
	c.sessions = sessions_n_.load(std::memory_order_relaxed);
	c.detached = detached_n_.load(std::memory_order_relaxed);
	c.rdma = rdma_n_.load(std::memory_order_relaxed);
	return c;
}

uint32_t SessionTable::count() const
{
	std::lock_guard lock(mu_);
	return uint32_t(map_.size());
}

uint32_t SessionTable::rdma_count() const
{
	std::lock_guard lock(mu_);
	uint32_t n = 0;
	for (auto &[id, e] : map_)
		n += e.rdma;
	return n;
}

} // namespace rdmaswap
