// SPDX-License-Identifier: MIT
// Membership: what etcd says about the donors (membership.h, "with a registry"): a listing
// applied whole, one watch event at a time, and the entries ignored, counted and warned about.
#include "common/cluster/membership.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "common/net/etcd.h"
#include "common/obs/log.h"

namespace rdmaswap {

void Membership::set_registered(std::span<const discovery::Donor> donors)
{
	{
		std::lock_guard lock(mu_);
		for (auto &e : entries_)
			e.registered = false;
		for (const auto &d : donors) {
			Entry *e = entry(d.addr);
			if (!e) {
				counters_.ignored_beyond++;
				pending_ignored_.beyond++;
				pending_ignored_.note(d.addr.str(), fmt::format("more than {} donors known",
										 kMaxEntries));
				continue;
			}
			if (!fresh(*e, d))
				continue; // (not registered: as if the key held nothing)
			if (!e->registered && e->seq == 0)
				e->seq = ++seq_;
			e->registered = true;
			e->boot_id = d.boot_id;
		}
		wake_ = true;
	}
	cv_.notify_all();
	warn_ignored(false); // (replays, counted above)
}

void Membership::registration_put(const discovery::Donor &d)
{
	{
		std::lock_guard lock(mu_);
		counters_.events++;
		Entry *e = entry(d.addr);
		if (!e) {
			counters_.ignored_beyond++;
			pending_ignored_.beyond++;
			pending_ignored_.note(d.addr.str(),
					      fmt::format("more than {} donors known", kMaxEntries));
			return;
		}
		if (!fresh(*e, d)) { // a replay: as if the key held nothing
			e->registered = false;
			wake_ = true;
		} else {
			if (!e->registered)
				e->seq = ++seq_; // registered now: asked before the donors registered
						 // earlier
			e->registered = true;
			e->boot_id = d.boot_id;
			wake_ = true;
		}
	}
	cv_.notify_all();
	warn_ignored(false); // (a replay, counted above)
}

void Membership::registration_gone(const Endpoint &addr)
{
	{
		std::lock_guard lock(mu_);
		counters_.events++;
		Entry *e = find(addr.str());
		if (!e || !e->registered)
			return;
		e->registered = false;
		wake_ = true;
	}
	cv_.notify_all();
}

void Membership::note_ignored(const discovery::Ignored &ignored)
{
	if (ignored.total() == 0)
		return;
	{
		std::lock_guard lock(mu_);
		counters_.ignored_invalid += ignored.invalid;
		counters_.ignored_too_large += ignored.too_large;
		counters_.ignored_beyond += ignored.beyond;
		counters_.ignored_unsigned += ignored.unsigned_;
		counters_.ignored_bad_cert += ignored.bad_cert;
		counters_.ignored_bad_signature += ignored.bad_signature;
		counters_.ignored_replayed += ignored.replayed;
		pending_ignored_.add(ignored);
	}
	warn_ignored(false);
}

void Membership::warn_ignored(bool force)
{
	discovery::Ignored pending;
	{
		std::lock_guard lock(mu_);
		const auto now = Clock::now();
		if (pending_ignored_.total() == 0 || (!force && now - ignored_warned_ < kWarnPeriod))
			return;
		ignored_warned_ = now;
		pending = std::move(pending_ignored_);
		pending_ignored_ = {};
	}
	logger("membership")->warn("etcd: {}: since the last such warning (one a minute at most; "
				   "counted in the status file), {}",
				   discovery::donors_prefix(opts_.registry.prefix), pending.summary());
}

bool Membership::relist(int64_t &revision)
{
	auto listing = discovery::list_donors(opts_.registry);
	if (!listing) {
		logger("membership")->debug("etcd: listing the donors failed: {}", listing.error);
		return false;
	}
	{
		std::lock_guard lock(mu_);
		counters_.listings++;
	}
	note_ignored(listing->ignored);
	set_registered(listing->donors);
	revision = listing->revision;
	return true;
}

void Membership::apply_event(const etcd::WatchEvent &ev, discovery::Ignored &ignored)
{
	const std::string &prefix = opts_.registry.prefix;
	if (ev.type == etcd::WatchEvent::Type::Put) {
		if (auto d = discovery::check_donor(prefix, ev.kv.key, ev.kv.value, ignored,
						    opts_.registry.verifier.get())) {
			registration_put(*d);
			return;
		}
	}
	// A delete, or a put of what is not a registration: the donor the key names (if it
	// names one) is not registered any more.
	if (auto addr = discovery::donor_key_addr(prefix, ev.kv.key))
		registration_gone(*addr);
}

} // namespace rdmaswap
