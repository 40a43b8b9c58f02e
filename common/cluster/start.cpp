// SPDX-License-Identifier: MIT
// The start: its probes, and its plan (start.h).
#include "common/cluster/start.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <unordered_map>

#include "common/cluster/donor_set.h"
#include "common/obs/log.h"
#include "common/volume/volume.h"

namespace rdmaswap {

namespace {
// The donor set's view of a load: a donor with an eighth of its slabs left counts as full, so
// that a full member's replacement is connected while it still has room (placement falls
// back on it meanwhile: Volume::set_outside).
DonorLoad with_reserve(DonorLoad l)
{
	l.used = std::min(l.total, l.used + l.total / 8);
	return l;
}
} // namespace

// The set's view of a donor (with_reserve applied): a connected one (`srv`) by its own counts,
// another by its hint (none: it looks empty). `alive` as the caller judges it.
DonorLoad donor_set_view(const Server *srv, const DonorLoad &hint, bool alive)
{
	DonorLoad l = hint.total ? hint : DonorLoad{0, 1, true, hint.sessions};
	if (srv) {
		const uint32_t total = srv->info().slabs_total;
		l = DonorLoad{total - std::min(srv->slabs_free(), total), total, true, hint.sessions};
	}
	l.alive = alive;
	return with_reserve(l);
}

StartProbeResult probe_start(const StartProbe &in, const ProbeFn &probe)
{
	StartProbeResult out;
	std::unordered_map<std::string, const discovery::Donor *> registered;
	for (const auto &d : in.registered)
		registered.emplace(d.addr.str(), &d);
	std::set<std::string> recorded, etcd_holders, configured, listed;
	if (in.record)
		for (const auto &ep : *in.record)
			recorded.insert(ep.str());
	for (const auto &ep : in.etcd_holders)
		etcd_holders.insert(ep.str());
	for (const auto &ep : in.configured)
		configured.insert(ep.str());
	for (size_t k = 0; k < in.listed && k < in.known.size(); k++)
		listed.insert(in.known[k].str());
	std::vector<size_t> first, etcd_only, others; // indices into out.candidates
	out.candidates.resize(in.known.size());
	for (size_t k = 0; k < in.known.size(); k++) {
		Membership::Candidate &c = out.candidates[k];
		c.ep = in.known[k];
		const std::string name = c.ep.str();
		const bool local = recorded.count(name) > 0;
		c.may_hold = !in.record || local || etcd_holders.count(name);
		// Counted as missing: the record's donors; without a record every donor listed (a
		// first start, or a lost file: the safe side), but none that etcd's copy of the
		// record alone names.
		c.may_miss = in.record ? local : listed.count(name) > 0;
		if (auto it = registered.find(name); it != registered.end())
			c.hint = DonorLoad{it->second->slabs_total -
						   std::min(it->second->slabs_free, it->second->slabs_total),
					   it->second->slabs_total, true, it->second->sessions};
		if ((c.may_hold && c.may_miss) || configured.count(name))
			first.push_back(k);
		else if (c.may_hold && etcd_only.size() < kMaxEtcdHolders)
			etcd_only.push_back(k);
		else if (c.may_hold)
			c.probed = c.reachable = false; // (beyond kMaxEtcdHolders: not contacted)
		else
			others.push_back(k);
	}
	std::shuffle(others.begin(), others.end(), std::minstd_rand(std::random_device{}()));
	std::vector<ProbeTarget> targets;
	std::vector<size_t> target_of;
	for (size_t k : first) {
		targets.push_back(ProbeTarget{out.candidates[k].ep, std::chrono::milliseconds(0)});
		target_of.push_back(k);
	}
	const auto side_bound = std::min(in.timeout, std::chrono::milliseconds(2000));
	for (size_t k : etcd_only) {
		targets.push_back(ProbeTarget{out.candidates[k].ep, side_bound});
		target_of.push_back(k);
	}
	for (size_t k : others) {
		targets.push_back(ProbeTarget{out.candidates[k].ep, side_bound});
		target_of.push_back(k);
	}
	// Enough: the first ones done, and as many answered as the set holds (every one that
	// answers with spread=0).
	const size_t want = in.spread ? std::max<size_t>(in.spread, in.replicas) : SIZE_MAX;
	const size_t nfirst = first.size() + etcd_only.size();
	auto enough = [&](std::span<const ProbeOutcome> o) {
		size_t ok = 0;
		for (size_t j = 0; j < o.size(); j++) {
			if (j < nfirst && o[j].state == ProbeOutcome::State::NotRun)
				return false;
			ok += o[j].state == ProbeOutcome::State::Ok;
		}
		return ok >= want;
	};
	const auto probe_started = ProbeClock::now();
	const std::vector<ProbeOutcome> outcomes =
		probe_all(targets, probe, probe_started + in.timeout, kStartProbeWorkers,
			  enough);
	for (size_t j = 0; j < targets.size(); j++) {
		Membership::Candidate &c = out.candidates[target_of[j]];
		const ProbeOutcome &o = outcomes[j];
		if (o.state == ProbeOutcome::State::Ok) {
			c.hint = o.load;
			// (spread=0 connects every donor that answered: no more than a volume takes.)
			if (in.spread == 0 && out.reachable.size() >= Volume::kMaxServers) {
				c.probed = c.reachable = false;
				continue;
			}
			out.reachable.push_back(c.ep);
		} else if (o.state == ProbeOutcome::State::NotRun) {
			c.probed = c.reachable = false;
			out.not_probed++;
		} else {
			c.reachable = false;
			out.failed++;
			out.unreachable.emplace_back(c.ep.str(), o.why);
		}
	}
	out.probed = targets.size() - out.not_probed;
	out.took = std::chrono::duration_cast<std::chrono::milliseconds>(ProbeClock::now() -
									  probe_started);
	return out;
}


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
		if (candidates[k].may_hold && candidates[k].reachable && candidates[k].probed)
			try_connect(k);
	// The set: donors that kept slabs for the volume first, then the others contacted; of
	// those not contacted, only the ones that answered a probe now.
	std::vector<DonorLoad> loads(n); // (with_reserve)
	std::vector<size_t> seeds;
	for (size_t k = 0; k < n; k++) {
		const Candidate &c = candidates[k];
		loads[k] = donor_set_view(conn[k].get(), c.hint,
				    conn[k] || (c.reachable && c.probed && !failed[k] && !c.may_hold));
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
	const bool set_full =
		spread > 0 && size_t(std::count(member.begin(), member.end(), true)) >= spread;
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
			if (c.may_miss) {
				plan.missing++; // could not ask it
				plan.record.push_back(c.ep);
			} // (etcd's word alone, never reached: it never makes a chunk lost)
			continue;
		}
		if (!c.may_miss && !conn[k]->reattached()) {
			// Etcd's word alone, and it kept nothing: a fresh member at most.
			if (member[k])
				fresh.push_back(k);
			else
				conn[k].reset();
			continue;
		}
		// Left out of a set that has room: it is full (slabs are lazy: a start needs none),
		// kept outside the set so that a full donor never stops a start (issue 26, S8).
		if (!member[k] && !conn[k]->reattached() && set_full) {
			plan.missing++; // handed back nothing: dropped (it holds nothing of ours now)
			conn[k].reset();
			continue;
		}
		Server *srv = conn[k].get();
		plan.servers.push_back(std::move(conn[k]));
		plan.start.push_back(Start{c.ep, 0, member[k], srv});
		plan.record.push_back(c.ep);
	}
	plan.start_holders = plan.servers.size();
	for (size_t k : fresh) {
		Server *srv = conn[k].get();
		plan.servers.push_back(std::move(conn[k]));
		plan.start.push_back(Start{candidates[k].ep, 0, true, srv});
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

} // namespace rdmaswap
