// SPDX-License-Identifier: MIT
// A small etcd v3 client over etcd's JSON gateway (HTTP POST of JSON, keys and values base64):
// leases, put, range (also by prefix), delete, watch; over http:// or https:// (a CA, a client
// certificate) with etcd's user/password auth. Every request has a deadline; errors are values.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/config.h"
#include "common/util/result.h"

namespace rdmaswap::etcd {

// ---- Pure helpers (no network), unit-tested in tests/unit/net/test_etcd.cpp ----

// "http://127.0.0.1:2379,http://[::1]:2379": the endpoints, trimmed of spaces and of a trailing
// '/'. Each must be http:// or https:// followed by HOST:PORT (PORT 1..65535, HOST non-empty;
// an IPv6 host in brackets) and nothing else. Fails, saying why, if the list is empty or one is
// malformed.
Result<std::vector<std::string>> parse_endpoints(std::string_view list);

// The range_end that selects every key starting with `prefix` (the prefix with its last byte
// below 0xff incremented, what follows dropped); "\0" (every key) when the prefix is empty or
// all 0xff bytes.
std::string prefix_range_end(std::string_view prefix);

// One key of a range answer.
struct KeyValue {
	std::string key, value;
	int64_t lease = 0;
	int64_t create_revision = 0, mod_revision = 0, version = 0;
};

// What a call returns: a Result (common/util/result.h) whose `code` is the gRPC status the
// gateway reported (5 NotFound, 14 Unavailable, ...; 0 when the failure was not an answer of
// etcd: a transport error, a timeout, a malformed reply; kTooLarge when the reply or a watch
// message was larger than the caller allows).
using rdmaswap::Ok;
using rdmaswap::Result;
constexpr int kNotFound = 5; // gRPC NOT_FOUND: e.g. "requested lease not found"
// gRPC RESOURCE_EXHAUSTED, also set by this client (not etcd) for a reply or a watch message
// over its bound: nothing of it was used.
constexpr int kTooLarge = 8;
// gRPC OUT_OF_RANGE: e.g. a range at a revision that was compacted away.
constexpr int kOutOfRange = 11;

// Request bodies (JSON text) of the gateway's calls. int64 ids are written as numbers.
std::string lease_grant_body(int64_t ttl_s);
std::string lease_id_body(int64_t id); // keepalive, revoke
std::string put_body(std::string_view key, std::string_view value, int64_t lease);
// An empty `range_end`: the one key; otherwise [key, range_end).
std::string range_body(std::string_view key, std::string_view range_end);
// A page of [key, range_end): at most `limit` keys (0: no limit), in key order, as the store
// was at `revision` (0: now), the keys alone with `keys_only`.
std::string range_page_body(std::string_view key, std::string_view range_end, int64_t limit,
			    int64_t revision, bool keys_only);

// Reply parsers. Each accepts the gateway's JSON (int64 fields come as strings, absent fields
// mean 0) and turns an {"error":..., "code":...} reply into a failed Result with that code.
struct Lease {
	int64_t id = 0;
	int64_t ttl = 0; // seconds; 0 in a keepalive reply: the lease is gone
};
Result<Lease> parse_lease_grant(std::string_view json);
// The keepalive stream's reply ({"result": {...}}) or a plain one.
Result<Lease> parse_lease_keepalive(std::string_view json);
Result<std::vector<KeyValue>> parse_range(std::string_view json);
// A page of a range (range_page_body): its keys, whether more follow, how many keys the whole
// range holds, and the store's revision the page was read at (the header's).
struct RangePage {
	std::vector<KeyValue> kvs;
	bool more = false;
	int64_t count = 0;
	int64_t revision = 0;
};
Result<RangePage> parse_range_page(std::string_view json);
// Delete: how many keys were deleted.
Result<int64_t> parse_deleterange(std::string_view json);
// put, revoke: only an error matters.
Result<Ok> parse_empty(std::string_view json);

// A watch: the body that creates it (every key in [key, range_end), from `start_revision`, 0:
// from now) and one message of its stream (newline-delimited JSON).
std::string watch_body(std::string_view key, std::string_view range_end, int64_t start_revision);
struct WatchEvent {
	enum class Type { Put, Delete } type = Type::Put;
	KeyValue kv; // a Delete has the key and mod_revision only
};
struct WatchMessage {
	int64_t revision = 0; // the store's revision when it was sent
	bool created = false;  // the first message: the watch exists
	bool canceled = false; // the last one: etcd ended the watch
	// With `canceled`: start_revision was compacted away; read the keys again (a range) and
	// watch from after that read's revision.
	int64_t compact_revision = 0;
	std::string cancel_reason;
	std::vector<WatchEvent> events;
};
Result<WatchMessage> parse_watch_message(std::string_view json);

// gRPC UNAUTHENTICATED: "etcdserver: invalid auth token" (a token etcd no longer knows, or
// none); PERMISSION_DENIED: the user's roles do not allow the request.
constexpr int kUnauthenticated = 16;
constexpr int kPermissionDenied = 7;

// The body of /v3/auth/authenticate ({"name","password"}; it holds the password: never log it).
std::string authenticate_body(std::string_view user, std::string_view password);
// The token of its reply (the "token" field, a non-empty string), or a failed Result whose
// error never quotes the reply (it may hold a token).
Result<std::string> parse_authenticate(std::string_view json);
// Whether an error answer of etcd (unary: its "code" and "error"; a watch: its cancel_reason)
// asks for a new token: "invalid auth token" (Unauthenticated: expired, or etcd restarted and
// forgot it) or "revision of auth store is old" (users or roles changed since the token was
// issued). Then the client authenticates again, once, and repeats the request.
bool token_rejected(int code, std::string_view error);

// The files of EtcdSecurity, read once (at construction, before a process forks or drops
// privileges) and kept in memory for every client made with them; the password and the token
// are wiped when it is destroyed. Shared by every Client of a process (by shared_ptr): the
// token one client obtained serves the others.
class Credentials {
public:
	// Reads and checks every file `s` names (check_etcd_security must have accepted `s`):
	// the CA and the certificate must be PEM certificates, the key a PEM private key that
	// matches the certificate; the key and the password file must be key files (regular,
	// not a symbolic link, owned by this process's user, mode 0600 or stricter; a FIFO is
	// refused without being opened for long). Throws std::runtime_error naming the key and the
	// file ("etcd-key file PATH: ...") and what is wrong.
	explicit Credentials(const EtcdSecurity &s);
	~Credentials();
	Credentials(const Credentials &) = delete;
	Credentials &operator=(const Credentials &) = delete;

