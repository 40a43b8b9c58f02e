// SPDX-License-Identifier: MIT
// Membership: its counters, its lines of the status file and its metrics (membership.h).
#include "common/cluster/membership.h"

#include <string>

#include <fmt/format.h>

#include "common/obs/log.h"
#include "common/obs/metrics_text.h"

namespace rdmaswap {

Membership::Counters Membership::counters() const
{
	std::lock_guard lock(mu_);
	Counters c = counters_;
	c.known = index_.size();
	c.registered = 0;
	for (const auto &e : entries_)
		c.registered += e.used && e.registered;
	return c;
}

std::string Membership::status_text() const
{
	const Counters c = counters();
	std::string out;
	auto kv = [&](const char *k, uint64_t v) { out += fmt::format("{}={}\n", k, v); };
	kv("membership_known", c.known);
	kv("membership_registered", c.registered);
	kv("membership_aged_out", c.aged_out);
	kv("membership_probes_ok", c.probes_ok);
	kv("membership_probes_failed", c.probes_failed);
	kv("etcd_ignored_invalid", c.ignored_invalid);
	kv("etcd_ignored_too_large", c.ignored_too_large);
	kv("etcd_ignored_beyond", c.ignored_beyond);
	kv("etcd_ignored_unsigned", c.ignored_unsigned);
	kv("etcd_ignored_bad_cert", c.ignored_bad_cert);
	kv("etcd_ignored_bad_signature", c.ignored_bad_signature);
	kv("etcd_ignored_replayed", c.ignored_replayed);
	kv("etcd_holders_ignored", c.holders_ignored);
	kv("etcd_boot_id_disbelieved", c.boot_id_disbelieved);
	kv("etcd_events", c.events);
	kv("etcd_listings", c.listings);
	return out;
}

std::string Membership::metrics_text() const
{
	const Counters c = counters();
	MetricsText m;
	m.single("rdmaswap_volume_donors_known", "gauge",
		 "Donors in the membership's table (server=, registered, connected).", c.known);
	m.single("rdmaswap_volume_donors_registered", "gauge",
		 "Of the donors known, those registered in etcd now.", c.registered);
	m.family("rdmaswap_volume_donor_probes_total", "counter",
		 "Probes of donors before they join the donor set, by result.");
	m.sample("rdmaswap_volume_donor_probes_total", {{"result", "ok"}}, c.probes_ok);
	m.sample("rdmaswap_volume_donor_probes_total", {{"result", "failed"}}, c.probes_failed);
	m.family("rdmaswap_volume_etcd_ignored_total", "counter",
		 "Donor entries in etcd ignored, by reason (malformed, larger than 4096 bytes, "
		 "beyond the bounds of a listing or of the table; with donor-ca= unsigned, a "
		 "certificate refused, a bad signature, a replay of an older registration).");
	m.sample("rdmaswap_volume_etcd_ignored_total", {{"reason", "invalid"}}, c.ignored_invalid);
	m.sample("rdmaswap_volume_etcd_ignored_total", {{"reason", "too_large"}},
		 c.ignored_too_large);
	m.sample("rdmaswap_volume_etcd_ignored_total", {{"reason", "beyond"}}, c.ignored_beyond);
	m.sample("rdmaswap_volume_etcd_ignored_total", {{"reason", "unsigned"}},
		 c.ignored_unsigned);
	m.sample("rdmaswap_volume_etcd_ignored_total", {{"reason", "bad_cert"}},
		 c.ignored_bad_cert);
	m.sample("rdmaswap_volume_etcd_ignored_total", {{"reason", "bad_signature"}},
		 c.ignored_bad_signature);
	m.sample("rdmaswap_volume_etcd_ignored_total", {{"reason", "replayed"}},
		 c.ignored_replayed);
	m.single("rdmaswap_volume_etcd_holders_ignored_total", "counter",
		 "Copies of the volume's holders record in etcd ignored at start: not signed by "
		 "the volume key.",
		 c.holders_ignored);
	m.single("rdmaswap_volume_etcd_boot_id_disbelieved_total", "counter",
		 "New boot ids in etcd that the donor itself contradicted (its session is there).",
		 c.boot_id_disbelieved);
	m.single("rdmaswap_volume_etcd_events_total", "counter",
		 "Watch events of the donors' prefix applied.", c.events);
	m.single("rdmaswap_volume_etcd_listings_total", "counter",
		 "Listings of the donors' prefix (the start's, after a compaction or a watch "
		 "message too large).",
		 c.listings);
	return m.take();
}

} // namespace rdmaswap
