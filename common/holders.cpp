// SPDX-License-Identifier: MIT
// The holders record of a volume (holders.h): its text, its file, its key in etcd.
#include "common/holders.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <new>
#include <utility>

#include <fmt/format.h>

#include "common/etcd.h"

namespace rdmaswap::holders {

namespace {

// `donors` sorted by their text, each once.
std::vector<Endpoint> canonical(std::span<const Endpoint> donors)
{
	std::vector<std::pair<std::string, Endpoint>> keyed;
	for (const auto &d : donors)
		keyed.emplace_back(d.str(), d);
	std::sort(keyed.begin(), keyed.end(),
		  [](const auto &a, const auto &b) { return a.first < b.first; });
	keyed.erase(std::unique(keyed.begin(), keyed.end(),
				[](const auto &a, const auto &b) { return a.first == b.first; }),
		    keyed.end());
	std::vector<Endpoint> out;
	for (auto &k : keyed)
		out.push_back(std::move(k.second));
	return out;
}

} // namespace

std::string record_text(std::string_view volume, std::span<const Endpoint> donors)
{
	return discovery::donor_document_text("volume", volume, canonical(donors));
}

std::optional<std::vector<Endpoint>> parse_record(std::string_view text, std::string_view volume,
						  std::string &why)
{
	std::string v;
	auto donors = discovery::parse_donor_document(text, "volume", v, why);
	if (!donors)
		return std::nullopt;
	if (v != volume) {
		why = fmt::format("the record of volume {}, not {}", v, volume);
		return std::nullopt;
	}
	return canonical(*donors);
}

void write_file(const std::string &path, std::string_view volume,
		std::span<const Endpoint> donors)
{
	discovery::write_donor_file(path, "holders record", record_text(volume, donors));
}

std::optional<std::vector<Endpoint>> read_file(const std::string &path, std::string_view volume)
{
	return discovery::read_donor_file(path, "holders record",
					  [&](std::string_view text, std::string &why) {
						  return parse_record(text, volume, why);
					  });
}

std::string default_path(std::string_view default_key_path, std::string_view volume)
{
	return discovery::state_file_path(default_key_path, volume, ".holders");
}

std::string etcd_key(std::string_view prefix, std::string_view volume)
{
	return fmt::format("{}volumes/{}/holders", prefix, discovery::escape_name(volume));
}

std::string put_etcd(const discovery::ListOptions &opts, std::string_view volume,
		     std::span<const Endpoint> donors)
{
	const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
	try {
		etcd::Client client(discovery::client_options(opts));
		auto r = client.put(etcd_key(opts.prefix, volume), record_text(volume, donors), 0,
				    deadline);
		return r ? "" : r.error;
	} catch (const std::bad_alloc &) {
		throw;
	} catch (const std::exception &e) {
		return e.what();
	}
}

EtcdRecord get_etcd(const discovery::ListOptions &opts, std::string_view volume)
{
	const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
	EtcdRecord out;
	try {
		etcd::Client client(discovery::client_options(opts));
		const std::string key = etcd_key(opts.prefix, volume);
		auto r = client.get(key, deadline);
		if (!r) {
			out.why = r.error;
		} else if (r.value->empty()) {
			out.status = EtcdRecord::Status::Absent;
		} else if (auto donors = parse_record(r.value->front().value, volume, out.why)) {
			out.status = EtcdRecord::Status::Found;
			out.donors = std::move(*donors);
		} else {
			out.why = fmt::format("etcd key {}: {}", key, out.why);
		}
	} catch (const std::bad_alloc &) {
		throw;
	} catch (const std::exception &e) {
		out.why = e.what();
	}
	return out;
}

} // namespace rdmaswap::holders
