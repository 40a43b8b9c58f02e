// SPDX-License-Identifier: MIT
// Membership: donors added, retired and reconnected while the volume serves.
#include "common/cluster/membership.h"

#include <algorithm>
#include <cerrno>
#include <stdexcept>

#include <fmt/format.h>

#include "common/cluster/start.h"
#include "common/net/etcd.h"
#include "common/obs/log.h"
#include "common/obs/metrics_text.h"
#include "common/util/err_text.h"
#include "common/volume/volume.h"
#include "common/wire/protocol.h"

namespace rdmaswap {

// The watcher's etcd client, kept here so that stop() can interrupt its stream.
struct Membership::Watch {
	explicit Watch(const discovery::ListOptions &o)
		: client(discovery::client_options(o)) // (with its TLS and credentials)
	{
	}
	etcd::Client client;
};

Membership::Entry *Membership::find(const std::string &name)
{
	auto it = index_.find(name);
	return it == index_.end() ? nullptr : &entries_[it->second];
}

Membership::Entry *Membership::entry(const Endpoint &ep)
{
	std::string name = ep.str();
	if (Entry *e = find(name))
		return e;
	size_t k;
	if (!free_.empty()) {
		k = free_.back();
		free_.pop_back();
	} else if (entries_.size() < kMaxEntries) {
		k = entries_.size();
		entries_.emplace_back(); // (reserved: entries_ never moves)
	} else {
		return nullptr;
	}
	Entry &e = entries_[k];
	e = Entry{};
	e.used = true;
	e.ep = ep;
	e.name = name;
	index_.emplace(std::move(name), k);
	return &e;
}

bool Membership::fresh(Entry &e, const discovery::Donor &d)
{
	if (!opts_.registry.verifier)
		return true;
	if (d.ts < e.reg_ts) {
		counters_.ignored_replayed++;
		pending_ignored_.replayed++;
		pending_ignored_.note(e.name, fmt::format("a registration written at {} ms, older "
							  "than one seen (written at {} ms): a replay",
							  d.ts, e.reg_ts));
		return false;
	}
	e.reg_ts = d.ts;
	return true;
}

void Membership::forget(size_t k)
{
	Entry &e = entries_[k];
	index_.erase(e.name);
	set_.forget(uint16_t(k));
	e = Entry{};
	free_.push_back(k);
	counters_.aged_out++;
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
	free_.reserve(kMaxEntries);
	index_.reserve(kMaxEntries);
	loads_.reserve(kMaxEntries);
	auto must = [&](const Endpoint &ep) -> Entry & {
		Entry *e = entry(ep);
		if (!e) // (server= and the start hold at most 2 x Volume::kMaxServers donors)
			throw std::runtime_error("more than " + std::to_string(kMaxEntries) +
						 " donors at start");
		return *e;
	};
	for (const auto &ep : opts_.servers)
		must(ep).from_servers = true;
	for (size_t i = 0; i < start.size(); i++) {
		Entry &e = must(start[i].ep);
		e.slot = long(i);
		e.server = start[i].server;
		e.boot_id = e.slot_boot = start[i].boot_id;
		// Registered if it came from the registry (or its cache), unless the start's listing
		// says which are (below).
		e.registered = !e.from_servers && opts_.revision == 0;
		e.tried = true;
		const size_t k = size_t(&e - entries_.data());
		if (opts_.spread > 0 && start[i].member)
			set_.seed(uint16_t(k));
		e.joined = opts_.spread == 0 || set_.is_member(uint16_t(k));
		volume_.set_outside(i, !e.joined);
	}
	// The registry as the start listed it, then what the start's probes said.
	for (const auto &d : opts_.registered) {
		Entry *e = entry(d.addr);
		if (!e) {
			counters_.ignored_beyond++;
			continue;
		}
		e->registered = true;
		e->boot_id = d.boot_id;
		e->reg_ts = d.ts;
		e->seq = ++seq_;
		if (e->slot >= 0 && e->slot_boot == 0)
			e->slot_boot = d.boot_id; // (the start gave none)
	}
	const auto now = Clock::now();
	for (const auto &p : opts_.probed) {
		Entry *e = find(p.ep.str());
		if (!e)
			continue; // neither registered nor server=: nothing to keep
		e->tried = true;
		if (p.ok) {
			e->probed_ok = now;
			e->hint = p.load;
			e->hint.alive = true;
		} else {
			e->retry.failed(now);
		}
	}
	counters_.listings = opts_.revision ? 1 : 0;
	counters_.ignored_invalid = opts_.ignored.invalid;
	counters_.ignored_too_large = opts_.ignored.too_large;
	counters_.ignored_beyond += opts_.ignored.beyond;
	counters_.ignored_unsigned = opts_.ignored.unsigned_;
	counters_.ignored_bad_cert = opts_.ignored.bad_cert;
	counters_.ignored_bad_signature = opts_.ignored.bad_signature;
	counters_.ignored_replayed = opts_.ignored.replayed;
	counters_.holders_ignored = opts_.holders_ignored;
	// (Already logged by the start: discovery::discover.)
	ignored_warned_ = now;
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

void Membership::ask_boot(std::span<const size_t> to_ask)
{
	auto log = logger("membership");
	for (size_t k : to_ask) {
		Server *srv;
		uint64_t etcd_boot, boot;
		long slot;
		std::string name;
		{
			std::lock_guard lock(mu_);
			if (stop_)
				return;
			const Entry &e = entries_[k];
			srv = e.server;
			etcd_boot = e.boot_id;
			boot = e.slot_boot;
			slot = e.slot;
			name = e.name;
		}
		if (!srv || slot < 0)
			continue;
		// On the session's own control connection: a call joins the session (a reconnect
		// first if the connection is gone). A donor that restarted has no such session: the
		// first call finds the old connection dead, the second is told the session is
		// unknown (Server::session_alive() turns false).
		proto::StatsReply st;
		int err = srv->stats(st);
		if (err && err != ETIMEDOUT && err != ECANCELED && srv->session_alive())
			err = srv->stats(st);
		std::lock_guard lock(mu_);
		Entry &e = entries_[k];
		if (e.slot != slot)
			continue; // (changed meanwhile)
		if (!srv->session_alive()) {
			log->warn("memserver {}: its session is gone (its registration shows a new boot "
				  "id, {:016x}); its replicas are repaired elsewhere, and it is connected "
				  "again as a new donor once it answers",
				  name, etcd_boot);
			volume_.donor_restarted(size_t(slot));
			e.slot = -1;
			e.server = nullptr;
			e.joined = false;
			continue;
		}
		if (err) {
			e.ask_retry.failed(Clock::now());
			log->debug("memserver {}: cannot ask it about the new boot id {:016x} in etcd: "
				   "{} (asked again later)",
				   name, etcd_boot, err_text(err));
			continue;
		}
		e.ask_retry.succeeded();
		e.disbelieved = etcd_boot;
		counters_.boot_id_disbelieved++;
		uint64_t suppressed = 0;
		if (boot_log_.allow(suppressed))
			log->warn("etcd says memserver {} restarted (boot id {:016x}, connected as "
				  "{:016x}), but the memserver still holds this volume's session: the "
				  "registration is not believed{}",
				  name, etcd_boot, boot,
				  suppressed ? fmt::format(" ({} more such lines suppressed)", suppressed)
					     : std::string());
	}
}

bool Membership::probe_entries(std::span<const size_t> to_probe)
{
	std::vector<ProbeTarget> targets;
	{
		std::lock_guard lock(mu_);
		for (size_t k : to_probe)
			targets.push_back(ProbeTarget{entries_[k].ep, kProbeBound});
	}
	const auto deadline = Clock::now() + opts_.timeout;
	const auto out = probe_all(targets, opts_.probe, deadline, kProbeWorkers);
	bool any = false;
	std::lock_guard lock(mu_);
	const auto now = Clock::now();
	for (size_t j = 0; j < to_probe.size(); j++) {
		Entry &e = entries_[to_probe[j]];
		if (!e.used || e.name != targets[j].ep.str())
			continue; // (forgotten meanwhile: cannot be, only step() forgets)
		switch (out[j].state) {
		case ProbeOutcome::State::Ok:
			e.tried = true;
			e.probed_ok = now;
			e.hint = out[j].load;
			e.hint.alive = true;
			e.retry.succeeded();
			counters_.probes_ok++;
			any = true;
			break;
		case ProbeOutcome::State::Failed:
			e.tried = true;
			e.retry.failed(now);
			counters_.probes_failed++;
			logger("membership")->debug("memserver {} did not answer a probe: {}", e.name,
						    out[j].why);
			break;
		case ProbeOutcome::State::NotRun:
			break;
		}
	}
	return any;
}

unsigned Membership::step()
{
	std::lock_guard one(step_mu_);
	if (opts_.fault)
		opts_.fault();
	auto log = logger("membership");
	// Decide under mu_ (no network), ask, probe, record and connect without it.
	std::vector<size_t> to_connect;
	std::vector<size_t> to_close;           // idle for opts_.idle: disconnected
	std::vector<size_t> to_ask;             // a new boot id in etcd: ask the donor
	std::vector<size_t> to_probe;           // registered, wanted, not probed lately
	std::vector<Endpoint> record_eps;       // the new record, if it changes
	std::vector<std::string> record_names;  // the same, as recorded_ keeps it
	std::vector<std::string> added_names;   // of them, those not recorded before (sorted)
	{
		std::lock_guard lock(mu_);
		const auto now = Clock::now();
		last_step_ = now;
		loads_.resize(entries_.size());
		// Whether an entry is eligible for the set without a probe first: connected, a
		// server= entry, or probed lately (or no probe is configured).
		auto probed = [&](const Entry &e) {
			return !opts_.probe || e.from_servers ||
			       (e.probed_ok != Clock::time_point{} && now - e.probed_ok < kProbeFresh);
		};
		for (size_t k = 0; k < entries_.size(); k++) {
			Entry &e = entries_[k];
			if (!e.used) {
				loads_[k] = DonorLoad{0, 1, false, 0};
				continue;
			}
			const bool wanted = e.from_servers || e.registered;
			if (e.slot >= 0) {
				const size_t i = size_t(e.slot);
				if (e.slot_boot == 0)
					e.slot_boot = e.boot_id; // connected before etcd told us its boot id
				if (!volume_.server(i).session_alive()) {
					log->warn("memserver {}: session lost; its replicas are repaired "
						  "elsewhere{}",
						  e.name, wanted ? "; it is connected again as a new donor "
								   "once it answers"
								 : "");
					volume_.set_retired(i, true);
					e.slot = -1;
					e.server = nullptr;
					e.joined = false;
				} else {
					if (e.registered && e.boot_id && e.slot_boot && e.boot_id != e.slot_boot &&
					    e.boot_id != e.disbelieved && e.server && e.ask_retry.may_try(now))
						to_ask.push_back(k);
					volume_.set_retired(i, !wanted);
				}
			}
			// Forgotten once neither wanted nor connected for kAgeOut.
			if (wanted || e.slot >= 0) {
				e.unwanted_since = {};
			} else if (e.unwanted_since == Clock::time_point{}) {
				e.unwanted_since = now;
			} else if (now - e.unwanted_since >= opts_.age_out) {
				forget(k);
				loads_[k] = DonorLoad{0, 1, false, 0};
				continue;
			}
			// The set's view: a connected donor by its own counts, another by its last
			// probe's (none: it looks empty); one not probed lately, or waiting out a
			// retry pause, is not usable.
			const bool connected = e.slot >= 0;
			loads_[k] = donor_set_view(connected ? &volume_.server(size_t(e.slot)) : nullptr, e.hint,
					     wanted && (connected || (probed(e) && e.retry.may_try(now))));
		}
		if (opts_.spread > 0)
			set_.refill(loads_, rng_);
		// Indices are never reused: idle donors are closed (and added anew when wanted
		// again) only while a quarter of them is left.
		const bool may_close = opts_.idle.count() > 0 &&
				       volume_.servers() < volume_.max_servers() / 4 * 3;
		bool short_of_donors = opts_.spread > 0 && set_.members().size() < set_.capacity();
		for (size_t k = 0; k < entries_.size(); k++) {
			Entry &e = entries_[k];
			if (!e.used)
				continue;
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
			} else if (member && wanted && e.retry.may_try(now)) {
				if (probed(e))
					to_connect.push_back(k);
				else
					short_of_donors = true; // (spread 0: probed first)
			}
		}
		// Too few donors to choose from: probe some (never-tried ones first, the newest
		// registration first; then the others whose pause is over, the oldest first).
		if (short_of_donors && opts_.probe) {
			std::vector<size_t> cands;
			for (size_t k = 0; k < entries_.size(); k++) {
				const Entry &e = entries_[k];
				if (e.used && e.registered && !e.from_servers && e.slot < 0 && !probed(e) &&
				    e.retry.may_try(now))
					cands.push_back(k);
			}
			const size_t n = std::min(cands.size(), kProbeBatch);
			std::partial_sort(cands.begin(), cands.begin() + long(n), cands.end(),
					  [&](size_t a, size_t b) {
						  const Entry &x = entries_[a], &y = entries_[b];
						  if (x.tried != y.tried)
							  return !x.tried;
						  return x.tried ? x.retry.next() < y.retry.next()
								 : x.seq > y.seq;
					  });
			to_probe.assign(cands.begin(), cands.begin() + long(n));
		}
		// The record first: a donor is connected only once the record names it.
		if (!to_connect.empty() && opts_.record) {
			std::vector<std::string> names = recorded_;
			for (size_t k : to_connect) {
				names.push_back(entries_[k].name);
				if (!std::binary_search(recorded_.begin(), recorded_.end(), entries_[k].name))
					added_names.push_back(entries_[k].name);
			}
			std::sort(names.begin(), names.end());
			names.erase(std::unique(names.begin(), names.end()), names.end());
			std::sort(added_names.begin(), added_names.end());
			if (names != recorded_) {
				// By name (the order the record keeps); a donor recorded and not known
				// now (gone, or not registered this run) is kept by its recorded name.
				for (const auto &n : names) {
					if (const Entry *x = find(n))
						record_eps.push_back(x->ep);
					else if (auto ep = parse_endpoint(n, 0))
						record_eps.push_back(*ep);
				}
				record_names = std::move(names);
			}
		}
	}
	if (!to_ask.empty())
		ask_boot(to_ask);
	if (!to_probe.empty() && probe_entries(to_probe)) {
		std::lock_guard lock(mu_);
		wake_ = true; // (the next step may choose the donors that answered)
	}
	// Written with no lock the data path may take (wake() takes mu_): a file with fsync, and
	// etcd's copy, each bounded by the timeout. recorded_ changes only here (step_mu_).
	if (!record_eps.empty()) {
		const auto stored = opts_.record(record_eps);
		const std::string &why = stored.error;
		std::lock_guard lock(mu_);
		if (!stored) {
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
	std::vector<std::string> unreached; // recorded by this step, and the connect failed
	for (size_t k : to_connect) {
		Endpoint ep;
		std::string name;
		{
			std::lock_guard lock(mu_);
			if (stop_)
				break;
			ep = entries_[k].ep; // (entries_ never moves: reserved)
			name = entries_[k].name;
		}
		std::string why;
		long slot = -1;
		Server *raw = nullptr;
		try {
			std::unique_ptr<Server> srv = connect_(ep);
			raw = srv.get();
			slot = long(volume_.add_server(std::move(srv)));
		} catch (const std::exception &e) {
			why = e.what();
		}
		std::lock_guard lock(mu_);
		Entry &e = entries_[k];
		e.tried = true;
		if (slot >= 0) {
			e.slot = slot;
			e.server = raw;
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
		e.probed_ok = {}; // (probed again before the next try)
		if (std::binary_search(added_names.begin(), added_names.end(), name))
			unreached.push_back(name);
		uint64_t suppressed = 0;
		if (!e.warned && connect_log_.allow(suppressed))
			log->warn("memserver {} not usable yet (retried every {} s at most): {}{}", name,
				  kMaxRetry.count() / 1000, why,
				  suppressed ? fmt::format(" ({} more such lines suppressed)", suppressed)
					     : std::string());
		else
			log->debug("memserver {} still not usable: {}", name, why);
		e.warned = true;
	}
	if (!unreached.empty())
		unrecord(unreached);
	if (!to_close.empty())
		close_idle(to_close);
	volume_.donors_changed(); // allocations waiting for a donor try again
	return added;
}

void Membership::recorded_without(std::span<const std::string> out,
				  std::vector<std::string> &names, std::vector<Endpoint> &eps)
{
	std::lock_guard lock(mu_);
	for (const auto &n : recorded_) {
		if (std::find(out.begin(), out.end(), n) != out.end())
			continue;
		names.push_back(n);
		if (const Entry *x = find(n))
			eps.push_back(x->ep);
		else if (auto ep = parse_endpoint(n, 0))
			eps.push_back(*ep);
	}
}

void Membership::unrecord(std::span<const std::string> gone)
{
	std::vector<std::string> names;
	std::vector<Endpoint> eps;
	recorded_without(gone, names, eps);
	// (Never reached: it holds nothing of the volume. If this fails, the record names it
	// until a later write: a start counts it as missing then, never loses data by it.)
	if (const auto stored = opts_.record(eps); !stored) {
		logger("membership")->debug("cannot take {} unreachable donor(s) out of the holders "
					    "record: {}",
					    gone.size(), stored.error);
		return;
	}
	std::lock_guard lock(mu_);
	recorded_ = std::move(names);
}

void Membership::close_idle(std::span<const size_t> to_close)
{
	std::vector<std::string> closed; // names
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
		e.server = nullptr;
		e.joined = false;
		e.idle_since = {};
		closed.push_back(e.name);
	}
	if (closed.empty() || !opts_.record)
		return;
	// The record without them: they hold nothing of the volume and get nothing more (a
	// donor wanted again is recorded before it is connected).
	std::vector<std::string> names;
	std::vector<Endpoint> eps;
	recorded_without(closed, names, eps);
	if (names == recorded_)
		return;
	if (const auto stored = opts_.record(eps); !stored) {
		logger("membership")->warn("cannot record the volume's holders without the {} idle "
					   "donor(s) disconnected ({}); the record still names them",
					   closed.size(), stored.error);
		return;
	}
	std::lock_guard lock(mu_);
	recorded_ = std::move(names);
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
			// Debounced: a burst of registry changes (or of need-donor calls) is one step.
			cv_.wait_until(lock, last_step_ + kDebounce, [this] { return stop_; });
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
	// The revision the table shows the registry at: the watch goes on from the next one. 0:
	// list first (no listing yet, or events were lost: compacted away, or a message too
	// large to read).
	int64_t revision = opts_.revision;
	Clock::time_point listed{}; // the last listing of this loop
	for (;;) {
		{
			std::lock_guard lock(mu_);
			if (stop_)
				return;
		}
		if (revision == 0) {
			// At most one listing per kRelistSpacing, whatever etcd does.
			if (listed != Clock::time_point{}) {
				std::unique_lock lock(mu_);
				if (cv_.wait_until(lock, listed + kRelistSpacing, [this] { return stop_; }))
					return;
			}
			listed = Clock::now();
			if (!relist(revision)) {
				if (!failing)
					log->warn("etcd: cannot list the donors; the donors known stay in use, "
						  "retrying");
				failing = true;
				continue; // (spaced by kRelistSpacing)
			}
		}
		// Each event's key and value by itself; the steps they wake are debounced.
		const auto began = Clock::now();
		bool lost_events = false;
		auto r = watch_->client.watch_prefix(
			prefix, revision + 1,
			[&](const etcd::WatchMessage &m) {
				if (m.canceled && m.compact_revision) {
					lost_events = true; // compacted away: list again
					return false;
				}
				discovery::Ignored ignored;
				for (const auto &ev : m.events) {
					apply_event(ev, ignored);
					revision = std::max(revision, ev.kv.mod_revision);
				}
				note_ignored(ignored);
				std::lock_guard lock(mu_);
				return !stop_;
			},
			Clock::now() + opts_.watch_span, discovery::kPageBytes);
		warn_ignored(false); // (what a quiet minute left pending)
		if (lost_events || (!r && r.code == etcd::kTooLarge)) {
			log->debug("etcd: the watch of the donors lost events ({}); listing again",
				   lost_events ? "compacted" : r.error);
			revision = 0;
			continue;
		}
		if (r) {
			if (failing)
				log->info("etcd: watching the donors again");
			failing = false;
			// A watch that ended well before its span was cancelled by etcd (or it
			// refuses it): opened again after a pause, so that one etcd refuses at once is
			// not reopened in a loop.
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
