// SPDX-License-Identifier: MIT
// PeerTable: per-address token buckets, connection and session counts, log limiters.
#include "memserver/peers.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace rdmaswap {

PeerAddr PeerAddr::from(const sockaddr_storage &ss)
{
	PeerAddr a;
	if (ss.ss_family == AF_INET) {
		const auto &in = reinterpret_cast<const sockaddr_in &>(ss);
		a.b[10] = a.b[11] = 0xff;
		std::memcpy(a.b.data() + 12, &in.sin_addr, 4);
	} else if (ss.ss_family == AF_INET6) {
		const auto &in6 = reinterpret_cast<const sockaddr_in6 &>(ss);
		std::memcpy(a.b.data(), &in6.sin6_addr, 16);
	}
	return a;
}

std::string PeerAddr::str() const
{
	char buf[INET6_ADDRSTRLEN] = "?";
	static constexpr uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	if (std::memcmp(b.data(), v4mapped, 12) == 0)
		inet_ntop(AF_INET, b.data() + 12, buf, sizeof buf);
	else
		inet_ntop(AF_INET6, b.data(), buf, sizeof buf);
	return buf;
}

size_t PeerAddrHash::operator()(const PeerAddr &a) const noexcept
{
	uint64_t x, y;
	std::memcpy(&x, a.b.data(), 8);
	std::memcpy(&y, a.b.data() + 8, 8);
	// splitmix64's finaliser over both halves.
	uint64_t h = x ^ (y * 0x9e3779b97f4a7c15ull);
	h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
	h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
	return size_t(h ^ (h >> 31));
}

bool PeerTable::idle(const Entry &e, Clock::time_point now) const
{
	if (e.conns || e.sessions || e.log_dropped)
		return false;
	if (lim_.connect_rate == 0)
		return true;
	// Evicting an address forgives its bucket: only once it would be full again.
	const double burst = 2.0 * lim_.connect_rate;
	const double dt = std::chrono::duration<double>(now - e.refilled).count();
	return e.tokens + dt * lim_.connect_rate >= burst;
}

void PeerTable::count_drop(Entry *e, const PeerAddr &a, Verdict v)
{
	Report &r = reports_[size_t(v)];
	r.d.total++;
	if (!e)
		return;
	uint64_t &n = e->drops[size_t(v)];
	if (e->drop_epoch[size_t(v)] != r.epoch) {
		e->drop_epoch[size_t(v)] = r.epoch;
		n = 0;
		r.d.addresses++;
	}
	if (++n > r.d.worst_count) {
		r.d.worst_count = n;
		r.d.worst = a;
	}
}

PeerTable::Verdict PeerTable::admit(const PeerAddr &a, Clock::time_point now, bool server_full)
{
	std::lock_guard lock(mu_);
	auto it = map_.find(a);
	if (it == map_.end()) {
		// A full table is swept at most once a second: a flood from many addresses costs
		// one scan per second, not one per connection.
		if (map_.size() >= lim_.max_peers && now - last_full_sweep_ >= std::chrono::seconds(1)) {
			last_full_sweep_ = now;
			sweep_locked(now);
		}
		if (map_.size() >= lim_.max_peers) {
			count_drop(nullptr, a, Verdict::TableFull);
			return Verdict::TableFull;
		}
		it = map_.try_emplace(a).first;
		it->second.tokens = 2.0 * lim_.connect_rate;
		it->second.refilled = now;
	}
	Entry &e = it->second;
	if (lim_.connect_rate) {
		const double burst = 2.0 * lim_.connect_rate;
		const double dt = std::chrono::duration<double>(now - e.refilled).count();
		e.tokens = std::min(burst, e.tokens + std::max(0.0, dt) * lim_.connect_rate);
		e.refilled = now;
		if (e.tokens < 1.0) {
			count_drop(&e, a, Verdict::Rate);
			return Verdict::Rate;
		}
		e.tokens -= 1.0;
	}
	if (server_full) {
		count_drop(&e, a, Verdict::ServerFull);
		return Verdict::ServerFull;
	}
	if (e.conns >= lim_.max_connections) {
		count_drop(&e, a, Verdict::Connections);
		return Verdict::Connections;
	}
	e.conns++;
	return Verdict::Ok;
}

