// SPDX-License-Identifier: MIT
// A volume's donors while it serves: the server= entries, retried until they answer, and (with
// etcd=) the donors registered in etcd, added as they appear, retired as their registration
// vanishes, and taken as lost when the donor itself says its session is gone. Control path
// only.
//
// Contracts:
// - Nothing here touches the data path: a donor is connected (RemoteServer, its data paths)
//   on the membership's own thread, then Volume::add_server() publishes it.
// - etcd decides nothing alone (issue 26). It is discovery only: a vanished registration
//   retires the donor (no new slabs); its replicas serve on until its data path fails. Losing
//   etcd changes nothing. A registered donor is made a member only once it answered a probe
//   (Options::probe, an authenticated STATS) in the last kProbeFresh; its hints for the set
//   are then its own counts, not the registration's.
// - A donor whose session is gone (it restarted, or dropped us) is taken as lost at once
//   (Volume::donor_restarted: repair starts), then connected again as a new donor when it
//   answers. A registration showing a new boot id is only a reason to ask the donor over the
//   session's own connection (Server::stats, again on a new connection if the first was
//   broken: that joins the session or learns it is gone); its slabs are dropped only if the
//   donor says the session is gone. If the donor still holds the session the registration is
//   not believed (counted: etcd_boot_id_disbelieved, and a warning, rate-limited).
// - Bounded whatever etcd holds: the table holds at most kMaxEntries donors (registrations
//   beyond are ignored and counted); a donor neither registered, nor a server= entry, nor
//   connected is forgotten after kAgeOut. The watch applies each event's key and value by
//   itself (a listing only at the start, after a compaction or a watch message over
//   discovery::kPageBytes, at most once per kRelistSpacing), entries through
//   discovery::check_donor (values over discovery::kMaxValue, malformed ones: ignored,
//   counted, one warning per kWarnPeriod for all of them), and the steps the events wake
//   are debounced (kDebounce apart at least).
// - With donor-ca= (registry.verifier) only signed registrations count (check_donor: an
//   unsigned or invalid one is as if the key held nothing: ignored, counted), and one whose
//   signed "ts" is older than the newest seen of the same donor (a replay) is ignored too
//   (counted: replayed). The newest "ts" is kept while the donor is in the table.
// - Probes run in batches of at most kProbeBatch donors, kProbeWorkers at a time, each within
//   min(kProbeBound, timeout), the batch within `timeout`: only while the set has vacancies
//   (so a full set costs the donors nothing), never-tried donors first, the newest
//   registration first (a donor registered now is asked at the next step, however many
//   dead ones were registered before), then the others whose pause is over.
// - A donor that cannot be probed or connected is retried with a growing pause (1 s doubling
//   to 60 s); for a connect the first failure of a streak is a warning (kLogBurst per minute
//   at most), the rest are debug lines; probe failures are debug lines (and counted).
// - Donor sets (spread=, issue 14): with `spread` > 0 only the members of the volume's
//   DonorSet (common/cluster/donor_set.h) are connected and get new slabs: `spread` donors chosen by
//   two choices over the live donors, by the hints etcd publishes (free slabs, sessions) or,
//   once connected, the donor's own. Full, dead or vanished members are replaced (a full one
//   stays placeable: it takes slabs again when it has room); connected donors never chosen
//   (kept at start for the slabs they held) get new slabs only when no other donor has room
//   (Volume::set_outside). With `spread` 0 every donor wanted is connected and a member (the
//   behaviour before sets).
// - The holders record: before a donor is connected (so before it can get a slab or a floor
//   of the volume) it is added to the record through `Options::record`; when that fails the
//   donor is not connected. A donor added so whose connect then fails is taken out again (it
//   was never reached: it holds nothing of the volume). Otherwise it shrinks only by the
//   donors closed for being idle (after they are closed: they hold nothing of the volume), so
//   a restart that contacts the record's donors finds every slab and floor (the plugin also
//   prunes it at its next start).
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

#include <unordered_map>

