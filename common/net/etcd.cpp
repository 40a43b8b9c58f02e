// SPDX-License-Identifier: MIT
// The etcd v3 JSON-gateway client of etcd.h: libcurl for HTTP(S), each call bounded by its
// deadline, re-authentication, the watch stream. Its bodies and replies: etcd_json.cpp; its
// credentials: etcd_credentials.cpp.
#include "common/net/etcd.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

#include <curl/curl.h>
#include <nlohmann/json.hpp>
#include <openssl/crypto.h>

#include "common/util/config.h"
#include "common/util/err_text.h"

// CURLOPT_CAINFO_BLOB (7.77.0): the CA is read at construction, not at each connect.
#if LIBCURL_VERSION_NUM < 0x074d00
#error "libcurl 7.77.0 or later is needed (CURLOPT_CAINFO_BLOB)"
#endif

namespace rdmaswap::etcd {

namespace {

using json = nlohmann::json;

// gRPC codes after which another member may do better: Unavailable (no leader, a timeout inside
// etcd, a member stopping) and DeadlineExceeded.
constexpr int kUnavailable = 14, kDeadlineExceeded = 4;
// A call made when its operation's deadline (timeout=) was already spent by earlier calls of
// the same operation, e.g. the first pages of a listing.
constexpr char kDeadlineSpent[] =
	"etcd: the operation's deadline passed before this request was sent (earlier requests of "
	"the same operation took it all)";

} // namespace

// ---- Client ----

namespace {
// Free a header list, wiping its lines first (one holds the token).
void free_headers(curl_slist *l)
{
	for (curl_slist *p = l; p; p = p->next)
		OPENSSL_cleanse(p->data, std::strlen(p->data));
	curl_slist_free_all(l);
}
} // namespace

struct Client::Curl {
	CURL *h = nullptr;
	CURLM *multi = nullptr; // runs `h`, so that interrupt() can wake the wait
	curl_slist *headers = nullptr;      // Content-Type
	curl_slist *auth_headers = nullptr; // Content-Type and Authorization: the token
	std::string auth_token;             // the token in auth_headers
	std::string reply;
	size_t max_reply = Client::kMaxMessage; // for the transfer in progress
	bool too_big = false;
	char errbuf[CURL_ERROR_SIZE] = {}; // libcurl's detail of the last failure
	~Curl()
	{
		if (multi)
			curl_multi_cleanup(multi);
		if (h)
			curl_easy_cleanup(h);
		curl_slist_free_all(headers);
		free_headers(auth_headers);
		OPENSSL_cleanse(auth_token.data(), auth_token.size());
	}
	// What failed: libcurl's detail ("SSL certificate problem: unable to get local issuer
	// certificate") when it gave one, else its text for `rc`.
	std::string error(CURLcode rc) const
	{
		return errbuf[0] ? std::string(errbuf) : std::string(curl_easy_strerror(rc));
	}
	// One transfer of `h`, as curl_easy_perform but abandoned at once when `stop` becomes
	// true (curl_multi_wakeup ends the wait). Bounded by the handle's CURLOPT_TIMEOUT_MS.
	CURLcode perform(const std::atomic<bool> &stop)
	{
		errbuf[0] = '\0';
		if (curl_multi_add_handle(multi, h) != CURLM_OK)
			return CURLE_FAILED_INIT;
		CURLcode result = CURLE_OK;
		for (;;) {
			int running = 0;
			if (curl_multi_perform(multi, &running) != CURLM_OK) {
				result = CURLE_FAILED_INIT;
				break;
			}
			if (!running) {
				int left = 0;
				result = CURLE_FAILED_INIT;
				while (CURLMsg *m = curl_multi_info_read(multi, &left))
					if (m->msg == CURLMSG_DONE && m->easy_handle == h)
						result = m->data.result;
				break;
			}
			if (stop.load()) {
				result = CURLE_ABORTED_BY_CALLBACK;
				break;
			}
			curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
		}
		curl_multi_remove_handle(multi, h);
		return result;
	}
	static size_t write(char *p, size_t size, size_t n, void *self)
	{
		auto *c = static_cast<Curl *>(self);
		if (c->reply.size() + size * n > c->max_reply) {
			c->too_big = true;
			return 0; // curl fails the transfer
		}
		c->reply.append(p, size * n);
		return size * n;
	}
};

Client::Client(ClientOptions opts) : opts_(std::move(opts)), curl_(std::make_unique<Curl>())
{
	if (opts_.endpoints.empty())
		throw std::runtime_error("etcd: no endpoints");
	static std::once_flag once;
	static CURLcode init = CURLE_OK;
	std::call_once(once, [] { init = curl_global_init(CURL_GLOBAL_DEFAULT); });
	if (init != CURLE_OK)
		throw std::runtime_error(std::string("etcd: curl_global_init: ") +
					 curl_easy_strerror(init));
	curl_->h = curl_easy_init();
	curl_->multi = curl_multi_init();
	curl_->headers = curl_slist_append(nullptr, "Content-Type: application/json");
	if (!curl_->h || !curl_->multi || !curl_->headers)
		throw std::runtime_error("etcd: cannot make a libcurl handle");
	CURL *h = curl_->h;
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); // no SIGALRM for timeouts: we have threads
	curl_easy_setopt(h, CURLOPT_NOPROXY, "*"); // etcd is dialled directly, whatever the env
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, curl_->headers);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &Curl::write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, curl_.get());
	curl_easy_setopt(h, CURLOPT_POST, 1L);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_->errbuf);
	// https:// is always verified: the peer's certificate chain and its name (the endpoint's
	// host, e.g. a SAN IP:127.0.0.1), against the CA given or the system's store.
	curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
	if (const Credentials *c = opts_.credentials.get()) {
		auto blob = [&](CURLoption o, const std::string &pem) {
			curl_blob b{const_cast<char *>(pem.data()), pem.size(), CURL_BLOB_COPY};
			return curl_easy_setopt(h, o, &b);
		};
		CURLcode rc = CURLE_OK;
		if (!c->cacert_pem().empty()) {
			rc = blob(CURLOPT_CAINFO_BLOB, c->cacert_pem());
			// That CA only: not the system's directory as well.
			if (rc == CURLE_OK)
				rc = curl_easy_setopt(h, CURLOPT_CAPATH, nullptr);
		}
		if (rc == CURLE_OK && !c->cert_pem().empty()) {
			curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
			curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
			rc = blob(CURLOPT_SSLCERT_BLOB, c->cert_pem());
			if (rc == CURLE_OK)
				rc = blob(CURLOPT_SSLKEY_BLOB, c->key_pem());
		}
		if (rc != CURLE_OK)
			throw std::runtime_error(std::string("etcd: libcurl cannot use the TLS "
							     "credentials: ") +
						 curl_easy_strerror(rc));
	}
}

