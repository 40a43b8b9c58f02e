// SPDX-License-Identifier: MIT
// Membership: donors added, retired and reconnected while the volume serves.
#include "common/membership.h"

#include <algorithm>
#include <stdexcept>

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

namespace {
// The donor set's view of a load: a donor with an eighth of its slabs left counts as full, so
// that a full member's replacement is connected while it still has room (placement falls
// back on it meanwhile: Volume::set_outside).
DonorLoad with_reserve(DonorLoad l)
{
	l.used = std::min(l.total, l.used + l.total / 8);
	return l;
}

// The set's view of a donor (with_reserve applied): a connected one (`srv`) by its own counts,
// another by its hint (none: it looks empty). `alive` as the caller judges it.
DonorLoad set_view(const Server *srv, const DonorLoad &hint, bool alive)
{
	DonorLoad l = hint.total ? hint : DonorLoad{0, 1, true, hint.sessions};
	if (srv) {
		const uint32_t total = srv->info().slabs_total;
		l = DonorLoad{total - std::min(srv->slabs_free(), total), total, true, hint.sessions};
	}
	l.alive = alive;
	return with_reserve(l);
}
} // namespace

std::vector<size_t> Membership::choose_start_members(unsigned spread,
						      std::span<const DonorLoad> loads,
						      std::span<const size_t> seeds)
{
	DonorSet set(spread, loads.size());
	for (size_t i : seeds)
		if (i < loads.size() && loads[i].alive && loads[i].used < loads[i].total)
			set.seed(uint16_t(i));
	std::minstd_rand rng(std::random_device{}());
	set.refill(loads, rng);
	std::vector<size_t> out(set.members().begin(), set.members().end());
	std::sort(out.begin(), out.end());
	return out;
}

Membership::StartPlan Membership::plan_start(unsigned spread,
					     std::span<const Candidate> candidates,
					     const Connect &connect)
{
	auto log = logger("membership");
	const size_t n = candidates.size();
	std::vector<std::unique_ptr<Server>> conn(n);
	std::vector<bool> failed(n, false);
	std::vector<std::pair<std::string, std::string>> failures; // logged as one line at the end
	StartPlan plan;
	auto try_connect = [&](size_t k) {
		try {
			conn[k] = connect(candidates[k].ep);
		} catch (const std::exception &e) {
			failures.emplace_back(e.what(), "");
			failed[k] = true;
		}
	};
	for (size_t k = 0; k < n; k++)
		if (candidates[k].may_hold && candidates[k].reachable)
			try_connect(k);
	// The set: donors that kept slabs for the volume first, then the others contacted.
	std::vector<DonorLoad> loads(n); // (with_reserve)
	std::vector<size_t> seeds;
	for (size_t k = 0; k < n; k++) {
		const Candidate &c = candidates[k];
		loads[k] = set_view(conn[k].get(), c.hint,
				    conn[k] || (c.reachable && !failed[k] && !c.may_hold));
		if (conn[k] && conn[k]->reattached())
			seeds.push_back(k);
	}
	for (size_t k = 0; k < n; k++)
		if (conn[k] && !conn[k]->reattached())
			seeds.push_back(k);
	std::vector<bool> member(n, false);
	if (spread == 0) {
		for (size_t k = 0; k < n; k++)
			member[k] = conn[k] != nullptr;
	} else {
		for (size_t k : choose_start_members(spread, loads, seeds))
			member[k] = true;
	}
	std::vector<size_t> fresh;
	for (size_t k = 0; k < n; k++) {
		if (!member[k] || conn[k])
			continue;
		try_connect(k);
		if (conn[k])
			fresh.push_back(k);
	}
	for (size_t k = 0; k < n; k++) {
		const Candidate &c = candidates[k];
		if (!c.may_hold)
			continue;
		if (!conn[k]) {
			plan.missing++; // could not ask it
			plan.record.push_back(c.ep);
			continue;
		}
		if (!member[k] && !conn[k]->reattached()) {
			plan.missing++; // handed back nothing: dropped (it holds nothing of ours now)
			conn[k].reset();
			continue;
		}
		plan.servers.push_back(std::move(conn[k]));
		plan.start.push_back(Start{c.ep, 0, member[k]});
		plan.record.push_back(c.ep);
	}
	plan.start_holders = plan.servers.size();
	for (size_t k : fresh) {
		plan.servers.push_back(std::move(conn[k]));
		plan.start.push_back(Start{candidates[k].ep, 0, true});
		plan.record.push_back(candidates[k].ep);
	}
	std::sort(plan.record.begin(), plan.record.end(),
		  [](const Endpoint &a, const Endpoint &b) { return a.str() < b.str(); });
	if (failures.size() == 1)
		log->warn("{}", failures[0].first);
	else if (!failures.empty())
		log->warn("{} memservers could not be used at start: {}", failures.size(),
			  log_summary(failures));
	return plan;
}

