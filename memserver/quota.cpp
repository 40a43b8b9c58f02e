// SPDX-License-Identifier: MIT
// OwnerAccounts and OwnerWindow: the memserver's quotas per identity.
#include "memserver/quota.h"

#include <algorithm>
#include <cerrno>
#include <iterator>

namespace rdmaswap {

uint32_t owner_slab_limit(uint32_t total, uint32_t max_slabs, unsigned share_percent)
{
	uint64_t limit = uint64_t(total) * std::min(share_percent, 100u) / 100;
	if (max_slabs)
		limit = std::min<uint64_t>(limit, max_slabs);
	return uint32_t(std::max<uint64_t>(limit, 1));
}

std::string address_owner(const PeerAddr &a)
{
	return "address " + a.str();
}

std::string key_owner(const std::string &pubkey_hex)
{
	return "volume key " + pubkey_hex;
}

int OwnerAccounts::check_assign(uint64_t s, const std::string &owner) const
{
	auto it = sessions_.find(s);
	if (it == sessions_.end() || it->second.owner == owner || it->second.slabs == 0)
		return 0;
	return uint64_t(held(owner)) + it->second.slabs > limit_ ? EDQUOT : 0;
}

int OwnerAccounts::assign(uint64_t s, const std::string &owner, bool force)
{
	if (!force)
		if (const int err = check_assign(s, owner))
			return err;
	auto it = sessions_.find(s);
	if (it != sessions_.end() && it->second.owner == owner)
		return 0;
	const uint32_t slabs = it == sessions_.end() ? 0 : it->second.slabs;
	if (it == sessions_.end())
		it = sessions_.emplace(s, Session{}).first;
	else
		drop_owner(it->second.owner, slabs);
	it->second.owner = owner;
	Owner &o = owners_[owner];
	o.sessions++;
	o.slabs += slabs;
	return 0;
}

bool OwnerAccounts::charge(uint64_t s)
{
	auto it = sessions_.find(s);
	if (it == sessions_.end())
		return true;
	Owner &o = owners_[it->second.owner];
	if (o.slabs >= limit_)
		return false;
	o.slabs++;
	it->second.slabs++;
	return true;
}

void OwnerAccounts::uncharge(uint64_t s, uint32_t n)
{
	auto it = sessions_.find(s);
	if (it == sessions_.end() || n == 0)
		return;
	n = std::min(n, it->second.slabs);
	it->second.slabs -= n;
	Owner &o = owners_[it->second.owner];
	o.slabs -= std::min(n, o.slabs);
}

void OwnerAccounts::move(uint64_t from, uint64_t to, uint32_t n)
{
	auto f = sessions_.find(from);
	auto t = sessions_.find(to);
	if (n == 0)
		return;
	if (f != sessions_.end()) {
		n = std::min(n, f->second.slabs);
		uncharge(from, n);
	}
	// Not over the limit: the slabs stay with one holder (a takeover of the same volume).
	if (t != sessions_.end()) {
		t->second.slabs += n;
		owners_[t->second.owner].slabs += n;
	}
}

void OwnerAccounts::forget(uint64_t s)
{
	auto it = sessions_.find(s);
	if (it == sessions_.end())
		return;
	drop_owner(it->second.owner, it->second.slabs);
	sessions_.erase(it);
}

void OwnerAccounts::drop_owner(const std::string &owner, uint32_t slabs)
{
	auto o = owners_.find(owner);
	if (o == owners_.end())
		return;
	o->second.slabs -= std::min(slabs, o->second.slabs);
	if (--o->second.sessions == 0)
		owners_.erase(o);
}

uint32_t OwnerAccounts::held(const std::string &owner) const
{
	auto o = owners_.find(owner);
	return o == owners_.end() ? 0 : o->second.slabs;
}

uint32_t OwnerAccounts::held_by_owner_of(uint64_t s) const
{
	auto it = sessions_.find(s);
	return it == sessions_.end() ? 0 : held(it->second.owner);
}

uint32_t OwnerAccounts::left(uint64_t s) const
{
	auto it = sessions_.find(s);
	if (it == sessions_.end())
		return UINT32_MAX;
	const uint32_t have = held(it->second.owner);
	return have >= limit_ ? 0 : limit_ - have;
}

std::string OwnerAccounts::owner_of(uint64_t s) const
{
	auto it = sessions_.find(s);
	return it == sessions_.end() ? std::string() : it->second.owner;
}

void OwnerWindow::prune(std::vector<Seen> &v, Clock::time_point now) const
{
	std::erase_if(v, [&](const Seen &e) { return now - e.last >= period_; });
}

bool OwnerWindow::admit(const PeerAddr &a, const std::string &owner, Clock::time_point now)
{
	std::lock_guard lock(mu_);
	auto it = map_.find(a);
	if (it == map_.end()) {
		if (map_.size() >= max_peers_) {
			// Full: forget the addresses whose owners all aged out, then look again.
			for (auto i = map_.begin(); i != map_.end();) {
				prune(i->second, now);
				i = i->second.empty() ? map_.erase(i) : std::next(i);
			}
			if (map_.size() >= max_peers_)
				return false;
		}
		it = map_.emplace(a, std::vector<Seen>{}).first;
	}
	std::vector<Seen> &v = it->second;
	prune(v, now);
	for (Seen &e : v)
		if (e.owner == owner) {
			e.last = now;
			return true;
		}
	if (v.size() >= max_)
		return false;
	v.push_back(Seen{owner, now});
	return true;
}

unsigned OwnerWindow::owners(const PeerAddr &a, Clock::time_point now)
{
	std::lock_guard lock(mu_);
	auto it = map_.find(a);
	if (it == map_.end())
		return 0;
	prune(it->second, now);
	return unsigned(it->second.size());
}

} // namespace rdmaswap