Client::~Client() = default;

void Client::interrupt()
{
	interrupted_.store(true);
	curl_multi_wakeup(curl_->multi);
}

void Client::clear_interrupt()
{
	interrupted_.store(false);
}

void Client::use_headers(bool with_token)
{
	const Credentials *c = opts_.credentials.get();
	if (!with_token || !c || c->user().empty()) {
		curl_easy_setopt(curl_->h, CURLOPT_HTTPHEADER, curl_->headers);
		return;
	}
	std::string token = c->token();
	if (!curl_->auth_headers || token != curl_->auth_token) {
		free_headers(curl_->auth_headers);
		curl_->auth_headers = nullptr;
		std::string line = "Authorization: " + token;
		curl_slist *l = curl_slist_append(nullptr, "Content-Type: application/json");
		curl_slist *l2 = l ? curl_slist_append(l, line.c_str()) : nullptr;
		OPENSSL_cleanse(line.data(), line.size());
		if (!l2) {
			curl_slist_free_all(l);
			OPENSSL_cleanse(token.data(), token.size());
			throw std::bad_alloc();
		}
		curl_->auth_headers = l2;
		curl_->auth_token.swap(token); // (`token` now holds the old one: wiped below)
	}
	OPENSSL_cleanse(token.data(), token.size());
	curl_easy_setopt(curl_->h, CURLOPT_HTTPHEADER, curl_->auth_headers);
}

Result<Ok> Client::authenticate(Deadline deadline)
{
	const Credentials &c = *opts_.credentials;
	std::string body = authenticate_body(c.user(), c.password());
	bool rejected = false;
	auto reply = post_once("/v3/auth/authenticate", body, deadline, size_t(64) << 10, false,
			       rejected);
	OPENSSL_cleanse(body.data(), body.size());
	if (!reply)
		return Result<Ok>::fail(reply.error + " (authenticating as etcd user " + c.user() + ")",
					reply.code);
	auto token = parse_authenticate(*reply.value);
	OPENSSL_cleanse(reply.value->data(), reply.value->size());
	if (!token) {
		std::string_view why = token.error;
		if (why.starts_with("etcd: "))
			why.remove_prefix(6);
		return Result<Ok>::fail("etcd: authenticating as user " + c.user() + " failed: " +
						std::string(why),
					token.code);
	}
	c.set_token(std::move(*token.value));
	return Result<Ok>{Ok{}, {}, 0};
}

