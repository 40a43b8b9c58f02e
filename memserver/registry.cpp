// SPDX-License-Identifier: MIT
// The registry thread of registry.h: lease, put, keepalive, re-put on a change of free slabs or
// sessions, retries with backoff while etcd is away, deregistration at a clean stop.
#include "memserver/registry.h"

#include <algorithm>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/obs/guarded_main.h"
#include "common/obs/log.h"
#include "common/wire/registration.h"

namespace rdmaswap {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

uint64_t make_boot_id()
{
	std::random_device rd; // getrandom(2)
	uint64_t id = 0;
	while (id == 0)
		id = uint64_t(rd()) << 32 | rd();
	return id;
}

std::string registry_key(const RegistryOptions &o)
{
	return o.prefix + "donors/" + o.advertise;
}

namespace {
int64_t unix_ms()
{
	return std::chrono::duration_cast<milliseconds>(
		       std::chrono::system_clock::now().time_since_epoch())
		.count();
}
} // namespace

std::string registry_value(const RegistryOptions &o, const RegistryHints &h, int64_t ts_ms)
{
	const std::string fields = nlohmann::json{{"addr", o.advertise},
						  {"boot_id", fmt::format("{:016x}", o.boot_id)},
						  {"transport", o.transport},
						  {"slab_size", o.slab_size},
						  {"slabs_total", o.slabs_total},
						  {"slabs_free", h.slabs_free},
						  {"sessions", h.sessions},
						  {"auth", o.auth},
						  {"ts", ts_ms > 0 ? ts_ms : unix_ms()}}
					   .dump();
	if (!o.donor_key)
		return fields;
	return sign_registration(registry_key(o), fields, *o.donor_key, o.donor_cert);
}

Registry::Registry(RegistryOptions opts, std::function<RegistryHints()> hints)
	: opts_(std::move(opts)), key_(registry_key(opts_)), hints_(std::move(hints)),
	  client_(etcd::ClientOptions{opts_.endpoints, opts_.timeout,
				      std::min(opts_.timeout, milliseconds(1000)), opts_.credentials})
{
	// The thread's exception boundary: the memserver serves on, unregistered until the
	// thread's body starts again (a new lease; the old one expires within its TTL).
	thread_ = std::thread([this] {
		guarded_thread("memserver", "the etcd registry thread",
			       "the registration is made again in a few seconds",
			       [this] { run(); },
			       [this](const char *) {
				       return sleep_until(Clock::now() + opts_.backoff_max)
						      ? AfterFailure::End
						      : AfterFailure::Again;
			       });
	});
}

Registry::~Registry()
{
	stop();
}

void Registry::stop()
{
	{
		std::lock_guard lock(mu_);
		if (!stopping_) {
			stopping_ = true;
			stop_deadline_ = Clock::now() + opts_.stop_bound;
			// A request in progress ends at once. Under mu_: the thread clears this
			// under mu_ before it deregisters, so it cannot cut the deregistration.
			client_.interrupt();
		}
	}
	cv_.notify_all();
	if (thread_.joinable())
		thread_.join();
}

bool Registry::sleep_until(Clock::time_point until)
{
	std::unique_lock lock(mu_);
	cv_.wait_until(lock, until, [this] { return stopping_; });
	return stopping_;
}

void Registry::run()
{
	auto log = logger("memserver");
	const milliseconds backoff_min(250);
	int64_t lease = 0;      // 0: none granted (or it was lost)
	bool need_put = true;   // the value in etcd is missing or stale
	bool registered = false; // our key is (as far as we know) in etcd under `lease`
	bool outage = false;    // warned about etcd being away; an info when it is back
	RegistryHints published; // in the value last put
	int64_t last_ts = 0;     // the "ts" last put: each put's is larger (plugins with donor-ca=
				 // ignore a registration older than one they saw: a replay)
	Clock::time_point last_put{}, next_keepalive{};
	milliseconds backoff = backoff_min;
	log->info("etcd: registering {} (boot id {:016x}, {}) at {}", key_, opts_.boot_id,
		  opts_.donor_key ? "signed by the donor key" : "unsigned: plugins with donor-ca= ignore it",
		  fmt::join(opts_.endpoints, ","));
	if (opts_.donor_key) {
		std::string err;
		const auto cert = parse_cert(opts_.donor_cert, err);
		const auto adv = canonical_cert_address(opts_.advertise);
		if (cert && (!adv || !cert->lists(*adv)))
			log->warn("etcd: --advertise {} is not among the addresses of --donor-cert: "
				  "plugins with donor-ca= will ignore this registration",
				  opts_.advertise);
	}
	for (;;) {
		const auto now = Clock::now();
		const RegistryHints hints = hints_();
		const uint32_t free = hints.slabs_free;
		const uint32_t diff = free > published.slabs_free ? free - published.slabs_free
								  : published.slabs_free - free;
		// Free slabs changed by >= 5 % of the total, or sessions at all (there are few):
		// hints, not truths. A smaller change is put once the last put is `settle` old, so
		// that the value ends up exact (a put made during a burst of grants keeps what it
		// read at its start).
		const bool moved = (diff && uint64_t(diff) * 20 >= opts_.slabs_total) ||
				   hints.sessions != published.sessions;
		if (registered && moved && now - last_put >= opts_.min_update)
			need_put = true;
		if (registered && diff && now - last_put >= opts_.settle)
			need_put = true;
		std::string why;
		if (lease == 0) {
			if (auto g = client_.lease_grant(opts_.ttl.count())) {
				lease = g.value->id;
				need_put = true;
				next_keepalive = now + opts_.keepalive;
			} else {
				why = g.error;
			}
		}
		if (why.empty() && need_put) {
			last_ts = std::max(last_ts + 1, unix_ms());
			auto p = client_.put(key_, registry_value(opts_, hints, last_ts), lease);
			if (p) {
				need_put = false;
				published = hints;
				last_put = now;
				if (outage || !registered)
					log->info("etcd: registered {} ({} of {} slabs free, {} "
						  "sessions)",
						  key_, free, opts_.slabs_total, hints.sessions);
				registered = true;
				outage = false;
				backoff = backoff_min;
			} else {
				if (p.code == etcd::kNotFound) { // the lease expired meanwhile
					lease = 0;
					registered = false;
				}
				why = p.error;
			}
		}
		if (why.empty() && lease && now >= next_keepalive) {
			auto k = client_.lease_keepalive(lease);
			if (!k) {
				why = k.error;
			} else if (k.value->ttl == 0) {
				log->info("etcd: lease {:x} of {} lost; registering again", lease, key_);
				lease = 0;
				registered = false;
				need_put = true;
				continue;
			} else {
				next_keepalive = now + opts_.keepalive;
				if (outage)
					log->info("etcd: reachable again; {} still registered", key_);
				outage = false;
				backoff = backoff_min;
			}
		}
		Clock::time_point next;
		if (!why.empty()) {
			{
				std::lock_guard lock(mu_);
				if (stopping_) // interrupted by stop(): no outage to report
					break;
			}
			if (!outage)
				log->warn("etcd: cannot register {} ({}); serving on, retrying every {} "
					  "ms at most",
					  key_, why, opts_.backoff_max.count());
			outage = true;
			next = Clock::now() + backoff;
			backoff = std::min(backoff * 2, opts_.backoff_max);
		} else {
			next = std::min(next_keepalive, Clock::now() + opts_.poll);
		}
		if (sleep_until(next))
			break;
	}

	// A clean stop: remove the key now rather than at the lease's expiry.
	Clock::time_point deadline;
	{
		std::lock_guard lock(mu_);
		deadline = stop_deadline_;
		client_.clear_interrupt();
	}
	if (lease == 0)
		return;
	std::string why;
	if (registered)
		if (auto d = client_.del(key_, deadline); !d)
			why = d.error;
	if (auto r = client_.lease_revoke(lease, deadline); !r && why.empty())
		why = r.error;
	if (why.empty())
		log->info("etcd: deregistered {}", key_);
	else
		log->warn("etcd: could not deregister {} ({}); it expires with its lease within {} s",
			  key_, why, opts_.ttl.count());
}

} // namespace rdmaswap
