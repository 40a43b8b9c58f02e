// SPDX-License-Identifier: MIT
// Reattach planning: default volume id and the choice of trusted replicas.
#include "common/volume/reattach.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "common/util/hash.h"

namespace rdmaswap {

std::string default_volume_name(const std::string &host, uint64_t size,
				std::span<const Endpoint> servers,
				std::optional<std::string_view> etcd_prefix)
{
	std::string h = host.substr(0, 32);
	for (char &c : h)
		if (c < 0x21 || c > 0x7e)
			c = '_';
	if (h.empty())
		h = "localhost";
	std::vector<std::string> names;
	for (const auto &ep : servers)
		names.push_back(ep.str());
	if (etcd_prefix)
		names.push_back("etcd:" + std::string(*etcd_prefix));
	std::sort(names.begin(), names.end());
	uint64_t fnv = kFnv1aBasis;
	for (size_t i = 0; i < names.size(); i++)
		fnv = fnv1a64((i ? "," : "") + names[i], fnv);
	char hash[9];
	std::snprintf(hash, sizeof hash, "%08x", unsigned(fnv ^ (fnv >> 32)));
	return h + "-" + std::to_string(size) + "-" + hash;
}

ReattachPlan plan_reattach(const ReattachInput &in)
{
	ReattachPlan plan;
	std::map<uint64_t, uint64_t> floor;
	for (const auto &f : in.floors)
		if (f.chunk < in.nchunks && f.epoch > 0)
			floor[f.chunk] = std::max(floor[f.chunk], f.epoch);
	std::map<uint64_t, std::vector<size_t>> by_chunk;
	for (size_t i = 0; i < in.slabs.size(); i++) {
		const FoundSlab &s = in.slabs[i];
		if (s.chunk >= in.nchunks) {
			plan.out_of_range++;
			plan.discard.push_back(i);
		} else if (s.epoch == 0) {
			plan.incomplete++;
			plan.discard.push_back(i);
		} else {
			by_chunk[s.chunk].push_back(i);
		}
	}
	for (auto &[chunk, idx] : by_chunk) {
		uint64_t top = 0;
		for (size_t i : idx)
			top = std::max(top, in.slabs[i].epoch);
		const auto f = floor.find(chunk);
		const bool lost = f != floor.end() && f->second > top;
		ReattachPlan::Chunk c{chunk, lost ? 0 : top, {}};
		for (size_t i : idx) {
			const FoundSlab &s = in.slabs[i];
			bool use = !lost && s.epoch == top && c.use.size() < in.max_replicas;
			for (size_t j : c.use)
				use = use && in.slabs[j].server != s.server;
			if (use) {
				c.use.push_back(i);
				continue;
			}
			plan.stale += s.epoch < top || lost;
			plan.discard.push_back(i);
		}
		if (lost)
			plan.lost.push_back(chunk);
		else
			plan.chunks.push_back(std::move(c));
	}
	for (const auto &[chunk, epoch] : floor)
		if (!by_chunk.count(chunk))
			plan.lost.push_back(chunk);
	std::sort(plan.lost.begin(), plan.lost.end());
	plan.all_empty_lost = in.missing >= std::max(1u, in.replicas);
	std::sort(plan.discard.begin(), plan.discard.end());
	return plan;
}

} // namespace rdmaswap
