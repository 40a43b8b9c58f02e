// SPDX-License-Identifier: MIT
// The start's probes (start.h).
#include "common/cluster/start.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <unordered_map>

#include "common/volume/volume.h"

namespace rdmaswap {

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

} // namespace rdmaswap