Result<std::string> Client::post(const char *path, const std::string &body, Deadline deadline,
				 size_t max_reply)
{
	const Credentials *c = opts_.credentials.get();
	const bool auth = c && !c->user().empty();
	if (auth && c->token().empty())
		if (auto a = authenticate(deadline); !a)
			return Result<std::string>::fail(std::move(a.error), a.code);
	bool rejected = false;
	auto r = post_once(path, body, deadline, max_reply, auth, rejected);
	if (!rejected)
		return r;
	// The token expired or etcd's users or roles changed: a new one, once, and again.
	if (auto a = authenticate(deadline); !a)
		return Result<std::string>::fail(std::move(a.error), a.code);
	return post_once(path, body, deadline, max_reply, auth, rejected);
}

Result<std::string> Client::post_once(const char *path, const std::string &body,
				      Deadline deadline, size_t max_reply, bool with_token,
				      bool &rejected)
{
	using namespace std::chrono;
	rejected = false;
	use_headers(with_token);
	const size_t n = opts_.endpoints.size();
	std::string last;
	for (size_t k = 0; k < n; k++) {
		if (interrupted_.load())
			return Result<std::string>::fail("etcd: interrupted");
		const size_t i = (current_ + k) % n;
		const std::string url = opts_.endpoints[i] + path;
		auto attempt = opts_.timeout;
		if (deadline != kNoDeadline) {
			const auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
			if (left.count() <= 0)
				return Result<std::string>::fail(
					k == 0 ? std::string(kDeadlineSpent) : last + "; deadline passed");
			attempt = std::min(attempt, left);
		}
		CURL *h = curl_->h;
		curl_->reply.clear();
		curl_->reply.shrink_to_fit(); // (a large reply's buffer is not kept for the next)
		curl_->max_reply = max_reply;
		curl_->too_big = false;
		curl_easy_setopt(h, CURLOPT_URL, url.c_str());
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, long(body.size()));
		curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, long(std::max<int64_t>(1, attempt.count())));
		curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
				 long(std::max<int64_t>(1, std::min(attempt, opts_.connect_timeout)
								   .count())));
		const CURLcode rc = curl_->perform(interrupted_);
		if (rc == CURLE_ABORTED_BY_CALLBACK)
			return Result<std::string>::fail("etcd: interrupted");
		if (curl_->too_big) { // (another member would send as much)
			curl_->reply.clear();
			curl_->reply.shrink_to_fit();
			current_ = i;
			return Result<std::string>::fail("etcd " + url + ": reply larger than " +
								 std::to_string(max_reply) + " bytes",
							 kTooLarge);
		}
		if (rc != CURLE_OK) {
			last = "etcd " + url + ": " + curl_->error(rc);
			continue;
		}
		long status = 0;
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
		if (status == 200) {
			current_ = i;
			return {std::move(curl_->reply), {}, 0};
		}
		// An error answer of etcd is final unless another member may do better.
		json j = json::parse(curl_->reply, nullptr, false);
		int code = -1;
		if (!j.is_discarded() && j.is_object() && j.contains("error"))
			if (auto c = j.find("code"); c != j.end() && c->is_number_integer())
				code = c->get<int>();
		if (code >= 0 && code != kUnavailable && code != kDeadlineExceeded) {
			current_ = i;
			const auto e = j.find("error");
			rejected = with_token && token_rejected(code, e->is_string()
									 ? e->get_ref<const std::string &>()
									 : std::string_view());
			return {std::move(curl_->reply), {}, 0};
		}
		last = "etcd " + url + ": HTTP " + std::to_string(status) + " " +
		       curl_->reply.substr(0, 200);
	}
	// Start the next call where this one would have gone on.
	current_ = (current_ + 1) % n;
	return Result<std::string>::fail(last);
}

