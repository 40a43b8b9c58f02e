// SPDX-License-Identifier: MIT
// placement-sim: many hosts placing their volumes' slabs over many donors with the project's
// own DonorSet and place_slab, printing how many sessions and how much fill each donor gets.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/cluster/donor_set.h"
#include "common/obs/guarded_main.h"
#include "common/volume/placement.h"

namespace {

using rdmaswap::DonorLoad;
using rdmaswap::DonorSet;

struct Options {
	unsigned donors = 1000;
	unsigned hosts = 1000;
	unsigned replicas = 2;
	double fill = 0.5;
	unsigned spread = DonorSet::kDefaultSpread;
	unsigned slabs_per_donor = 256;
	unsigned qps_per_session = 5;
	uint64_t seed = 1;
	std::string hints = "global";
	bool quiet = false;
};

// What a host knows of the donors and which it is connected to.
struct Host {
	Host(const Options &o, uint64_t seed)
		: set(o.spread, o.donors), rng(uint32_t(seed % 2147483646 + 1)), held(o.donors, 0),
		  flags(o.donors, 0)
	{
	}
	DonorSet set;
	std::minstd_rand rng;
	std::vector<uint32_t> held;  // per donor: replicas of our slabs on it
	std::vector<uint8_t> flags;  // per donor: kConnected, kEver
	std::vector<DonorLoad> own;  // --hints own: our view of the donors
	uint64_t seen_changes = 0;   // set.changes() when the connections were last updated
	uint64_t target = 0;         // slabs to place
	uint64_t placed = 0;         // slabs placed (possibly with fewer replicas)
	static constexpr uint8_t kConnected = 1, kEver = 2;
};

struct DonorStats {
	uint32_t sessions = 0; // hosts connected now
	uint32_t peak = 0;     // most hosts connected at once
	uint32_t ever = 0;     // hosts that were ever connected (ever had it as a member)
};

class Sim {
public:
	explicit Sim(const Options &o)
		: o_(o), loads_(o.donors, DonorLoad{0, o.slabs_per_donor, true}), stats_(o.donors),
		  tried_(o.donors), idle_(o.donors)
	{
		hosts_.reserve(o.hosts);
		// Replicas to place in all: the fill of the whole donor capacity, in whole slabs,
		// shared out evenly among the hosts.
		const uint64_t slabs =
			uint64_t(std::floor(o.fill * double(o.donors) * o.slabs_per_donor / o.replicas));
		std::mt19937_64 seeds(o.seed);
		for (unsigned h = 0; h < o.hosts; h++) {
			hosts_.push_back(std::make_unique<Host>(o, seeds()));
			Host &host = *hosts_.back();
			host.target = slabs / o.hosts + (h < slabs % o.hosts);
			if (o.hints == "own")
				host.own = loads_; // what HELLO said: every donor empty
		}
	}

	// Round-robin, one slab per host per round, until every host has placed its target.
	void run()
	{
		for (bool busy = true; busy;) {
			busy = false;
			for (auto &h : hosts_) {
				if (h->placed < h->target) {
					place_one(*h);
					busy = true;
				}
			}
		}
	}

