// SPDX-License-Identifier: MIT
// A volume's donors while it serves: the server= entries, retried until they answer, and (with
// etcd=) the donors registered in etcd, added as they appear, retired as their registration
// vanishes, and taken as lost when they come back with a new boot id. Control path only.
//
// Contracts:
// - Nothing here touches the data path: a donor is connected (RemoteServer, its data paths)
//   on the membership's own thread, then Volume::add_server() publishes it.
// - etcd is discovery only: a vanished registration retires the donor (no new slabs); its
//   replicas serve on until its data path fails. Losing etcd changes nothing.
// - A donor whose session is gone (it restarted, or dropped us), or whose registration shows
//   a new boot id, is taken as lost at once (Volume::donor_restarted: repair starts), then
//   connected again as a new donor when it answers.
// - A donor that cannot be connected is retried with a growing pause (1 s doubling to 60 s);
//   the first failure of a streak is a warning, the rest are debug lines.
// - Donor sets (spread=, issue 14): with `spread` > 0 only the members of the volume's
//   DonorSet (common/donor_set.h) are connected and get new slabs: `spread` donors chosen by
//   two choices over the live donors, by the hints etcd publishes (free slabs, sessions) or,
//   once connected, the donor's own. Full, dead or vanished members are replaced (a full one
//   stays placeable: it takes slabs again when it has room); connected donors never chosen
//   (kept at start for the slabs they held) get new slabs only when no other donor has room
//   (Volume::set_outside). With `spread` 0 every donor wanted is connected and a member (the
//   behaviour before sets).
// - The holders record: before a donor is connected (so before it can get a slab or a floor
//   of the volume) it is added to the record through `Options::record`; when that fails the
//   donor is not connected. It shrinks only by the donors closed for being idle (after they
//   are closed: they hold nothing of the volume), so a restart that contacts the record's
//   donors finds every slab and floor (the plugin also prunes it at its next start).
// - Idle donors (`idle` > 0): a connected donor that is not a member of the set (or, with
//   spread 0, not wanted) and holds nothing of the volume for `idle` is disconnected
//   (Volume::close_idle_server: no slab, none being placed, no floor); it is connected anew
//   (a new index) if it is chosen again. Not once a quarter of the volume's indices are
//   left (they are never reused).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/backoff.h"
#include "common/config.h"
#include "common/discovery.h"
#include "common/donor_set.h"
#include "common/transport.h"
#include "common/volume.h"

namespace rdmaswap {

class Membership {
public:
	using Clock = std::chrono::steady_clock;
	// Connect to a donor (RemoteServer with the plugin's options). Throws std::runtime_error
	// naming the donor and why when it cannot.
	using Connect = std::function<std::unique_ptr<Server>(const Endpoint &)>;

	struct Options {
		std::vector<Endpoint> servers; // server=: always wanted, never retired
		// etcd= (empty: no registry; only server= entries are retried).
		discovery::ListOptions registry;
		// How often step() runs when nothing wakes it (retries, lost sessions).
		std::chrono::milliseconds interval{2000};
		// A watch stream lasts at most this long before it is opened again (with a
		// relisting).
		std::chrono::milliseconds watch_span{30000};
		// spread=: members of the donor set (0: every donor wanted is connected).
		unsigned spread = 0;
		// idle-disconnect=: how long a donor outside the set holds nothing before it is
		// disconnected (0: never).
		std::chrono::milliseconds idle{0};
		// Store the holders record (every donor named, sorted by name) before the donors
		// new in it are connected. Returns "" or why it could not (then they are not
		// connected now, but retried). Empty: no record is kept.
		std::function<std::string(const std::vector<Endpoint> &)> record;
		// The record as the plugin stored it at start (the donors connected at start and
		// those that may still hold slabs).
		std::vector<Endpoint> recorded;
		// Hints for donors not connected yet (etcd's registration hints win when there):
		// e.g. the plugin's probes at start.
		std::vector<std::pair<Endpoint, DonorLoad>> hints;
		// Test only (the plugin's RDMASWAP_TEST_THROW=membership): called at the start of
		// every step(); what it throws leaves step() like any other exception.
		std::function<void()> fault;
	};
	struct Start {
		Endpoint ep;
		uint64_t boot_id = 0; // as etcd gave it (0: unknown)
		bool member = true;   // inside the donor set (with spread > 0)
	};
	// The donors to make members at start, by the same rule as later: those in `seeds`
	// that are usable (alive, with room) first, up to `spread`, then the set filled by two
	// choices over `loads`. Indices into `loads`. spread 0: every usable donor.
	static std::vector<size_t> choose_start_members(unsigned spread,
							std::span<const DonorLoad> loads,
							std::span<const size_t> seeds);