namespace {
// The receiving side of one watch stream: splits it into lines, parses and hands them on.
struct WatchStream {
	const std::function<bool(const WatchMessage &)> *on_message;
	size_t max_message;
	std::string buf;
	bool check_token = false; // the watch carries a token: see whether etcd rejected it
	bool too_big = false; // a message over max_message: the stream was cut
	bool got = false;  // a message was parsed: the stream is open
	bool ended = false; // on_message or etcd ended it
	// etcd refused to create the watch (not passed on): the token (authenticate again), or
	// the user's roles (final).
	bool token_rejected = false, denied = false;
	std::string error;
	int code = 0;
	// One line; false to stop the transfer.
	bool line(std::string_view l)
	{
		if (l.find_first_not_of(" \t\r") == std::string_view::npos)
			return true;
		auto m = parse_watch_message(l);
		if (!m) {
			error = m.error;
			code = m.code;
			return false;
		}
		// A watch etcd refused comes as a created-and-cancelled message with the gRPC
		// error as its reason ("rpc error: code = Unauthenticated desc = etcdserver:
		// invalid auth token").
		if (const WatchMessage &wm = *m.value;
		    wm.canceled && wm.compact_revision == 0 && !wm.cancel_reason.empty() && !got) {
			if (check_token && etcd::token_rejected(0, wm.cancel_reason)) {
				token_rejected = true;
				error = "etcd: watch refused: " + wm.cancel_reason;
				code = kUnauthenticated;
				return false;
			}
			if (wm.cancel_reason.find("PermissionDenied") != std::string::npos ||
			    wm.cancel_reason.find("permission denied") != std::string::npos) {
				denied = true;
				error = "etcd: watch refused: " + wm.cancel_reason;
				code = kPermissionDenied;
				return false;
			}
		}
		got = true;
		if (!(*on_message)(*m.value) || m.value->canceled) {
			ended = true;
			return false;
		}
		return true;
	}
	static size_t write(char *p, size_t size, size_t n, void *self)
	{
		auto *w = static_cast<WatchStream *>(self);
		// (What stays buffered below is the start of one message, within max_message: the
		// buffer never holds more than that and one chunk of libcurl's, 16 KiB.)
		w->buf.append(p, size * n);
		size_t nl;
		while ((nl = w->buf.find('\n')) != std::string::npos) {
			const bool go = w->line(std::string_view(w->buf).substr(0, nl));
			w->buf.erase(0, nl + 1);
			if (!go)
				return 0;
		}
		if (w->buf.size() > w->max_message) {
			w->error = "etcd: a watch message larger than " +
				   std::to_string(w->max_message) + " bytes";
			w->code = kTooLarge;
			w->too_big = true;
			w->buf.clear();
			w->buf.shrink_to_fit();
			return 0;
		}
		return size * n;
	}
};

template <class T, class P>
Result<T> call(Result<std::string> reply, P parse)
{
	if (!reply)
		return Result<T>::fail(std::move(reply.error), reply.code);
	return parse(*reply.value);
}
} // namespace

Result<Lease> Client::lease_grant(int64_t ttl_s, Deadline deadline)
{
	return call<Lease>(post("/v3/lease/grant", lease_grant_body(ttl_s), deadline),
			   parse_lease_grant);
}

Result<Lease> Client::lease_keepalive(int64_t id, Deadline deadline)
{
	return call<Lease>(post("/v3/lease/keepalive", lease_id_body(id), deadline),
			   parse_lease_keepalive);
}

Result<Ok> Client::lease_revoke(int64_t id, Deadline deadline)
{
	return call<Ok>(post("/v3/lease/revoke", lease_id_body(id), deadline), parse_empty);
}

Result<Ok> Client::put(std::string_view key, std::string_view value, int64_t lease,
		       Deadline deadline)
{
	return call<Ok>(post("/v3/kv/put", put_body(key, value, lease), deadline), parse_empty);
}

Result<std::vector<KeyValue>> Client::get(std::string_view key, Deadline deadline)
{
	return call<std::vector<KeyValue>>(post("/v3/kv/range", range_body(key, {}), deadline),
					   parse_range);
}

Result<std::vector<KeyValue>> Client::get_prefix(std::string_view prefix, Deadline deadline)
{
	// etcd spells "every key" as key "\0" with range_end "\0".
	const std::string key = prefix.empty() ? std::string(1, '\0') : std::string(prefix);
	return call<std::vector<KeyValue>>(
		post("/v3/kv/range", range_body(key, prefix_range_end(prefix)), deadline),
		parse_range);
}

