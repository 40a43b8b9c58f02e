// SPDX-License-Identifier: MIT
// Which donors a volume's start contacts, in two steps, both here. probe_start, before nbdkit
// forks: which of the donors known (server=, etcd's listing or the donor cache, the holders
// record, etcd's copy of it) answer a probe, in what order they are probed and when enough have
// answered. Membership::plan_start (declared in membership.h with the types it shares with the
// membership thread; defined in start.cpp), after the fork: which of those answering are
// connected, which form the donor set, which count as missing. Control path only.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/cluster/discovery.h"
#include "common/cluster/membership.h"
#include "common/cluster/probe.h"

namespace rdmaswap {

// Probes at start run this many at once (probe.h: threads of 256 KiB stacks, for the start).
inline constexpr unsigned kStartProbeWorkers = 32;
// Donors that etcd's copy of the holders record alone names: contacted at start, this many at
// most (the record keeps the donor set's and 32 more: holders.h).
inline constexpr size_t kMaxEtcdHolders = 64;

struct StartProbe {
	// Every donor known: the first `listed` from server= and etcd's listing (or its cache),
	// then those only the holders record or etcd's copy of it name.
	std::span<const Endpoint> known;
	size_t listed = 0;
	// The local holders record (null: none, a first start or a lost file: every donor may
	// hold slabs of the volume).
	const std::vector<Endpoint> *record = nullptr;
	std::span<const Endpoint> etcd_holders;        // etcd's copy of the record names them
	std::span<const Endpoint> configured;          // server= entries
	std::span<const discovery::Donor> registered;  // etcd's hints
	unsigned spread = 0, replicas = 1;
	std::chrono::milliseconds timeout{10000}; // the whole batch's deadline (timeout=)
};

struct StartProbeResult {
	std::vector<Membership::Candidate> candidates; // one per known donor, same order
	std::vector<Endpoint> reachable;               // those that answered and may be used
	std::vector<std::pair<std::string, std::string>> unreachable; // (name, why)
	size_t probed = 0, failed = 0, not_probed = 0;
	std::chrono::milliseconds took{0};
};

// Probed, in parallel under one deadline (timeout=): the donors that may hold slabs by
// local knowledge (the record's; every listed one without a record) and the server=
// entries (a typo is a clear error at start), each within the whole deadline; then those
// etcd's copy of the record alone adds (at most kMaxEtcdHolders), and the other
// registered donors, only candidates for the donor set, in a random order (an entry's
// place in etcd buys nothing), each within min(timeout=, 2 s), until the first two kinds
// are done and enough answered for the set. A donor not probed by the deadline is not
// chosen now (Membership probes it later if the set needs it).
StartProbeResult probe_start(const StartProbe &in, const ProbeFn &probe);

// The donor set's view of a donor: a connected one (`srv`) by its own counts, another by its
// hint (none: it looks empty), `alive` as the caller judges it; with an eighth of its slabs
// left it counts as full, so that a full member's replacement is connected while it still has
// room (placement falls back on it meanwhile: Volume::set_outside). The start's plan and the
// membership step both choose members by it.
DonorLoad donor_set_view(const Server *srv, const DonorLoad &hint, bool alive);

} // namespace rdmaswap