#include "common/cluster/discovery.h"
#include "common/cluster/donor_set.h"
#include "common/cluster/probe.h"
#include "common/obs/log.h"
#include "common/transport/transport.h"
#include "common/util/backoff.h"
#include "common/util/config.h"
#include "common/volume/volume.h"

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
		// The registry as the start listed it (discovery::discover): its donors, the
		// entries it ignored (counted) and its revision (the watch goes on from the next
		// one; 0: the watch lists first).
		std::vector<discovery::Donor> registered;
		discovery::Ignored ignored;
		int64_t revision = 0;
		// Ask a registered donor whether it answers (probe.h) before it is made a member.
		// Empty: none (registered donors are connected without one, as server= entries
		// always are).
		ProbeFn probe;
		// The plugin's timeout=: a step's probes (and asks) end within it.
		std::chrono::milliseconds timeout{10000};
		// A donor neither registered, nor a server= entry, nor connected is forgotten after
		// this (tests shorten it).
		std::chrono::milliseconds age_out{kAgeOut};
		// How often step() runs when nothing wakes it (retries, lost sessions).
		std::chrono::milliseconds interval{2000};
		// A watch stream lasts at most this long before it is opened again (from where it
		// left off: no listing).
		std::chrono::milliseconds watch_span{30000};
		// spread=: members of the donor set (0: every donor wanted is connected).
		unsigned spread = 0;
		// idle-disconnect=: how long a donor outside the set holds nothing before it is
		// disconnected (0: never).
		std::chrono::milliseconds idle{0};
		// Store the holders record (every donor named, sorted by name) before the donors
		// new in it are connected. Fails, saying why, if it could not (then they are not
		// connected now, but retried). Empty: no record is kept.
		std::function<Result<Ok>(const std::vector<Endpoint> &)> record;
		// The record as the plugin stored it at start (the donors connected at start and
		// those that may still hold slabs).
		std::vector<Endpoint> recorded;
		// etcd's copies of the holders record the start ignored (not signed by the volume
		// key): counted (etcd_holders_ignored).
		uint64_t holders_ignored = 0;
		// What the start's probes found: a donor that answered (`ok`, with its counts)
		// counts as probed then; one that did not waits out a first pause.
		struct Probed {
			Endpoint ep;
			bool ok = false;
			DonorLoad load{0, 0, true, 0};
		};
		std::vector<Probed> probed;
		// Test only (the plugin's RDMASWAP_TEST_THROW=membership): called at the start of
		// every step(); what it throws leaves step() like any other exception.
		std::function<void()> fault;
	};
	struct Start {
		Endpoint ep;
		uint64_t boot_id = 0; // as etcd gave it (0: unknown)
		bool member = true;   // inside the donor set (with spread > 0)
		// The connected donor (volume.server(i), which owns it), asked when a registration
		// shows a new boot id. Null: never asked (a new boot id is then not believed; a
		// lost session still counts).
		Server *server = nullptr;
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

	// The registry's listing (every donor registered now): the donors it does not name are
	// no longer registered. Records it and wakes step(); no network wait.
	void set_registered(std::span<const discovery::Donor> donors);
	// One registration put (a watch event): `d` is registered, with its boot id and hints.
	// Wakes step(); no network wait. Ignored (counted) when the table is full.
	void registration_put(const discovery::Donor &d);
	// A registration deleted (or replaced by a value that is not a registration): `addr` is
	// no longer registered. Wakes step(); no network wait.
	void registration_gone(const Endpoint &addr);
	// Entries the registry holds that were not used (check_donor counted them): added to the
	// counters; logged in one warning per kWarnPeriod at most, with a few examples.
	void note_ignored(const discovery::Ignored &ignored);

	// What the membership saw, for the status and metrics files.
	struct Counters {
		uint64_t known = 0;           // donors in the table now
		uint64_t registered = 0;      // of them, registered now
		uint64_t ignored_invalid = 0; // registry entries ignored: malformed
		uint64_t ignored_too_large = 0; // ... over discovery::kMaxValue
		uint64_t ignored_beyond = 0;  // ... beyond a listing's or the table's bound
		// ... (donor-ca=) unsigned, a certificate refused, a bad signature, a replay
		uint64_t ignored_unsigned = 0, ignored_bad_cert = 0, ignored_bad_signature = 0;
		uint64_t ignored_replayed = 0;
		// etcd's copy of the holders record ignored at start: not signed by the volume key
		uint64_t holders_ignored = 0;
		uint64_t boot_id_disbelieved = 0; // a new boot id the donor's session contradicted
		uint64_t events = 0;          // watch events applied
		uint64_t listings = 0;        // listings of the registry (the start's included)
		uint64_t probes_ok = 0, probes_failed = 0;
		uint64_t aged_out = 0;        // donors forgotten (kAgeOut)
	};
	Counters counters() const;
	// "membership_known=N\n..." lines for the status file (one per counter; etcd_* for the
	// registry's).
	std::string status_text() const;
	// The same as Prometheus families rdmaswap_volume_donors_* and rdmaswap_volume_etcd_*.
	std::string metrics_text() const;
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
		// false: not probed at start (the probes' deadline came first): not chosen now.
		bool probed = true;
		bool may_hold = false;          // in the holders record (every donor without one)
		// With may_hold: counted as missing if it cannot be asked or hands nothing back,
		// and kept in the record if it cannot be asked. false for a donor that may hold
		// slabs only by etcd's word (its copy of the holders record, issue 26): contacted,
		// kept only if it hands slabs of the volume back.
		bool may_miss = true;
	};
	struct StartPlan {
		std::vector<std::unique_ptr<Server>> servers; // those that may hold slabs first
		std::vector<Start> start;                     // their names, same order
		size_t start_holders = 0;  // VolumeOptions::start_holders
		unsigned missing = 0;      // VolumeOptions::missing_servers
		std::vector<Endpoint> record; // the holders record to store before serving
	};
	// (common/cluster/start.cpp) Contact the donors that may hold slabs of the volume (every
	// reachable one with
	// may_hold), choose the donor set (choose_start_members among the donors probed and
	// reachable: the ones that kept slabs for the volume first) and connect its members, then
	// keep only the donors that kept something or are members (spread 0: every donor
	// contacted). Missing: the donors with may_miss that may hold slabs and did not hand the
	// volume back (unreachable, refused, or handing back nothing: it may have restarted). The
	// record: the donors kept, and those with may_miss that may hold slabs and could not be
	// asked. Connection failures are logged (warnings).
	static StartPlan plan_start(unsigned spread, std::span<const Candidate> candidates,
				    const Connect &connect);

	// Donors known at most: the table (and the donor set's indices).
	static constexpr size_t kMaxEntries = discovery::kMaxListed;
	// A donor neither registered, nor a server= entry, nor connected is forgotten after this.
	static constexpr std::chrono::milliseconds kAgeOut{60000};
	// A probe's answer makes a donor eligible for the set this long.
	static constexpr std::chrono::milliseconds kProbeFresh{30000};
	// Probes per step at most, run kProbeWorkers at a time, each within kProbeBound.
	static constexpr size_t kProbeBatch = 32;
	static constexpr unsigned kProbeWorkers = 16;
	static constexpr std::chrono::milliseconds kProbeBound{2000};
	// Steps woken by registry changes run at least this far apart.
	static constexpr std::chrono::milliseconds kDebounce{250};
	// Listings of the registry after the start's: at most one per this.
	static constexpr std::chrono::milliseconds kRelistSpacing{10000};
	// Entries ignored: one warning per this at most (with the count since the last).
	static constexpr std::chrono::milliseconds kWarnPeriod{60000};
	// Connect failures and disbelieved boot ids: this many warnings a minute at most.
	static constexpr unsigned kLogBurst = 5;

