// SPDX-License-Identifier: MIT
// The holders record of a volume (holders.h): its text, its file, its key in etcd.
#include "common/cluster/holders.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <new>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/net/etcd.h"
#include "common/util/encoding.h"
#include "common/wire/registration.h"

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

constexpr const char *kUnreachable = "unreachable_since";
constexpr int64_t kMaxTime = int64_t(1) << 62;

bool named(std::span<const Endpoint> donors, const std::string &name)
{
	return std::any_of(donors.begin(), donors.end(),
			   [&](const Endpoint &d) { return d.str() == name; });
}

} // namespace

std::string record_text(std::string_view volume, std::span<const Endpoint> donors,
			const Unreachable &unreachable)
{
	const std::vector<Endpoint> sorted = canonical(donors);
	std::string text = discovery::donor_document_text("volume", volume, sorted);
	nlohmann::json since = nlohmann::json::object();
	for (const auto &[name, t] : unreachable)
		if (named(sorted, name))
			since[name] = std::clamp<int64_t>(t, 0, kMaxTime);
	if (since.empty())
		return text; // the format before the field existed
	nlohmann::json o = nlohmann::json::parse(text);
	o[kUnreachable] = std::move(since);
	return o.dump() + "\n";
}

Result<std::vector<Endpoint>> parse_record(std::string_view text, std::string_view volume,
					   Unreachable *unreachable)
{
	using R = Result<std::vector<Endpoint>>;
	if (unreachable)
		unreachable->clear();
	std::string v;
	auto donors = discovery::parse_donor_document(text, "volume", v);
	if (!donors)
		return donors;
	if (v != volume)
		return R::fail(fmt::format("the record of volume {}, not {}", v, volume));
	std::vector<Endpoint> sorted = canonical(*donors);
	// (parse_donor_document read it as a JSON object already.)
	const nlohmann::json o = nlohmann::json::parse(text, nullptr, false);
	if (const auto it = o.find(kUnreachable); it != o.end()) {
		if (!it->is_object())
			return R::fail(fmt::format("\"{}\" is not an object", kUnreachable));
		for (const auto &[name, t] : it->items()) {
			if (!t.is_number_unsigned() || t.get<uint64_t>() > uint64_t(kMaxTime))
				return R::fail(fmt::format("\"{}\" of {} is not an integer 0..2^62",
							   kUnreachable, name));
			if (unreachable && named(sorted, name))
				(*unreachable)[name] = int64_t(t.get<uint64_t>());
		}
	}
	return R::of(std::move(sorted));
}

AgedRecord age_record(std::span<const Endpoint> recorded, std::span<const Endpoint> reached,
		      const Unreachable &unreachable, int64_t now, unsigned lease,
		      size_t max_unreachable)
{
	std::vector<Endpoint> all(recorded.begin(), recorded.end());
	all.insert(all.end(), reached.begin(), reached.end());
	AgedRecord out;
	size_t kept_unreachable = 0;
	for (auto &ep : canonical(all)) { // (by name: the cap keeps the first)
		if (std::find(reached.begin(), reached.end(), ep) != reached.end()) {
			out.donors.push_back(std::move(ep));
			continue;
		}
		const std::string name = ep.str();
		const auto it = unreachable.find(name);
		const int64_t since = it != unreachable.end() ? std::min(it->second, now) : now;
		if (lease == 0 || now - since > int64_t(lease)) {
			out.dropped_lease++;
			continue;
		}
		if (++kept_unreachable > max_unreachable) {
			out.dropped_cap++;
			continue;
		}
		out.unreachable[name] = since;
		out.donors.push_back(std::move(ep));
	}
	return out;
}

void write_file(const std::string &path, std::string_view volume,
		std::span<const Endpoint> donors, const Unreachable &unreachable)
{
	discovery::write_donor_file(path, "holders record", record_text(volume, donors, unreachable));
}

std::optional<std::vector<Endpoint>> read_file(const std::string &path, std::string_view volume,
					       Unreachable *unreachable)
{
	return discovery::read_donor_file(path, "holders record", [&](std::string_view text) {
		return parse_record(text, volume, unreachable);
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

std::vector<std::byte> signed_message(std::string_view key, std::string_view text)
{
	return etcd_signed_message(kHoldersLabel, key, text);
}

std::string signed_text(std::string_view key, std::string_view volume,
			std::span<const Endpoint> donors, const Unreachable &unreachable,
			const VolumeKey &volume_key)
{
	nlohmann::json o = nlohmann::json::parse(record_text(volume, donors, unreachable));
	const VolumeProof sig = volume_key.sign(signed_message(key, o.dump()));
	o["sig"] = base64_encode(
		std::string_view(reinterpret_cast<const char *>(sig.data()), sig.size()));
	return o.dump() + "\n";
}

Result<Ok> verify_signed(std::string_view key, std::string_view text, const VolumePubKey &pub)
{
	using R = Result<Ok>;
	nlohmann::json o = nlohmann::json::parse(text, nullptr, false);
	if (o.is_discarded() || !o.is_object())
		return R::fail("not a JSON object");
	const auto it = o.find("sig");
	if (it == o.end())
		return R::fail("not signed (a plugin before issue 26 wrote it, or someone else did)");
	std::optional<std::string> sig;
	if (it->is_string())
		sig = base64_decode(it->get<std::string>());
	VolumeProof proof{};
	if (!sig || sig->size() != proof.size())
		return R::fail("\"sig\" is not a base64 Ed25519 signature");
	std::memcpy(proof.data(), sig->data(), proof.size());
	o.erase(it);
	std::string unsigned_text;
	try {
		unsigned_text = o.dump();
	} catch (const nlohmann::json::exception &) { // (invalid UTF-8)
		return R::fail("does not re-encode");
	}
	if (!verify_volume_proof(pub, signed_message(key, unsigned_text), proof))
		return R::fail("not signed by this volume's key (changed, copied, or another volume's)");
	return R::of({});
}

Result<Ok> put_etcd(const discovery::ListOptions &opts, std::string_view volume,
		    std::span<const Endpoint> donors, const Unreachable &unreachable,
		    const VolumeKey *volume_key)
{
	const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
	try {
		etcd::Client client(discovery::client_options(opts));
		const std::string key = etcd_key(opts.prefix, volume);
		auto r = client.put(key,
				    volume_key ? signed_text(key, volume, donors, unreachable,
							     *volume_key)
					       : record_text(volume, donors, unreachable),
				    0, deadline);
		return r ? Result<Ok>::of({}) : Result<Ok>::fail(std::move(r.error));
	} catch (const std::bad_alloc &) {
		throw;
	} catch (const std::exception &e) {
		return Result<Ok>::fail(e.what());
	}
}

EtcdRecord get_etcd(const discovery::ListOptions &opts, std::string_view volume,
		    const VolumePubKey *pub)
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
		} else if (auto sig = pub ? verify_signed(key, r.value->front().value, *pub)
					  : Result<Ok>::of({});
			   !sig) {
			out.status = EtcdRecord::Status::Ignored;
			out.why = fmt::format("etcd key {}: {}", key, sig.error);
		} else if (auto donors = parse_record(r.value->front().value, volume,
						      &out.unreachable)) {
			out.status = EtcdRecord::Status::Found;
			out.donors = std::move(*donors);
		} else {
			out.why = fmt::format("etcd key {}: {}", key, donors.error);
		}
	} catch (const std::bad_alloc &) {
		throw;
	} catch (const std::exception &e) {
		out.why = e.what();
	}
	return out;
}

} // namespace rdmaswap::holders