	const std::string &cacert_pem() const { return cacert_; } // empty: the system's store
	const std::string &cert_pem() const { return cert_; }     // empty: no client certificate
	const std::string &key_pem() const { return key_; }
	const std::string &user() const { return user_; } // empty: no etcd auth
	const std::string &password() const { return password_; }
	// The token the last authentication gave ("" before one). Thread-safe.
	std::string token() const;
	void set_token(std::string t) const;

private:
	void load(const EtcdSecurity &s);
	std::string cacert_, cert_, key_, user_, password_;
	mutable std::mutex mu_;
	mutable std::string token_; // under mu_
};

// ---- The client ----

struct ClientOptions {
	std::vector<std::string> endpoints; // from parse_endpoints
	// Each attempt on one endpoint (connect, send, whole reply) is bounded by `timeout`, and
	// its connect by `connect_timeout`. A call tries each endpoint at most once.
	std::chrono::milliseconds timeout{2000};
	std::chrono::milliseconds connect_timeout{1000};
	// TLS and etcd auth (null: none, plain http://). With it, https:// endpoints are verified
	// (peer and host name) against its CA (or the system's store), its client certificate is
	// presented, and with a user every request carries the token of /v3/auth/authenticate
	// (obtained at the first request; obtained again once, within the same deadline, when
	// etcd rejects it: token_rejected).
	std::shared_ptr<const Credentials> credentials;
};

// One client, for one thread at a time (it reuses one libcurl handle and its connection; only
// interrupt() and clear_interrupt() may come from another thread). Never
// throws after construction; every call returns within (endpoints × timeout), and within its
// `deadline` when one is given. A call that fails on one endpoint (no connection, a timeout, an
// HTTP error other than an etcd answer, an etcd "Unavailable" such as no leader) tries the next,
// starting from the endpoint that answered last; an answer of etcd (e.g. NotFound) is final.
class Client {
public:
	using Deadline = std::chrono::steady_clock::time_point;
	static constexpr Deadline kNoDeadline = Deadline::max();