Membership::Entry &Membership::entry(const Endpoint &ep)
{
	const std::string name = ep.str();
	if (auto it = index_.find(name); it != index_.end())
		return entries_[it->second];
	if (entries_.size() >= kMaxEntries)
		throw std::runtime_error("more than " + std::to_string(kMaxEntries) +
					 " donors known: " + name + " is not used");
	index_.emplace(name, entries_.size());
	Entry &e = entries_.emplace_back();
	e.ep = ep;
	return e;
}

Membership::Membership(Volume &volume, Connect connect, Options opts,
		       std::span<const Start> start)
	: volume_(volume), connect_(std::move(connect)), opts_(std::move(opts)),
	  set_(opts_.spread, kMaxEntries), rng_(std::random_device{}())
{
	// The logger now, not at the first step: its creation allocates, and nbdkit must not
	// allocate once it serves (tests/alloc counts every allocation of the process).
	logger("membership");
	entries_.reserve(kMaxEntries);
	loads_.reserve(kMaxEntries);
	for (const auto &ep : opts_.servers)
		entry(ep).from_servers = true;
	for (const auto &[ep, load] : opts_.hints)
		entry(ep).hint = load;
	for (size_t i = 0; i < start.size(); i++) {
		Entry &e = entry(start[i].ep);
		e.slot = long(i);
		e.boot_id = e.slot_boot = start[i].boot_id;
		e.registered = !e.from_servers; // it came from the registry (or its cache)
		const size_t k = size_t(&e - entries_.data());
		if (opts_.spread > 0 && start[i].member)
			set_.seed(uint16_t(k));
		e.joined = opts_.spread == 0 || set_.is_member(uint16_t(k));
		volume_.set_outside(i, !e.joined);
	}
	for (const auto &ep : opts_.recorded)
		recorded_.push_back(ep.str());
	std::sort(recorded_.begin(), recorded_.end());
	if (!opts_.registry.endpoints.empty())
		watch_ = std::make_unique<Watch>(opts_.registry);
	hook_.fn = [](void *m) { static_cast<Membership *>(m)->wake(); };
	hook_.arg = this;
	volume_.set_need_donor_hook(&hook_);
}

Membership::~Membership()
{
	stop();
}

void Membership::wake()
{
	{
		std::lock_guard lock(mu_);
		wake_ = true;
	}
	cv_.notify_all();
}

void Membership::set_registered(std::span<const discovery::Donor> donors)
{
	{
		std::lock_guard lock(mu_);
		for (auto &e : entries_)
			e.registered = false;
		for (const auto &d : donors) {
			Entry *e;
			try {
				e = &entry(d.addr);
			} catch (const std::exception &x) {
				if (!full_warned_)
					logger("membership")->warn("{}", x.what());
				full_warned_ = true;
				continue;
			}
			e->registered = true;
			e->boot_id = d.boot_id;
			e->hint = DonorLoad{d.slabs_total - std::min(d.slabs_free, d.slabs_total),
					    d.slabs_total, true, d.sessions};
		}
		wake_ = true;
	}
	cv_.notify_all();
}

