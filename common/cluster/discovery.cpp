// SPDX-License-Identifier: MIT
// Donor discovery at start (discovery.h): the registry's entries parsed, merged into server=,
// and cached in a file.
#include "common/cluster/discovery.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/net/etcd.h"
#include "common/obs/log.h"
#include "common/util/encoding.h"
#include "common/util/private_file.h"
#include "common/wire/registration.h"

namespace rdmaswap::discovery {

using nlohmann::json;

namespace {

// HOST:PORT with an explicit port (parse_endpoint without a default port gives port 0).
std::optional<Endpoint> parse_addr(std::string_view s)
{
	auto ep = parse_endpoint(s, 0);
	if (!ep || ep->port == 0)
		return std::nullopt;
	return ep;
}

// An unsigned integer field of `o` that fits `max`; false if of another type, or if absent
// unless `optional` (then `out` is left as it is).
bool get_uint(const json &o, const char *name, uint64_t max, uint64_t &out, std::string &why,
	      bool optional = false)
{
	const auto it = o.find(name);
	if (it == o.end()) {
		if (optional)
			return true;
		why = fmt::format("no \"{}\"", name);
		return false;
	}
	if (!it->is_number_unsigned() || it->get<uint64_t>() > max) {
		why = fmt::format("\"{}\" is not an integer 0..{}", name, max);
		return false;
	}
	out = it->get<uint64_t>();
	return true;
}

const std::string *get_string(const json &o, const char *name, std::string &why)
{
	const auto it = o.find(name);
	if (it == o.end() || !it->is_string()) {
		why = it == o.end() ? fmt::format("no \"{}\"", name)
				    : fmt::format("\"{}\" is not a string", name);
		return nullptr;
	}
	return it->get_ptr<const std::string *>();
}

// `s` with every byte outside 0x20..0x7e written \xNN and `"` and `\` escaped (etcd keys are
// bytes; a log line must stay one line of text).
std::string printable(std::string_view s)
{
	std::string out;
	for (unsigned char c : s) {
		if (c < 0x20 || c > 0x7e || c == '\\' || c == '"')
			out += fmt::format("\\x{:02x}", c);
		else
			out += char(c);
	}
	return out;
}

} // namespace

std::string donors_prefix(std::string_view prefix)
{
	return std::string(prefix) + "donors/";
}

void Ignored::note(std::string_view key, std::string_view why)
{
	if (examples.size() < kExamples)
		examples.push_back(printable(key.substr(0, 200)) + ": " + std::string(why));
}

std::string Ignored::summary() const
{
	if (total() == 0)
		return {};
	std::string parts;
	auto part = [&](uint64_t n, const std::string &what) {
		if (n)
			parts += (parts.empty() ? "" : ", ") + fmt::format("{} {}", n, what);
	};
	part(invalid, "malformed");
	part(too_large, fmt::format("larger than {} bytes", kMaxValue));
	part(beyond, fmt::format("beyond the first {} donors", kMaxListed));
	part(unsigned_, "unsigned");
	part(bad_cert, "with a certificate refused");
	part(bad_signature, "with a bad signature");
	part(replayed, "older than one seen");
	std::string out = fmt::format("{} {} ignored ({})", total(), total() == 1 ? "entry" : "entries",
				      parts);
	for (size_t i = 0; i < examples.size(); i++)
		out += (i ? "; " : ", e.g. ") + examples[i];
	return out;
}

void Ignored::add(const Ignored &o)
{
	invalid += o.invalid;
	too_large += o.too_large;
	beyond += o.beyond;
	unsigned_ += o.unsigned_;
	bad_cert += o.bad_cert;
	bad_signature += o.bad_signature;
	replayed += o.replayed;
	for (const auto &x : o.examples)
		if (examples.size() < kExamples)
			examples.push_back(x);
}

std::optional<Donor> check_donor(std::string_view prefix, std::string_view key,
				 std::string_view value, Ignored &ignored, DonorVerifier *verifier)
{
	if (value.size() > kMaxValue) {
		ignored.too_large++;
		ignored.note(key, fmt::format("a value of {} bytes", value.size()));
		return std::nullopt;
	}
	auto d = parse_donor(prefix, key, value);
	if (!d) {
		ignored.invalid++;
		ignored.note(key, d.error);
		return std::nullopt;
	}
	if (!verifier)
		return std::move(d.value);
	std::string why;
	switch (verify_registration(key, value, *verifier, why)) {
	case RegistrationRefusal::None:
		return std::move(d.value);
	case RegistrationRefusal::Unsigned:
		ignored.unsigned_++;
		break;
	case RegistrationRefusal::BadCert:
		ignored.bad_cert++;
		break;
	case RegistrationRefusal::BadSignature:
		ignored.bad_signature++;
		break;
	}
	ignored.note(key, why);
	return std::nullopt;
}

std::optional<Endpoint> donor_key_addr(std::string_view prefix, std::string_view key)
{
	const std::string dir = donors_prefix(prefix);
	if (key.size() <= dir.size() || key.substr(0, dir.size()) != dir)
		return std::nullopt;
	return parse_addr(key.substr(dir.size()));
}

Result<Donor> parse_donor(std::string_view prefix, std::string_view key, std::string_view value)
{
	using R = Result<Donor>;
	std::string why; // (set by the helpers below when they refuse)
	const json o = json::parse(value, nullptr, false);
	if (o.is_discarded() || !o.is_object())
		return R::fail("the value is not a JSON object");
	Donor d;
	const std::string *addr = get_string(o, "addr", why);
	if (!addr)
		return R::fail(std::move(why));
	auto ep = parse_addr(*addr);
	if (!ep)
		return R::fail(fmt::format("\"addr\" {} is not HOST:PORT", json(*addr).dump()));
	d.addr = *ep;
	if (key != donors_prefix(prefix) + *addr)
		return R::fail(fmt::format("the key does not end in its \"addr\" {}", *addr));
	const std::string *boot = get_string(o, "boot_id", why);
	if (!boot)
		return R::fail(std::move(why));
	if (boot->size() != 16 ||
	    !std::all_of(boot->begin(), boot->end(),
			 [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }) ||
	    (d.boot_id = std::stoull(*boot, nullptr, 16)) == 0) {
		return R::fail("\"boot_id\" is not 16 lower-case hex digits (and not 0)");
	}
	const std::string *transport = get_string(o, "transport", why);
	if (!transport)
		return R::fail(std::move(why));
	if (!parse_transport(*transport))
		return R::fail(fmt::format("\"transport\" {} is not tcp, rdma or auto",
					   json(*transport).dump()));
	d.transport = *transport;
	uint64_t total = 0, free = 0, sessions = 0;
	constexpr uint64_t u32 = std::numeric_limits<uint32_t>::max();
	if (!get_uint(o, "slab_size", std::numeric_limits<uint64_t>::max(), d.slab_size, why) ||
	    !get_uint(o, "slabs_total", u32, total, why) ||
	    !get_uint(o, "slabs_free", u32, free, why) ||
	    !get_uint(o, "sessions", u32, sessions, why, true))
		return R::fail(std::move(why));
	if (free > total)
		return R::fail(fmt::format("\"slabs_free\" {} exceeds \"slabs_total\" {}", free, total));
	d.slabs_total = uint32_t(total);
	d.slabs_free = uint32_t(free);
	d.sessions = uint32_t(sessions);
	const auto auth = o.find("auth");
	if (auth == o.end() || !auth->is_boolean())
		return R::fail(auth == o.end() ? "no \"auth\"" : "\"auth\" is not a boolean");
	d.auth = auth->get<bool>();
	uint64_t ts = 0;
	if (!get_uint(o, "ts", uint64_t(1) << 62, ts, why, true))
		return R::fail(std::move(why));
	d.ts = int64_t(ts);
	return R::of(std::move(d));
}

std::vector<Endpoint> merge(std::span<const Endpoint> servers, std::span<const Endpoint> donors)
{
	std::vector<Endpoint> out(servers.begin(), servers.end());
	std::set<std::pair<std::string_view, uint16_t>> named; // (views into `servers`, `donors`)
	for (const auto &e : servers)
		named.emplace(e.host, e.port);
	for (const auto &d : donors)
		if (named.emplace(d.host, d.port).second)
			out.push_back(d);
	return out;
}

std::string donor_document_text(std::string_view field, std::string_view value,
				std::span<const Endpoint> donors)
{
	json list = json::array();
	for (const auto &d : donors)
		list.push_back(d.str());
	return json{{"version", 1}, {field, value}, {"donors", list}}.dump() + "\n";
}

Result<std::vector<Endpoint>> parse_donor_document(std::string_view text, const char *field,
						   std::string &value)
{
	using R = Result<std::vector<Endpoint>>;
	std::string why; // (set by the helpers below when they refuse)
	const json o = json::parse(text, nullptr, false);
	if (o.is_discarded() || !o.is_object())
		return R::fail("not a JSON object");
	const auto version = o.find("version");
	if (version == o.end() || !version->is_number_unsigned() || version->get<uint64_t>() != 1)
		return R::fail("not version 1");
	const std::string *v = get_string(o, field, why);
	if (!v)
		return R::fail(std::move(why));
	value = *v;
	const auto list = o.find("donors");
	if (list == o.end() || !list->is_array())
		return R::fail("no \"donors\" list");
	std::vector<Endpoint> out;
	for (const auto &e : *list) {
		std::optional<Endpoint> ep;
		if (e.is_string())
			ep = parse_addr(e.get<std::string>());
		if (!ep)
			return R::fail(fmt::format("donor {} is not HOST:PORT", e.dump()));
		out.push_back(*ep);
	}
	return R::of(std::move(out));
}

std::string cache_text(std::string_view prefix, std::span<const Endpoint> donors)
{
	return donor_document_text("prefix", prefix, donors);
}

Result<std::vector<Endpoint>> parse_cache(std::string_view text, std::string_view prefix)
{
	std::string p;
	auto donors = parse_donor_document(text, "prefix", p);
	if (donors && p != prefix)
		return Result<std::vector<Endpoint>>::fail(
			fmt::format("written for etcd-prefix={}, not {}", p, prefix));
	return donors;
}

void write_donor_file(const std::string &path, std::string_view what, std::string_view text)
{
	if (auto w = replace_private_file(path, text); !w)
		throw std::runtime_error(fmt::format("cannot write the {} {}: {}", what, path, w.error));
}

std::optional<std::vector<Endpoint>> read_donor_file(const std::string &path, std::string_view what,
						     const DocumentParser &parse)
{
	const auto text = read_small_file(path, kMaxStateFile);
	if (!text)
		throw std::runtime_error(fmt::format("{} {}: {}", what, path, text.error));
	if (!*text)
		return std::nullopt;
	auto donors = parse(**text);
	if (!donors)
		throw std::runtime_error(fmt::format("{} {}: {}", what, path, donors.error));
	return std::move(donors.value);
}

void write_cache(const std::string &path, std::string_view prefix, std::span<const Endpoint> donors)
{
	write_donor_file(path, "donor cache", cache_text(prefix, donors));
}

std::optional<std::vector<Endpoint>> read_cache(const std::string &path, std::string_view prefix)
{
	return read_donor_file(path, "donor cache",
			       [&](std::string_view text) { return parse_cache(text, prefix); });
}

std::string escape_name(std::string_view name)
{
	std::string out;
	for (unsigned char c : name) {
		const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
				   (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
		if (plain)
			out += char(c);
		else
			out += fmt::format("%{:02X}", c);
	}
	return out;
}

std::string state_file_path(std::string_view default_key_path, std::string_view volume,
			    std::string_view suffix)
{
	const size_t slash = default_key_path.rfind('/');
	std::string out = slash == std::string_view::npos
				  ? std::string()
				  : std::string(default_key_path.substr(0, slash + 1));
	return out + escape_name(volume) + std::string(suffix);
}

std::string default_cache_path(std::string_view default_key_path, std::string_view volume)
{
	return state_file_path(default_key_path, volume, ".donors");
}

etcd::ClientOptions client_options(const ListOptions &opts)
{
	using std::chrono::milliseconds;
	return {opts.endpoints, std::min(opts.timeout, milliseconds(2000)),
		std::min(opts.timeout, milliseconds(1000)), opts.credentials};
}

Result<Listing> list_donors(const ListOptions &opts)
{
	using R = Result<Listing>;
	using namespace std::chrono;
	const auto deadline = steady_clock::now() + opts.timeout;
	try {
		etcd::Client client(client_options(opts));
		const std::string dir = donors_prefix(opts.prefix);
		Listing out;
		std::string from; // the next page's first key ("": the prefix's first)
		int64_t limit = kPageKeys;
		size_t scanned = 0;
		bool restarted = false;
		for (;;) {
			auto r = client.get_prefix_page(dir, from, limit, out.revision, false, kPageBytes,
							deadline);
			if (!r && r.code == etcd::kTooLarge && limit > 1) {
				limit = std::max<int64_t>(1, limit / 4); // fewer keys: a smaller page
				continue;
			}
			if (!r && r.code == etcd::kTooLarge) {
				// One entry alone is larger than a page: learn its key, and skip it.
				auto k = client.get_prefix_page(dir, from, 1, out.revision, true, kPageBytes,
								deadline);
				if (!k || k.value->kvs.empty())
					return R::fail(k ? "an entry larger than a page, whose key cannot "
							   "be read"
							 : k.error);
				const std::string &key = k.value->kvs[0].key;
				out.ignored.too_large++;
				out.ignored.note(key, fmt::format("an entry of more than {} bytes", kPageBytes));
				from = key + '\0';
				scanned++;
				continue;
			}
			if (!r && r.code == etcd::kOutOfRange && out.revision != 0 && !restarted) {
				// Compacted away between two pages: once more from the start, now.
				out = Listing{};
				from.clear();
				scanned = 0;
				restarted = true;
				continue;
			}
			if (!r)
				return R::fail(r.error);
			const etcd::RangePage &page = *r.value;
			if (out.revision == 0)
				out.revision = page.revision;
			for (const auto &kv : page.kvs) {
				scanned++;
				auto d = check_donor(opts.prefix, kv.key, kv.value, out.ignored,
						     opts.verifier.get());
				if (!d)
					continue;
				if (out.donors.size() < kMaxListed)
					out.donors.push_back(std::move(*d));
				else
					out.ignored.beyond++;
			}
			if (!page.more || page.kvs.empty())
				return R::of(std::move(out));
			if (scanned >= kMaxScanned) {
				// (count: the keys from this page's first on)
				out.ignored.beyond += uint64_t(
					std::max<int64_t>(0, page.count - int64_t(page.kvs.size())));
				return R::of(std::move(out));
			}
			from = page.kvs.back().key + '\0';
			limit = std::min<int64_t>(kPageKeys, limit * 2);
		}
	} catch (const std::exception &e) {
		return R::fail(e.what());
	}
}

Result<Discovered> discover(const DiscoverOptions &opts)
{
	using R = Result<Discovered>;
	const auto &log = logger("discovery");
	const std::string where = donors_prefix(opts.list.prefix);
	Discovered out;
	auto listing = list_donors(opts.list);
	const std::string &why = listing.error;
	if (listing) {
		if (listing->ignored.total())
			log->warn("etcd: {}: {}", where, listing->ignored.summary());
		out.donors.reserve(listing->donors.size());
		for (const auto &d : listing->donors)
			out.donors.push_back(d.addr);
		out.registered = std::move(listing->donors);
		out.ignored = std::move(listing->ignored);
		out.revision = listing->revision;
		log->info("etcd gave {} donor(s) under {}", out.donors.size(), where);
		if (out.donors.empty()) {
			log->warn("etcd lists no donors under {}", where);
		} else {
			try {
				write_cache(opts.cache_path, opts.list.prefix, out.donors);
			} catch (const std::exception &e) {
				log->warn("{} (a start with etcd down will not find these donors)",
					  e.what());
			}
		}
	} else {
		std::optional<std::vector<Endpoint>> cached;
		std::string cache_why = "there is none";
		try {
			cached = read_cache(opts.cache_path, opts.list.prefix);
		} catch (const std::exception &e) {
			cache_why = e.what();
		}
		if (cached) {
			log->warn("etcd is not reachable ({}): using the {} donor(s) of the cache {}",
				  why, cached->size(), opts.cache_path);
			out.source = Discovered::Source::Cache;
			out.donors = std::move(*cached);
		} else if (opts.servers.empty()) {
			return R::fail(fmt::format("etcd is not reachable ({}) and there is no usable "
						   "donor cache ({}: {}), and no server= is given: no "
						   "memserver to use",
						   why, opts.cache_path, cache_why));
		} else {
			log->warn("etcd is not reachable ({}) and there is no usable donor cache ({}: "
				  "{}): using the server= entries only",
				  why, opts.cache_path, cache_why);
			out.source = Discovered::Source::ServersOnly;
		}
	}
	out.servers = merge(opts.servers, out.donors);
	if (out.servers.empty())
		return R::fail(fmt::format("etcd lists no donors under {} and no server= is given: "
					   "no memserver to use",
					   where));
	return R::of(std::move(out));
}

} // namespace rdmaswap::discovery