void PeerTable::closed(const PeerAddr &a)
{
	std::lock_guard lock(mu_);
	if (auto it = map_.find(a); it != map_.end() && it->second.conns)
		it->second.conns--;
}

bool PeerTable::reserve_session(const PeerAddr &a)
{
	std::lock_guard lock(mu_);
	auto it = map_.find(a);
	if (it == map_.end()) // not admitted through the accept loop (a unit test): add it
		it = map_.try_emplace(a).first;
	if (it->second.sessions >= lim_.max_sessions)
		return false;
	it->second.sessions++;
	return true;
}

void PeerTable::unreserve_session(const PeerAddr &a)
{
	std::lock_guard lock(mu_);
	if (auto it = map_.find(a); it != map_.end() && it->second.sessions)
		it->second.sessions--;
}

void PeerTable::own_session(const PeerAddr &a, uint64_t id)
{
	std::lock_guard lock(mu_);
	owner_[id] = a;
}

std::optional<PeerAddr> PeerTable::end_session(uint64_t id)
{
	std::lock_guard lock(mu_);
	auto o = owner_.find(id);
	if (o == owner_.end())
		return std::nullopt;
	const PeerAddr a = o->second;
	owner_.erase(o);
	if (auto it = map_.find(a); it != map_.end() && it->second.sessions)
		it->second.sessions--;
	return a;
}

std::optional<PeerAddr> PeerTable::session_owner(uint64_t id) const
{
	std::lock_guard lock(mu_);
	if (auto o = owner_.find(id); o != owner_.end())
		return o->second;
	return std::nullopt;
}

unsigned PeerTable::sessions(const PeerAddr &a) const
{
	std::lock_guard lock(mu_);
	auto it = map_.find(a);
	return it == map_.end() ? 0 : it->second.sessions;
}

unsigned PeerTable::connections(const PeerAddr &a) const
{
	std::lock_guard lock(mu_);
	auto it = map_.find(a);
	return it == map_.end() ? 0 : it->second.conns;
}

bool PeerTable::log_allowed(const PeerAddr &a, uint64_t &suppressed, Clock::time_point now)
{
	suppressed = 0;
	std::lock_guard lock(mu_);
	auto it = map_.find(a);
	if (it == map_.end())
		return true;
	Entry &e = it->second;
	if (now - e.log_window >= lim_.log_period) {
		e.log_window = now;
		e.log_lines = 0;
	}
	if (e.log_lines >= lim_.log_burst) {
		if (e.log_dropped++ == 0)
			log_pending_.push_back(a); // control path: allocates now and then
		return false;
	}
	e.log_lines++;
	suppressed = std::exchange(e.log_dropped, 0);
	return true;
}

std::vector<PeerTable::Suppressed> PeerTable::log_suppressed(Clock::time_point now)
{
	std::vector<Suppressed> out;
	std::lock_guard lock(mu_);
	for (auto p = log_pending_.begin(); p != log_pending_.end();) {
		auto it = map_.find(*p);
		if (it == map_.end() || it->second.log_dropped == 0) {
			p = log_pending_.erase(p); // reported by log_allowed() already
			continue;
		}
		Entry &e = it->second;
		if (now - e.log_window < lim_.log_period) {
			++p;
			continue;
		}
		out.push_back(Suppressed{*p, std::exchange(e.log_dropped, 0)});
		p = log_pending_.erase(p);
	}
	return out;
}

PeerTable::Dropped PeerTable::drop_report(Verdict v)
{
	std::lock_guard lock(mu_);
	Report &r = reports_[size_t(v)];
	const Dropped d = r.d;
	r.d = Dropped{};
	r.epoch++;
	return d;
}

size_t PeerTable::sweep_locked(Clock::time_point now)
{
	size_t n = 0;
	for (auto it = map_.begin(); it != map_.end();) {
		if (idle(it->second, now)) {
			it = map_.erase(it);
			n++;
		} else {
			++it;
		}
	}
	return n;
}

size_t PeerTable::sweep(Clock::time_point now)
{
	std::lock_guard lock(mu_);
	return sweep_locked(now);
}

size_t PeerTable::size() const
{
	std::lock_guard lock(mu_);
	return map_.size();
}

} // namespace rdmaswap
