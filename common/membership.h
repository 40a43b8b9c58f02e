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
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/backoff.h"
#include "common/config.h"
#include "common/discovery.h"
#include "common/transport.h"

namespace rdmaswap {

class Volume;

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
	};

	// `volume` holds the donors connected at start; `start` names them in index order
	// (volume.server(i) is start[i]) with the boot ids etcd gave for them (0: unknown).
	// Starts no thread: see start().
	Membership(Volume &volume, Connect connect, Options opts,
		   std::span<const std::pair<Endpoint, uint64_t>> start);
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
	// destructor) ends them; a connect in progress ends within the plugin's timeout.
	void start();
	void stop();

private:
	// A donor that cannot be connected is tried again after 1 s, the pause doubling to 60 s.
	static constexpr std::chrono::milliseconds kFirstRetry{1000}, kMaxRetry{60000};
	struct Entry {
		Endpoint ep;
		bool from_servers = false;
		bool registered = false;
		uint64_t boot_id = 0;      // as registered (0: unknown)
		long slot = -1;            // index in the volume, -1: not connected
		uint64_t slot_boot = 0;    // the boot id when it was connected
		Backoff retry{kFirstRetry, kMaxRetry};
		bool warned = false; // the first failure of a streak was logged
	};
	void step_loop();
	void watch_loop();
	// List the registry and record it; false if etcd did not answer.
	bool relist();

	Volume &volume_;
	const Connect connect_;
	const Options opts_;
	std::mutex mu_; // entries_, wake_, stop_
	std::condition_variable cv_;
	std::map<std::string, Entry> entries_; // by HOST:PORT
	bool wake_ = false;
	bool stop_ = false;
	std::mutex step_mu_; // one step() at a time
	struct Watch;
	std::unique_ptr<Watch> watch_;
	std::thread step_thread_, watch_thread_;
};

} // namespace rdmaswap