Result<RangePage> Client::get_prefix_page(std::string_view prefix, std::string_view from,
					  int64_t limit, int64_t revision, bool keys_only,
					  size_t max_reply, Deadline deadline)
{
	std::string key = from.empty() ? std::string(prefix) : std::string(from);
	if (key.empty())
		key = std::string(1, '\0');
	auto reply = post("/v3/kv/range",
			  range_page_body(key, prefix_range_end(prefix), std::max<int64_t>(1, limit),
					  revision, keys_only),
			  deadline, max_reply);
	if (!reply)
		return Result<RangePage>::fail(std::move(reply.error), reply.code);
	return parse_range_page(*reply.value);
}

Result<int64_t> Client::del(std::string_view key, Deadline deadline)
{
	return call<int64_t>(post("/v3/kv/deleterange", range_body(key, {}), deadline),
			     parse_deleterange);
}

} // namespace rdmaswap::etcd

namespace rdmaswap::etcd {

Result<Ok> Client::watch_prefix(std::string_view prefix, int64_t start_revision,
				const std::function<bool(const WatchMessage &)> &on_message,
				Deadline deadline, size_t max_message)
{
	using namespace std::chrono;
	const std::string key = prefix.empty() ? std::string(1, '\0') : std::string(prefix);
	const std::string body = watch_body(key, prefix_range_end(prefix), start_revision);
	const size_t n = opts_.endpoints.size();
	std::string last;
	CURL *h = curl_->h;
	const Credentials *c = opts_.credentials.get();
	const bool auth = c && !c->user().empty();
	if (auth && c->token().empty())
		if (auto a = authenticate(deadline); !a)
			return Result<Ok>::fail(std::move(a.error), a.code);
	bool reauthenticated = false;
	size_t k = 0; // endpoints tried
	while (k < n) {
		if (interrupted_.load())
			return Result<Ok>::fail("etcd: interrupted");
		const auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
		if (left.count() <= 0)
			return Result<Ok>::fail(k == 0 ? std::string(kDeadlineSpent)
						       : last + "; deadline passed");
		const size_t i = (current_ + k) % n;
		const std::string url = opts_.endpoints[i] + "/v3/watch";
		use_headers(auth);
		WatchStream w{&on_message, max_message};
		w.check_token = auth;
		curl_easy_setopt(h, CURLOPT_URL, url.c_str());
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, long(body.size()));
		curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, long(left.count()));
		curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
				 long(std::max<int64_t>(1, std::min(left, opts_.connect_timeout).count())));
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &WatchStream::write);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, &w);
		const CURLcode rc = curl_->perform(interrupted_);
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &Curl::write);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, curl_.get());
		if (rc == CURLE_ABORTED_BY_CALLBACK)
			return Result<Ok>::fail("etcd: interrupted");
		if (w.too_big) {
			current_ = i;
			return Result<Ok>::fail("etcd " + url + ": " + w.error, kTooLarge);
		}
		if (w.denied) {
			current_ = i;
			return Result<Ok>::fail("etcd " + url + ": " + w.error, w.code);
		}
		if (w.token_rejected) {
			current_ = i;
			if (reauthenticated)
				return Result<Ok>::fail("etcd " + url + ": " + w.error, w.code);
			// A new token, once, and the endpoint that gave it first.
			reauthenticated = true;
			if (auto a = authenticate(deadline); !a)
				return Result<Ok>::fail(std::move(a.error), a.code);
			k = 0;
			continue;
		}
		if (w.ended || (w.got && rc == CURLE_OPERATION_TIMEDOUT)) {
			current_ = i;
			return Result<Ok>{Ok{}, {}, 0};
		}
		if (!w.error.empty() && w.got)
			return Result<Ok>::fail(w.error, w.code);
		if (w.got) // the server closed an open stream
			return Result<Ok>::fail("etcd " + url + ": watch stream ended: " +
						(rc == CURLE_OK ? std::string("by the server")
								: std::string(curl_easy_strerror(rc))));
		// Not opened here (no connection, an error answer): the next endpoint.
		if (!w.error.empty())
			last = "etcd " + url + ": " + w.error;
		else if (rc != CURLE_OK)
			last = "etcd " + url + ": " + curl_->error(rc);
		else
			last = "etcd " + url + ": watch not opened: " + w.buf.substr(0, 200);
		k++;
	}
	current_ = (current_ + 1) % n;
	return Result<Ok>::fail(last);
}

} // namespace rdmaswap::etcd