	// `volume` holds the donors connected at start; `start` names them in index order
	// (volume.server(i) is start[i].ep). Marks the non-members outside the set and hooks
	// Volume's need-donor call (a step at once when no member has room). Starts no thread:
	// see start().
	Membership(Volume &volume, Connect connect, Options opts, std::span<const Start> start);
	~Membership();
	Membership(const Membership &) = delete;
	Membership &operator=(const Membership &) = delete;

	// The registry's listing (every donor registered now). Records it and wakes step();
	// no network wait.
	void set_registered(std::span<const discovery::Donor> donors);
	// One pass: retire or un-retire donors, take lost ones as lost, connect the donors wanted
	// and not connected whose pause is over. Returns how many were added. Called by the
	// thread; tests may call it directly (without start()).
	unsigned step();

	// Start the threads: the step loop, and with a registry the watcher. stop() (or the
	// destructor) ends them; a connect in progress ends within the plugin's timeout. Each
	// thread is an exception boundary: an exception that leaves a step or a watch is logged
	// (an error, once per streak of failures) and the thread carries on after its interval.
	void start();
	void stop();
	// Run a step soon (no wait; any thread): Volume's need-donor hook.
	void wake();

	// ---- The start (before the Volume exists) ----
	struct Candidate {
		Endpoint ep;
		DonorLoad hint{0, 0, true, 0}; // etcd's registration or a probe (total 0: none)
		bool reachable = true;          // false: probed at start and it did not answer
		bool may_hold = false;          // in the holders record (every donor without one)
	};
	struct StartPlan {
		std::vector<std::unique_ptr<Server>> servers; // those that may hold slabs first
		std::vector<Start> start;                     // their names, same order
		size_t start_holders = 0;  // VolumeOptions::start_holders
		unsigned missing = 0;      // VolumeOptions::missing_servers
		std::vector<Endpoint> record; // the holders record to store before serving
	};
	// Contact the donors that may hold slabs of the volume (every reachable one with
	// may_hold), choose the donor set (choose_start_members: the ones that kept slabs for
	// the volume first) and connect its members, then keep only the donors that kept
	// something or are members (spread 0: every donor contacted). Missing: the donors that
	// may hold slabs and did not hand the volume back (unreachable, refused, or handing back
	// nothing: it may have restarted). The record: the donors kept, and those that may
	// hold slabs and could not be asked. Connection failures are logged (warnings).
	static StartPlan plan_start(unsigned spread, std::span<const Candidate> candidates,
				    const Connect &connect);

private:
	// A donor that cannot be connected is tried again after 1 s, the pause doubling to 60 s.
	static constexpr std::chrono::milliseconds kFirstRetry{1000}, kMaxRetry{60000};
	// Donors known at most (entries are never removed; more are ignored with a warning).
	static constexpr size_t kMaxEntries = Volume::kMaxServers;
	struct Entry {
		Endpoint ep;
		DonorLoad hint{0, 0, true, 0}; // from etcd or the plugin (total 0: none)
		// It was a member of the set while connected: a member replaced for being full stays
		// placeable (it takes slabs again when it has room, without waiting for a step);
		// only donors never chosen are outside (Volume::set_outside).
		bool joined = false;
		bool from_servers = false;
		bool registered = false;
		uint64_t boot_id = 0;      // as registered (0: unknown)
		long slot = -1;            // index in the volume, -1: not connected
		uint64_t slot_boot = 0;    // the boot id when it was connected
		Backoff retry{kFirstRetry, kMaxRetry};
		bool warned = false; // the first failure of a streak was logged
		Clock::time_point idle_since{}; // connected, not a member, holding nothing (0: not)
	};
	// Disconnect the idle donors of `to_close` (entries; step() only, no lock held), then
	// store the record without them.
	void close_idle(std::span<const size_t> to_close);
	void step_loop();
	void watch_loop();
	// The threads' boundary: logs what a loop threw (error once per streak, then debug) and
	// sets `failing`.
	void loop_failed(const char *loop, const char *why, bool &failing);
	// List the registry and record it; false if etcd did not answer.
	bool relist();

	Volume &volume_;
	const Connect connect_;
	const Options opts_;
	std::mutex mu_; // entries_, wake_, stop_
	std::condition_variable cv_;
	std::vector<Entry> entries_;            // index: the donor set's index
	std::map<std::string, size_t> index_;   // HOST:PORT -> entries_ index
	Entry &entry(const Endpoint &ep);        // found or made; caller holds mu_
	DonorSet set_;
	std::minstd_rand rng_;
	std::vector<DonorLoad> loads_;           // per entry, for the set (step() only)
	std::vector<std::string> recorded_;      // the holders record (sorted names)
	bool full_warned_ = false;
	Volume::NeedDonorHook hook_;
	bool wake_ = false;
	bool stop_ = false;
	std::mutex step_mu_; // one step() at a time
	struct Watch;
	std::unique_ptr<Watch> watch_;
	std::thread step_thread_, watch_thread_;
};

} // namespace rdmaswap