unsigned Membership::step()
{
	std::lock_guard one(step_mu_);
	if (opts_.fault)
		opts_.fault();
	auto log = logger("membership");
	// Decide under mu_ (no network), record and connect without it.
	std::vector<size_t> to_connect;
	std::vector<size_t> to_close;           // idle for opts_.idle: disconnected
	std::vector<Endpoint> record_eps;       // the new record, if it changes
	std::vector<std::string> record_names;  // the same, as recorded_ keeps it
	{
		std::lock_guard lock(mu_);
		const auto now = Clock::now();
		loads_.resize(entries_.size());
		for (size_t k = 0; k < entries_.size(); k++) {
			Entry &e = entries_[k];
			const bool wanted = e.from_servers || e.registered;
			if (e.slot >= 0) {
				const size_t i = size_t(e.slot);
				if (e.slot_boot == 0)
					e.slot_boot = e.boot_id; // connected before etcd told us its boot id
				if (e.registered && e.boot_id && e.slot_boot && e.boot_id != e.slot_boot) {
					volume_.donor_restarted(i); // its slabs are gone: repair now
					e.slot = -1;
					e.joined = false;
				} else if (!volume_.server(i).session_alive()) {
					log->warn("memserver {}: session lost; its replicas are repaired "
						  "elsewhere{}",
						  e.ep.str(), wanted ? "; it is connected again as a new donor "
								     "once it answers"
								   : "");
					volume_.set_retired(i, true);
					e.slot = -1;
					e.joined = false;
				} else {
					volume_.set_retired(i, !wanted);
				}
			}
			// The set's view: a connected donor by its own counts, another by its hint
			// (none: it looks empty); one waiting out a retry pause is not usable.
			const bool connected = e.slot >= 0;
			loads_[k] = set_view(connected ? &volume_.server(size_t(e.slot)) : nullptr, e.hint,
					     wanted && (connected || e.retry.may_try(now)));
		}
		if (opts_.spread > 0)
			set_.refill(loads_, rng_);
		// Indices are never reused: idle donors are closed (and added anew when wanted
		// again) only while a quarter of them is left.
		const bool may_close = opts_.idle.count() > 0 &&
				       volume_.servers() < volume_.max_servers() / 4 * 3;
		for (size_t k = 0; k < entries_.size(); k++) {
			Entry &e = entries_[k];
			const bool wanted = e.from_servers || e.registered;
			const bool member = opts_.spread == 0 ? wanted : set_.is_member(uint16_t(k));
			if (e.slot >= 0) {
				e.joined = e.joined || member;
				volume_.set_outside(size_t(e.slot), !e.joined);
				if (member || volume_.holds(size_t(e.slot)) != 0)
					e.idle_since = {};
				else if (e.idle_since == Clock::time_point{})
					e.idle_since = now;
				else if (may_close && now - e.idle_since >= opts_.idle)
					to_close.push_back(k);
			} else if (member && wanted && e.retry.may_try(now))
				to_connect.push_back(k);
		}
		// The record first: a donor is connected only once the record names it.
		if (!to_connect.empty() && opts_.record) {
			std::vector<std::string> names = recorded_;
			for (size_t k : to_connect)
				names.push_back(entries_[k].ep.str());
			std::sort(names.begin(), names.end());
			names.erase(std::unique(names.begin(), names.end()), names.end());
			if (names != recorded_) {
				// By name (the order the record keeps); a donor recorded and not known
				// now (gone, or not registered this run) is kept by its recorded name.
				for (const auto &n : names) {
					if (auto it = index_.find(n); it != index_.end())
						record_eps.push_back(entries_[it->second].ep);
					else if (auto ep = parse_endpoint(n, 0))
						record_eps.push_back(*ep);
				}
				record_names = std::move(names);
			}
		}
	}
	// Written with no lock the data path may take (wake() takes mu_): a file with fsync, and
	// etcd's copy, each bounded by the timeout. recorded_ changes only here (step_mu_).
	if (!record_eps.empty()) {
		const std::string why = opts_.record(record_eps);
		std::lock_guard lock(mu_);
		if (!why.empty()) {
			log->warn("cannot record the volume's holders ({}): {} donor(s) not connected "
				  "now, retried",
				  why, to_connect.size());
			for (size_t k : to_connect)
				entries_[k].retry.failed(Clock::now());
			to_connect.clear();
		} else {
			recorded_ = std::move(record_names);
		}
	}
	unsigned added = 0;
	for (size_t k : to_connect) {
		Endpoint ep;
		{
			std::lock_guard lock(mu_);
			if (stop_)
				break;
			ep = entries_[k].ep; // (entries_ never moves: reserved)
		}
		const std::string name = ep.str();
		std::string why;
		long slot = -1;
		try {
			slot = long(volume_.add_server(connect_(ep)));
		} catch (const std::exception &e) {
			why = e.what();
		}
		std::lock_guard lock(mu_);
		Entry &e = entries_[k];
		if (slot >= 0) {
			e.slot = slot;
			e.slot_boot = e.boot_id;
			e.retry.succeeded();
			e.warned = false;
			added++;
			if (!(e.from_servers || e.registered)) // vanished while we connected
				volume_.set_retired(size_t(slot), true);
			e.joined = opts_.spread == 0 || set_.is_member(uint16_t(k));
			volume_.set_outside(size_t(slot), !e.joined);
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
	if (!to_close.empty())
		close_idle(to_close);
	volume_.donors_changed(); // allocations waiting for a donor try again
	return added;
}

void Membership::close_idle(std::span<const size_t> to_close)
{
	std::vector<std::string> closed; // names, sorted
	for (size_t k : to_close) {
		long slot;
		{
			std::lock_guard lock(mu_);
			if (stop_)
				break;
			slot = entries_[k].slot;
		}
		// (No lock: it may wait for a control call in progress on that donor.)
		const bool done = slot >= 0 && volume_.close_idle_server(size_t(slot));
		std::lock_guard lock(mu_);
		Entry &e = entries_[k];
		if (!done) { // it got a slab meanwhile, or holds a floor: asked again in a while
			e.idle_since = Clock::now();
			continue;
		}
		e.slot = -1;
		e.joined = false;
		e.idle_since = {};
		closed.push_back(e.ep.str());
	}
	if (closed.empty() || !opts_.record)
		return;
	// The record without them: they hold nothing of the volume and get nothing more (a
	// donor wanted again is recorded before it is connected).
	std::sort(closed.begin(), closed.end());
	std::vector<std::string> names;
	std::vector<Endpoint> eps;
	{
		std::lock_guard lock(mu_);
		for (const auto &n : recorded_) {
			if (std::binary_search(closed.begin(), closed.end(), n))
				continue;
			names.push_back(n);
			if (auto it = index_.find(n); it != index_.end())
				eps.push_back(entries_[it->second].ep);
			else if (auto ep = parse_endpoint(n, 0))
				eps.push_back(*ep);
		}
	}
	if (names == recorded_)
		return;
	if (const std::string why = opts_.record(eps); !why.empty()) {
		logger("membership")->warn("cannot record the volume's holders without the {} idle "
					   "donor(s) disconnected ({}); the record still names them",
					   closed.size(), why);
		return;
	}
	std::lock_guard lock(mu_);
	recorded_ = std::move(names);
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

void Membership::loop_failed(const char *loop, const char *why, bool &failing)
{
	auto log = logger("membership");
	if (!failing)
		log->error("{} failed: {} (a bug: the donors known stay in use; tried again every "
			   "{} ms)",
			   loop, why, opts_.interval.count());
	else
		log->debug("{} failed again: {}", loop, why);
	failing = true;
}

void Membership::step_loop()
{
	bool failing = false; // the last step threw
	for (;;) {
		{
			std::unique_lock lock(mu_);
			cv_.wait_for(lock, opts_.interval, [this] { return stop_ || wake_; });
			if (stop_)
				return;
			wake_ = false;
		}
		// The thread's exception boundary: nothing it throws may reach std::terminate (it
		// would abort nbdkit). The next step starts from the entries as this one left them.
		try {
			step();
			if (failing)
				logger("membership")->info("a step succeeded again");
			failing = false;
		} catch (const std::exception &e) {
			loop_failed("a membership step", e.what(), failing);
		} catch (...) {
			loop_failed("a membership step", "unknown exception", failing);
		}
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
		{
			std::lock_guard lock(mu_);
			if (stop_)
				return; // interrupted by stop(): not a failure of etcd
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
	if (!watch_)
		return;
	// The watcher's exception boundary: a watch that throws is opened again after the
	// interval (a stop() meanwhile ends the thread).
	watch_thread_ = std::thread([this] {
		bool failing = false;
		for (;;) {
			std::string why;
			try {
				watch_loop();
				return; // stopped
			} catch (const std::exception &e) {
				why = e.what();
			} catch (...) {
				why = "unknown exception";
			}
			loop_failed("the etcd watch", why.c_str(), failing);
			std::unique_lock lock(mu_);
			if (cv_.wait_for(lock, opts_.interval, [this] { return stop_; }))
				return;
		}
	});
}

void Membership::stop()
{
	volume_.set_need_donor_hook(nullptr); // (the volume outlives us)
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
