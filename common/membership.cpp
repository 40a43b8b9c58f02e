// SPDX-License-Identifier: MIT
// Membership: donors added, retired and reconnected while the volume serves.
#include "common/membership.h"

#include <algorithm>

#include "common/etcd.h"
#include "common/log.h"
#include "common/volume.h"

namespace rdmaswap {

// The watcher's etcd client, kept here so that stop() can interrupt its stream.
struct Membership::Watch {
	explicit Watch(const discovery::ListOptions &o)
		: client(etcd::ClientOptions{o.endpoints, std::min(o.timeout,
								   std::chrono::milliseconds(2000)),
					    std::min(o.timeout, std::chrono::milliseconds(1000))})
	{
	}
	etcd::Client client;
};

Membership::Membership(Volume &volume, Connect connect, Options opts,
		       std::span<const std::pair<Endpoint, uint64_t>> start)
	: volume_(volume), connect_(std::move(connect)), opts_(std::move(opts))
{
	// The logger now, not at the first step: its creation allocates, and nbdkit must not
	// allocate once it serves (tests/alloc counts every allocation of the process).
	logger("membership");
	for (const auto &ep : opts_.servers) {
		Entry &e = entries_[ep.str()];
		e.ep = ep;
		e.from_servers = true;
	}
	for (size_t i = 0; i < start.size(); i++) {
		Entry &e = entries_[start[i].first.str()];
		e.ep = start[i].first;
		e.slot = long(i);
		e.boot_id = e.slot_boot = start[i].second;
		e.registered = !e.from_servers; // it came from the registry (or its cache)
	}
	if (!opts_.registry.endpoints.empty())
		watch_ = std::make_unique<Watch>(opts_.registry);
}

Membership::~Membership()
{
	stop();
}

void Membership::set_registered(std::span<const discovery::Donor> donors)
{
	{
		std::lock_guard lock(mu_);
		for (auto &[name, e] : entries_)
			e.registered = false;
		for (const auto &d : donors) {
			Entry &e = entries_[d.addr.str()];
			if (e.ep.host.empty())
				e.ep = d.addr;
			e.registered = true;
			e.boot_id = d.boot_id;
		}
		wake_ = true;
	}
	cv_.notify_all();
}

unsigned Membership::step()
{
	std::lock_guard one(step_mu_);
	auto log = logger("membership");
	// Decide under mu_ (no network), connect without it.
	std::vector<std::pair<std::string, Endpoint>> to_connect;
	{
		std::lock_guard lock(mu_);
		const auto now = Clock::now();
		for (auto &[name, e] : entries_) {
			const bool wanted = e.from_servers || e.registered;
			if (e.slot >= 0) {
				const size_t i = size_t(e.slot);
				if (e.slot_boot == 0)
					e.slot_boot = e.boot_id; // connected before etcd told us its boot id
				if (e.registered && e.boot_id && e.slot_boot && e.boot_id != e.slot_boot) {
					volume_.donor_restarted(i); // its slabs are gone: repair now
					e.slot = -1;
				} else if (!volume_.server(i).session_alive()) {
					log->warn("memserver {}: session lost; its replicas are repaired "
						  "elsewhere{}",
						  name, wanted ? "; it is connected again as a new donor "
								 "once it answers"
							       : "");
					volume_.set_retired(i, true);
					e.slot = -1;
				} else {
					volume_.set_retired(i, !wanted);
				}
			}
			if (e.slot < 0 && wanted && e.retry.may_try(now))
				to_connect.emplace_back(name, e.ep);
		}
	}
	unsigned added = 0;
	for (const auto &[name, ep] : to_connect) {
		{
			std::lock_guard lock(mu_);
			if (stop_)
				break;
		}
		std::string why;
		long slot = -1;
		try {
			slot = long(volume_.add_server(connect_(ep)));
		} catch (const std::exception &e) {
			why = e.what();
		}
		std::lock_guard lock(mu_);
		Entry &e = entries_[name];
		if (slot >= 0) {
			e.slot = slot;
			e.slot_boot = e.boot_id;
			e.retry.succeeded();
			e.warned = false;
			added++;
			if (!(e.from_servers || e.registered)) // vanished while we connected
				volume_.set_retired(size_t(slot), true);
			continue;
		}
		e.retry.failed(Clock::now());
		if (!e.warned)
			log->warn("memserver {} not usable yet (retried every {} s at most): {}", name,
				  kMaxRetry.count() / 1000, why);
		else
			log->debug("memserver {} still not usable: {}", name, why);
		e.warned = true;
	}
	return added;
}

bool Membership::relist()
{
	std::string why;
	auto listing = discovery::list_donors(opts_.registry, why);
	if (!listing) {
		logger("membership")->debug("etcd: listing the donors failed: {}", why);
		return false;
	}
	for (const auto &s : listing->skipped)
		logger("membership")->warn("etcd: skipped {}", s);
	set_registered(listing->donors);
	return true;
}

void Membership::step_loop()
{
	for (;;) {
		{
			std::unique_lock lock(mu_);
			cv_.wait_for(lock, opts_.interval, [this] { return stop_ || wake_; });
			if (stop_)
				return;
			wake_ = false;
		}
		step();
	}
}

void Membership::watch_loop()
{
	auto log = logger("membership");
	const std::string prefix = discovery::donors_prefix(opts_.registry.prefix);
	bool failing = false;
	for (;;) {
		{
			std::lock_guard lock(mu_);
			if (stop_)
				return;
		}
		// Watch from now; once the stream exists, list everything (what changed before the
		// watch began), then relist on every change. A watch that etcd cancels (e.g. one
		// that fell behind a compaction) or that breaks is simply opened again.
		const auto began = Clock::now();
		auto r = watch_->client.watch_prefix(
			prefix, 0,
			[&](const etcd::WatchMessage &m) {
				if (m.created || !m.events.empty())
					relist();
				std::lock_guard lock(mu_);
				return !stop_;
			},
			Clock::now() + opts_.watch_span);
		if (r) {
			if (failing)
				log->info("etcd: watching the donors again");
			failing = false;
			// A watch that ended well before its span was cancelled by etcd (it fell behind
			// a compaction, or etcd refuses it): opened again after a pause, so that one
			// etcd refuses at once is not reopened (and relisted) in a loop.
			if (Clock::now() - began < std::chrono::seconds(1)) {
				log->debug("etcd: the watch of the donors ended early (cancelled by etcd); "
					   "opening it again in 1 s");
				std::unique_lock lock(mu_);
				cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; });
			}
			continue;
		}
		if (!failing)
			log->warn("etcd: cannot watch the donors ({}); the donors known stay in use, "
				  "retrying",
				  r.error);
		failing = true;
		std::unique_lock lock(mu_);
		cv_.wait_for(lock, opts_.interval, [this] { return stop_; });
	}
}

void Membership::start()
{
	step_thread_ = std::thread([this] { step_loop(); });
	if (watch_)
		watch_thread_ = std::thread([this] { watch_loop(); });
}

void Membership::stop()
{
	{
		std::lock_guard lock(mu_);
		stop_ = true;
	}
	cv_.notify_all();
	if (watch_)
		watch_->client.interrupt();
	if (watch_thread_.joinable())
		watch_thread_.join();
	if (step_thread_.joinable())
		step_thread_.join();
}

} // namespace rdmaswap