private:
	// A donor that cannot be connected is tried again after 1 s, the pause doubling to 60 s.
	static constexpr std::chrono::milliseconds kFirstRetry{1000}, kMaxRetry{60000};
	struct Entry {
		bool used = false; // the slot holds a donor (else it is free)
		Endpoint ep;
		std::string name;   // ep.str()
		DonorLoad hint{0, 0, true, 0}; // from etcd or the plugin (total 0: none)
		// It was a member of the set while connected: a member replaced for being full stays
		// placeable (it takes slabs again when it has room, without waiting for a step);
		// only donors never chosen are outside (Volume::set_outside).
		bool joined = false;
		bool from_servers = false;
		bool registered = false;
		uint64_t boot_id = 0;      // as registered (0: unknown)
		int64_t reg_ts = 0;        // the newest signed "ts" accepted (donor-ca=; 0: none)
		long slot = -1;            // index in the volume, -1: not connected
		uint64_t slot_boot = 0;    // the boot id when it was connected
		Server *server = nullptr;  // while connected (the volume owns it; null: not asked)
		uint64_t disbelieved = 0;  // a registered boot id the donor's session contradicted
		Backoff ask_retry{kFirstRetry, kMaxRetry}; // asking it about a new boot id failed
		Backoff retry{kFirstRetry, kMaxRetry};
		bool warned = false; // the first failure of a streak was logged
		bool tried = false;  // probed or connected at least once (successfully or not)
		Clock::time_point probed_ok{}; // its last successful probe (0: none)
		uint64_t seq = 0;    // when it registered (larger: later)
		Clock::time_point idle_since{}; // connected, not a member, holding nothing (0: not)
		Clock::time_point unwanted_since{}; // not registered, not server=, not connected
	};
	// Disconnect the idle donors of `to_close` (entries; step() only, no lock held), then
	// store the record without them.
	void close_idle(std::span<const size_t> to_close);
	// Ask the donors of `to_ask` (entries; no lock held) about the new boot id of their
	// registration (see the contracts).
	void ask_boot(std::span<const size_t> to_ask);
	// Probe the donors of `to_probe` (entries; no lock held) and record what they said.
	// True if one answered.
	bool probe_entries(std::span<const size_t> to_probe);
	// The record (as it is) without `names` (sorted): for donors recorded before a connect
	// that failed.
	// The holders record's names but those in `out`, and their endpoints (as connected, or
	// parsed from the name). Takes mu_.
	void recorded_without(std::span<const std::string> out, std::vector<std::string> &names,
			      std::vector<Endpoint> &eps);
	void unrecord(std::span<const std::string> names);
	void step_loop();
	void watch_loop();
	// Apply one watch event (under no lock; takes mu_).
	void apply_event(const etcd::WatchEvent &ev, discovery::Ignored &ignored);
	// Log the entries ignored since the last warning if kWarnPeriod has passed (or `force`).
	void warn_ignored(bool force);
	// The threads' boundary: logs what a loop threw (error once per streak, then debug) and
	// sets `failing`.
	void loop_failed(const char *loop, const char *why, bool &failing);
	// List the registry and record it; false if etcd did not answer. Sets `revision`.
	bool relist(int64_t &revision);

	Volume &volume_;
	const Connect connect_;
	const Options opts_;
	mutable std::mutex mu_; // entries_ (and what goes with them), wake_, stop_, counters_
	std::condition_variable cv_;
	std::vector<Entry> entries_;            // index: the donor set's index; never reallocated
	std::vector<size_t> free_;              // slots of entries_ not used
	std::unordered_map<std::string, size_t> index_; // HOST:PORT -> entries_ index
	// The entry of `ep`, found or made (null when the table is full); caller holds mu_.
	Entry *entry(const Endpoint &ep);
	Entry *find(const std::string &name);
	// With donor-ca=: false, counted as replayed, if `d` is older than the registration of
	// the same donor seen before (else its "ts" is kept as the newest). Caller holds mu_.
	bool fresh(Entry &e, const discovery::Donor &d);
	void forget(size_t k); // caller holds mu_
	uint64_t seq_ = 0;     // registrations seen (Entry::seq)
	Counters counters_;
	discovery::Ignored pending_ignored_;    // since the last warning
	Clock::time_point ignored_warned_{};
	LogLimiter connect_log_{kLogBurst, std::chrono::seconds(60)};
	LogLimiter boot_log_{kLogBurst, std::chrono::seconds(60)};
	Clock::time_point last_step_{};
	DonorSet set_;
	std::minstd_rand rng_;
	std::vector<DonorLoad> loads_;           // per entry, for the set (step() only)
	std::vector<std::string> recorded_;      // the holders record (sorted names)
	Volume::NeedDonorHook hook_;
	bool wake_ = false;
	bool stop_ = false;
	std::mutex step_mu_; // one step() at a time
	struct Watch;
	std::unique_ptr<Watch> watch_;
	std::thread step_thread_, watch_thread_;
};

} // namespace rdmaswap