	// Throws std::runtime_error only if libcurl cannot be initialised (or lacks TLS with
	// credentials) or `endpoints` is empty.
	explicit Client(ClientOptions opts);
	~Client();
	Client(const Client &) = delete;
	Client &operator=(const Client &) = delete;

	Result<Lease> lease_grant(int64_t ttl_s, Deadline deadline = kNoDeadline);
	// The lease's remaining TTL; ttl == 0 when etcd no longer knows it.
	Result<Lease> lease_keepalive(int64_t id, Deadline deadline = kNoDeadline);
	// Revoking a lease deletes every key attached to it.
	Result<Ok> lease_revoke(int64_t id, Deadline deadline = kNoDeadline);
	// lease 0: no lease. A lease etcd does not know fails with code kNotFound.
	Result<Ok> put(std::string_view key, std::string_view value, int64_t lease = 0,
		       Deadline deadline = kNoDeadline);
	// The one key (an empty vector if absent).
	Result<std::vector<KeyValue>> get(std::string_view key, Deadline deadline = kNoDeadline);
	// Every key starting with `prefix`, in key order.
	Result<std::vector<KeyValue>> get_prefix(std::string_view prefix,
						 Deadline deadline = kNoDeadline);
	// One page of the keys starting with `prefix`, from key `from` on (empty: the first),
	// at most `limit` of them (>= 1), as the store was at `revision` (0: now; a later page
	// passes the first page's, so that the pages make one snapshot: kOutOfRange once it is
	// compacted away), the keys alone with `keys_only`. A reply over `max_reply` bytes fails
	// with code kTooLarge (read no further than that: the caller asks for fewer keys).
	Result<RangePage> get_prefix_page(std::string_view prefix, std::string_view from,
					  int64_t limit, int64_t revision, bool keys_only,
					  size_t max_reply, Deadline deadline = kNoDeadline);
	// How many keys were deleted (0 or 1).
	Result<int64_t> del(std::string_view key, Deadline deadline = kNoDeadline);
	// Watch every key starting with `prefix` from `start_revision` (0: from now), calling
	// `on_message` for each message of the stream (the first says `created`), until
	// `deadline` (required: a watch is one bounded operation; the caller starts the next one
	// from the last revision + 1), `on_message` returns false, etcd cancels the watch (that
	// message is passed on first), interrupt(), or the stream breaks. Ok at the deadline or
	// when `on_message` or etcd ended it; a failure when no endpoint would open the watch or
	// the stream broke or carried a malformed message. Endpoints are tried as for the other
	// calls until one opens the stream. A message larger than `max_message` bytes ends the
	// watch with code kTooLarge (nothing of it is passed on: the caller lost its events and
	// reads the keys again); the bytes buffered stay within that bound.
	Result<Ok> watch_prefix(std::string_view prefix, int64_t start_revision,
				const std::function<bool(const WatchMessage &)> &on_message,
				Deadline deadline, size_t max_message = kMaxMessage);

	// The largest reply (and watch message) a call reads unless it says otherwise.
	static constexpr size_t kMaxMessage = size_t(64) << 20;

	const std::vector<std::string> &endpoints() const { return opts_.endpoints; }

	// From any thread: the call in progress (if any) fails at once with "interrupted", and so
	// does every later call until clear_interrupt(). For a prompt stop of the calling thread.
	void interrupt();
	void clear_interrupt();

private:
	// POST `body` to `path` ("/v3/kv/put"), endpoint after endpoint until one answers. The
	// reply body (any HTTP status) or a failed Result; a reply over `max_reply` bytes fails
	// with code kTooLarge at once (another member would send as much).
	Result<std::string> post(const char *path, const std::string &body, Deadline deadline,
				 size_t max_reply = kMaxMessage);
	// One round of post (each endpoint once); `rejected` set if etcd refused the token.
	Result<std::string> post_once(const char *path, const std::string &body, Deadline deadline,
				      size_t max_reply, bool with_token, bool &rejected);
	// With a user: obtain a token (/v3/auth/authenticate) and keep it in the credentials.
	Result<Ok> authenticate(Deadline deadline);
	// The request headers to send: with the current token when `with_token` and a user.
	void use_headers(bool with_token);
	struct Curl;
	ClientOptions opts_;
	std::unique_ptr<Curl> curl_;
	size_t current_ = 0; // the endpoint tried first
	std::atomic<bool> interrupted_{false};
};

} // namespace rdmaswap::etcd