	void report() const
	{
		uint64_t used = 0, cap = 0;
		double max_fill = 0, min_fill = 1;
		uint32_t max_now = 0, max_peak = 0, max_ever = 0;
		uint64_t sum_now = 0;
		if (!o_.quiet)
			std::printf("donor sessions peak_sessions ever_members peak_qps fill\n");
		for (unsigned d = 0; d < o_.donors; d++) {
			const DonorStats &s = stats_[d];
			const double f = double(loads_[d].used) / loads_[d].total;
			if (!o_.quiet)
				std::printf("%u %u %u %u %llu %.3f\n", d, s.sessions, s.peak, s.ever,
					    (unsigned long long)s.peak * o_.qps_per_session, f);
			used += loads_[d].used;
			cap += loads_[d].total;
			max_fill = std::max(max_fill, f);
			min_fill = std::min(min_fill, f);
			max_now = std::max(max_now, s.sessions);
			max_peak = std::max(max_peak, s.peak);
			max_ever = std::max(max_ever, s.ever);
			sum_now += s.sessions;
		}
		const double mean = double(used) / double(cap);
		std::printf("replicas_placed=%llu short_slabs=%llu unplaced_slabs=%llu "
			    "enospc=%llu\n",
			    (unsigned long long)used, (unsigned long long)short_,
			    (unsigned long long)unplaced_, (unsigned long long)enospc_);
		std::printf("mean_fill=%.4f min_fill=%.4f max_fill=%.4f\n", mean, min_fill, max_fill);
		std::printf("mean_sessions=%.2f max_sessions_at_end=%u max_peak_sessions=%u "
			    "max_ever_members=%u max_qps=%llu\n",
			    double(sum_now) / o_.donors, max_now, max_peak, max_ever,
			    (unsigned long long)max_peak * o_.qps_per_session);
		std::printf("max_sessions_per_donor=%u max_mean_fill=%.3f\n", max_peak,
			    mean > 0 ? max_fill / mean : 0.0);
	}

private:
	// One slab of `h`: like Volume::grant, the donors tried (or holding a replica) are
	// excluded when it asks again; a donor that turns out full refreshes its hint.
	void place_one(Host &h)
	{
		const bool own = !h.own.empty();
		unsigned got = 0, ntried = 0;
		while (got < o_.replicas) {
			uint16_t out[3];
			const std::span<const DonorLoad> view = own ? h.own : loads_;
			const unsigned n = h.set.place(view, o_.replicas - got,
						       std::span(tried_.data(), ntried), h.rng, out);
			sync(h);
			if (n == 0)
				break;
			for (unsigned k = 0; k < n; k++) {
				const uint16_t d = out[k];
				tried_[ntried++] = d;
				if (loads_[d].used >= loads_[d].total) { // ENOSPC
					enospc_++;
					if (own)
						h.own[d].used = h.own[d].total;
					continue;
				}
				loads_[d].used++;
				h.held[d]++;
				if (own)
					h.own[d].used++;
				got++;
			}
		}
		h.placed++;
		short_ += got > 0 && got < o_.replicas;
		unplaced_ += got == 0;
	}

	// Mirror the set's changes: connect to new members, disconnect idle ex-members.
	void sync(Host &h)
	{
		if (h.set.changes() == h.seen_changes)
			return;
		h.seen_changes = h.set.changes();
		for (uint16_t d : h.set.members()) {
			if (h.flags[d] & Host::kConnected)
				continue;
			DonorStats &s = stats_[d];
			s.ever += !(h.flags[d] & Host::kEver);
			h.flags[d] |= Host::kConnected | Host::kEver;
			s.peak = std::max(s.peak, ++s.sessions);
			if (o_.hints == "global")
				loads_[d].sessions = s.sessions;
		}
		const unsigned n = h.set.take_idle(h.held, idle_.data(), unsigned(idle_.size()));
		for (unsigned k = 0; k < n; k++) {
			const uint16_t d = idle_[k];
			if (h.flags[d] & Host::kConnected) {
				h.flags[d] &= uint8_t(~Host::kConnected);
				stats_[d].sessions--;
				if (o_.hints == "global")
					loads_[d].sessions = stats_[d].sessions;
			}
		}
	}

	const Options &o_;
	std::vector<DonorLoad> loads_; // the truth: every host's replicas
	std::vector<DonorStats> stats_;
	std::vector<std::unique_ptr<Host>> hosts_;
	std::vector<uint16_t> tried_, idle_;
	uint64_t short_ = 0, unplaced_ = 0, enospc_ = 0;
};

} // namespace

