// SPDX-License-Identifier: MIT
// The etcd client's pure helpers (etcd.h, "Pure helpers"): its endpoints, and the JSON bodies it
// sends and the replies it parses. No network.
#include "common/net/etcd.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common/util/encoding.h"

namespace rdmaswap::etcd {

namespace {

using json = nlohmann::json;

// An int64 field of a gateway reply: a string of digits (int64 in proto3 JSON), a number, or
// absent (0). Throws on anything else (caught by the parsers).
int64_t int_field(const json &obj, const char *name)
{
	auto it = obj.find(name);
	if (it == obj.end() || it->is_null())
		return 0;
	if (it->is_number_integer())
		return it->get<int64_t>();
	if (it->is_string()) {
		const std::string &s = it->get_ref<const std::string &>();
		size_t used = 0;
		const long long v = std::stoll(s, &used, 10);
		if (used != s.size())
			throw std::invalid_argument(std::string("not an integer: ") + name);
		return v;
	}
	throw std::invalid_argument(std::string("not an integer: ") + name);
}

std::string bytes_field(const json &obj, const char *name)
{
	auto it = obj.find(name);
	if (it == obj.end() || it->is_null())
		return {};
	auto d = base64_decode(it->get_ref<const std::string &>());
	if (!d)
		throw std::invalid_argument(std::string("not base64: ") + name);
	return *d;
}

KeyValue kv_from(const json &kv)
{
	if (!kv.is_object())
		throw std::invalid_argument("a kv is not an object");
	return {bytes_field(kv, "key"),           bytes_field(kv, "value"),
		int_field(kv, "lease"),           int_field(kv, "create_revision"),
		int_field(kv, "mod_revision"),    int_field(kv, "version")};
}

// Parse `text`; a JSON object or nullopt with `why`. An {"error": ...} object is reported as
// a failure with its code.
template <class T> std::optional<json> object_or_error(std::string_view text, Result<T> &fail)
{
	json j = json::parse(text, nullptr, false);
	if (j.is_discarded() || !j.is_object()) {
		fail = Result<T>::fail("etcd: malformed reply: " +
				       std::string(text.substr(0, std::min<size_t>(text.size(), 200))));
		return std::nullopt;
	}
	if (auto e = j.find("error"); e != j.end()) {
		int code = 0;
		if (auto c = j.find("code"); c != j.end() && c->is_number_integer())
			code = c->get<int>();
		fail = Result<T>::fail("etcd: " + (e->is_string() ? e->get<std::string>()
								    : e->dump()),
				       code);
		return std::nullopt;
	}
	return j;
}

template <class T, class F> Result<T> parse_with(std::string_view text, F &&f)
{
	Result<T> r;
	try {
		auto j = object_or_error(text, r);
		if (!j)
			return r;
		r.value = f(*j);
	} catch (const std::exception &e) {
		return Result<T>::fail(std::string("etcd: malformed reply: ") + e.what());
	}
	return r;
}

} // namespace

Result<std::vector<std::string>> parse_endpoints(std::string_view list)
{
	using R = Result<std::vector<std::string>>;
	std::vector<std::string> out;
	size_t pos = 0;
	while (pos <= list.size()) {
		size_t comma = list.find(',', pos);
		if (comma == std::string_view::npos)
			comma = list.size();
		std::string_view e = list.substr(pos, comma - pos);
		pos = comma + 1;
		while (!e.empty() && e.front() == ' ')
			e.remove_prefix(1);
		while (!e.empty() && (e.back() == ' ' || e.back() == '/'))
			e.remove_suffix(1);
		if (e.empty())
			return R::fail("empty etcd endpoint in '" + std::string(list) + "'");
		std::string_view rest = e;
		if (rest.starts_with("http://"))
			rest.remove_prefix(7);
		else if (rest.starts_with("https://"))
			rest.remove_prefix(8);
		else
			return R::fail("etcd endpoint '" + std::string(e) +
				       "' must start with http:// or https://");
		// HOST:PORT with the port required (parse_endpoint's default 0 means none given).
		const auto hp = parse_endpoint(rest, 0);
		if (!hp || hp->port == 0 || hp->host.find_first_of("@?#") != std::string::npos)
			return R::fail("etcd endpoint '" + std::string(e) + "' is not http(s)://HOST:PORT");
		out.emplace_back(e);
	}
	return R::of(std::move(out));
}

std::string prefix_range_end(std::string_view prefix)
{
	std::string end(prefix);
	while (!end.empty()) {
		if (uint8_t(end.back()) < 0xff) {
			end.back() = char(uint8_t(end.back()) + 1);
			return end;
		}
		end.pop_back();
	}
	return std::string(1, '\0');
}

std::string lease_grant_body(int64_t ttl_s)
{
	return json{{"TTL", ttl_s}, {"ID", 0}}.dump();
}

std::string lease_id_body(int64_t id)
{
	return json{{"ID", id}}.dump();
}

std::string put_body(std::string_view key, std::string_view value, int64_t lease)
{
	json j{{"key", base64_encode(key)}, {"value", base64_encode(value)}};
	if (lease)
		j["lease"] = lease;
	return j.dump();
}

std::string range_body(std::string_view key, std::string_view range_end)
{
	json j{{"key", base64_encode(key)}};
	if (!range_end.empty())
		j["range_end"] = base64_encode(range_end);
	return j.dump();
}

std::string range_page_body(std::string_view key, std::string_view range_end, int64_t limit,
			    int64_t revision, bool keys_only)
{
	json j{{"key", base64_encode(key)}};
	if (!range_end.empty())
		j["range_end"] = base64_encode(range_end);
	if (limit > 0)
		j["limit"] = limit;
	if (revision > 0)
		j["revision"] = revision;
	if (keys_only)
		j["keys_only"] = true;
	return j.dump();
}

Result<Lease> parse_lease_grant(std::string_view text)
{
	return parse_with<Lease>(text, [](const json &j) {
		Lease l{int_field(j, "ID"), int_field(j, "TTL")};
		if (l.id == 0 || l.ttl <= 0)
			throw std::invalid_argument("lease grant without an ID or a TTL");
		return l;
	});
}

Result<Lease> parse_lease_keepalive(std::string_view text)
{
	return parse_with<Lease>(text, [](const json &j) {
		const json &r = j.contains("result") ? j.at("result") : j;
		if (!r.is_object())
			throw std::invalid_argument("keepalive result is not an object");
		return Lease{int_field(r, "ID"), std::max<int64_t>(0, int_field(r, "TTL"))};
	});
}

Result<std::vector<KeyValue>> parse_range(std::string_view text)
{
	return parse_with<std::vector<KeyValue>>(text, [](const json &j) {
		std::vector<KeyValue> out;
		auto kvs = j.find("kvs");
		if (kvs == j.end() || kvs->is_null())
			return out;
		if (!kvs->is_array())
			throw std::invalid_argument("kvs is not an array");
		for (const json &kv : *kvs)
			out.push_back(kv_from(kv));
		return out;
	});
}

Result<RangePage> parse_range_page(std::string_view text)
{
	return parse_with<RangePage>(text, [](const json &j) {
		RangePage out;
		if (auto h = j.find("header"); h != j.end() && h->is_object())
			out.revision = int_field(*h, "revision");
		if (auto m = j.find("more"); m != j.end() && !m->is_null()) {
			if (!m->is_boolean())
				throw std::invalid_argument("more is not a boolean");
			out.more = m->get<bool>();
		}
		out.count = int_field(j, "count");
		auto kvs = j.find("kvs");
		if (kvs != j.end() && !kvs->is_null()) {
			if (!kvs->is_array())
				throw std::invalid_argument("kvs is not an array");
			out.kvs.reserve(kvs->size());
			for (const json &kv : *kvs)
				out.kvs.push_back(kv_from(kv));
		}
		return out;
	});
}

Result<int64_t> parse_deleterange(std::string_view text)
{
	return parse_with<int64_t>(text, [](const json &j) { return int_field(j, "deleted"); });
}

Result<Ok> parse_empty(std::string_view text)
{
	return parse_with<Ok>(text, [](const json &) { return Ok{}; });
}

std::string watch_body(std::string_view key, std::string_view range_end, int64_t start_revision)
{
	json c{{"key", base64_encode(key)}};
	if (!range_end.empty())
		c["range_end"] = base64_encode(range_end);
	if (start_revision)
		c["start_revision"] = start_revision;
	return json{{"create_request", c}}.dump();
}

Result<WatchMessage> parse_watch_message(std::string_view text)
{
	return parse_with<WatchMessage>(text, [](const json &j) {
		const json &r = j.contains("result") ? j.at("result") : j;
		if (!r.is_object())
			throw std::invalid_argument("watch result is not an object");
		WatchMessage m;
		if (auto h = r.find("header"); h != r.end() && h->is_object())
			m.revision = int_field(*h, "revision");
		m.created = r.value("created", false);
		m.canceled = r.value("canceled", false);
		m.compact_revision = int_field(r, "compact_revision");
		m.cancel_reason = r.value("cancel_reason", std::string());
		auto ev = r.find("events");
		if (ev == r.end() || ev->is_null())
			return m;
		if (!ev->is_array())
			throw std::invalid_argument("events is not an array");
		for (const json &e : *ev) {
			if (!e.is_object() || !e.contains("kv"))
				throw std::invalid_argument("an event without a kv");
			WatchEvent we;
			const std::string type = e.value("type", std::string("PUT"));
			if (type == "DELETE")
				we.type = WatchEvent::Type::Delete;
			else if (type != "PUT")
				throw std::invalid_argument("unknown event type " + type);
			we.kv = kv_from(e.at("kv"));
			m.events.push_back(std::move(we));
		}
		return m;
	});
}

// ---- Authentication and credentials ----

std::string authenticate_body(std::string_view user, std::string_view password)
{
	return json{{"name", std::string(user)}, {"password", std::string(password)}}.dump();
}

Result<std::string> parse_authenticate(std::string_view text)
{
	json j = json::parse(text, nullptr, false);
	if (j.is_discarded() || !j.is_object())
		return Result<std::string>::fail("etcd: malformed reply to authenticate");
	if (auto e = j.find("error"); e != j.end()) {
		int code = 0;
		if (auto c = j.find("code"); c != j.end() && c->is_number_integer())
			code = c->get<int>();
		return Result<std::string>::fail(
			"etcd: " + (e->is_string() ? e->get<std::string>() : std::string("an error")),
			code);
	}
	auto t = j.find("token");
	if (t == j.end() || !t->is_string() || t->get_ref<const std::string &>().empty())
		return Result<std::string>::fail("etcd: a reply to authenticate without a token");
	std::string token = t->get<std::string>();
	// (A token goes into a header line: one with a line break would add headers.)
	if (token.find_first_of("\r\n") != std::string::npos)
		return Result<std::string>::fail("etcd: a malformed token");
	return {std::move(token), {}, 0};
}

bool token_rejected(int code, std::string_view error)
{
	return code == kUnauthenticated ||
	       error.find("invalid auth token") != std::string_view::npos ||
	       error.find("auth token is expired") != std::string_view::npos ||
	       error.find("revision of auth store is old") != std::string_view::npos;
}

} // namespace rdmaswap::etcd
