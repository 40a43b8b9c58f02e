// SPDX-License-Identifier: MIT
// SessionTable: ids, tokens, references.
#include "memserver/sessions.h"

#include <sys/random.h>

#include <cerrno>
#include <stdexcept>

namespace rdmaswap {

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
	return true;
}

bool SessionTable::leave(uint64_t id)
{
	std::lock_guard lock(mu_);
	auto it = map_.find(id);
	if (it == map_.end())
		return false;
	if (--it->second.refs > 0)
		return false;
	map_.erase(it);
	return true;
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