static int run(int argc, char **argv)
{
	Options o;
	CLI::App app{
		"placement-sim: simulates HOSTS compute hosts, each with one volume and one donor "
		"set, placing their slabs one per host per round over DONORS memservers until the "
		"donors are FILL full, with rdmaswap's own DonorSet and place_slab code; prints per "
		"donor the sessions (hosts connected: set members and holders of their slabs), QPs "
		"and fill, and ends with max_sessions_per_donor=N max_mean_fill=X. A development "
		"tool, not installed."};
	app.add_option("--donors", o.donors, "memservers (1..65536, default 1000)")
		->check(CLI::Range(1u, 65536u));
	app.add_option("--hosts", o.hosts, "compute hosts, one volume each (default 1000)")
		->check(CLI::Range(1u, 1000000u));
	app.add_option("--replicas", o.replicas, "copies of each slab, 1..3 (default 2)")
		->check(CLI::Range(1u, 3u));
	app.add_option("--fill", o.fill,
		       "how full the donors end, 0 < FILL <= 1 (default 0.5); each volume is "
		       "DONORS x SLABS-PER-DONOR / (HOSTS x REPLICAS) slabs at 1");
	app.add_option("--spread", o.spread,
		       "donor set size per volume; 0: unbounded, every host places over every "
		       "donor and connects to all (the behaviour before donor sets) (default 8)");
	app.add_option("--slabs-per-donor", o.slabs_per_donor, "slabs each donor has (default 256)")
		->check(CLI::Range(1u, 1u << 24));
	app.add_option("--qps-per-session", o.qps_per_session,
		       "RDMA QPs one session costs a donor (default 5: the plugin's paths=4 data "
		       "paths and the repair thread's, one RC QP each)");
	app.add_option("--seed", o.seed, "random seed (default 1)");
	app.add_option("--hints", o.hints,
		       "what a host knows of the donors: global (every donor's true fill and "
		       "sessions, as STATS gives them), fill (every donor's true fill, sessions "
		       "unknown) or own (only its own slabs, as a host that learnt free space at "
		       "HELLO and never again) (default global)")
		->check(CLI::IsMember({"global", "fill", "own"}));
	app.add_flag("--quiet", o.quiet, "print only the summary lines, not one line per donor");
	try {
		app.parse(argc, argv);
	} catch (const CLI::ParseError &e) {
		const int rc = app.exit(e); // prints the help, or the error
		return rc == 0 ? 0 : 2;
	}
	if (!(o.fill > 0 && o.fill <= 1)) {
		std::fprintf(stderr, "placement-sim: --fill must be more than 0 and at most 1, not %g\n",
			     o.fill);
		return 2;
	}
	if (uint64_t(o.donors) * o.hosts > (uint64_t(1) << 27)) {
		std::fprintf(stderr, "placement-sim: --donors x --hosts must be at most %llu\n",
			     (unsigned long long)(uint64_t(1) << 27));
		return 2;
	}
	std::printf("# placement-sim --donors %u --hosts %u --replicas %u --fill %g --spread %u "
		    "--slabs-per-donor %u --qps-per-session %u --hints %s --seed %llu\n",
		    o.donors, o.hosts, o.replicas, o.fill, o.spread, o.slabs_per_donor,
		    o.qps_per_session, o.hints.c_str(), (unsigned long long)o.seed);
	std::printf("# volume: %.2f slabs at fill 1; sessions: hosts connected to the donor (it "
		    "is a member of their set, or holds slabs of theirs) at the end, the most "
		    "at once (peak), and hosts that ever had it as a member (ever); "
		    "peak_qps = peak x --qps-per-session; max_sessions_per_donor is the "
		    "largest peak\n",
		    double(o.donors) * o.slabs_per_donor / (double(o.hosts) * o.replicas));
	Sim sim(o);
	sim.run();
	sim.report();
	return 0;
}

int main(int argc, char **argv)
{
	return rdmaswap::guarded_main("placement-sim", run, argc, argv);
}
