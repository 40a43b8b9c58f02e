// SPDX-License-Identifier: MIT
// Private to the memserver: one TCP connection, one request being served, and the per-op
// handlers, shared by the request loop (server.cpp) and the handlers (handlers.cpp).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "common/protocol.h"
#include "common/tcp/socket.h"
#include "common/volume_key.h"
#include "memserver/server.h"
#include "memserver/sessions.h"

namespace rdmaswap {

struct Memserver::Conn {
	explicit Conn(std::span<const std::shared_ptr<const AuthKey>> keys) : auth(keys) {}
	Fd fd;
	AuthServer auth;
	std::chrono::steady_clock::time_point accepted = std::chrono::steady_clock::now();
	std::string peer;
	PeerAddr addr;                       // peer without its port (PeerTable)
	uint64_t id = random_u64();         // told to the client in the HELLO reply
	std::atomic<uint64_t> session{0};   // set once, by HELLO
	std::mutex busy;                     // held while a request is being applied
	std::atomic<bool> fenced{false};     // a reconnect replaced it: apply nothing more
	std::thread thread;
	std::atomic<bool> done{false};
	std::atomic<uint64_t> read_ops{0}, read_bytes{0}, write_ops{0}, write_bytes{0};
	// Only its own thread touches these.
	bool authed = false;
	bool admin = false;                  // authenticated with an admin key (or --insecure)
	Challenge challenge{};               // sent in the HELLO reply; a BIND on it signs it
	std::vector<std::byte> scratch;      // to drain refused WRITE payloads
};

// What serving one request leads to.
enum class Memserver::Next : uint8_t {
	Continue,  // the next request
	Close,     // the connection ends (the reason is logged already, if any)
	Malformed, // the body does not decode (Request::malformed says why): warn, then close
};

// One request: its header and fixed body have arrived; a WRITE's payload has not.
struct Memserver::Request {
	Conn &c;
	const proto::Header &h;
	std::span<const std::byte> body;                // the fixed body
	std::chrono::steady_clock::time_point deadline; // the whole message is due by then
	std::unique_lock<std::mutex> &busy;             // c.busy, held while it is applied
	const char *malformed = nullptr;                // set by Handlers::decode
	uint64_t session() const { return c.session.load(std::memory_order_relaxed); }
};

// One function per op. A handler decodes its body with decode() (Next::Malformed on
// failure: the request loop warns and disconnects), applies the request and replies with
// reply(). The request loop has already checked authentication and, for the ops that need
// one, that the connection has a session (Entry).
struct Memserver::Handlers {
	using Fn = Next (*)(Memserver &, Request &);
	struct Entry {
		Fn fn = nullptr;
		bool before_auth = false;   // allowed before the peer authenticated
		bool needs_session = false; // refused with EACCES before HELLO
		bool admin = false;         // refused with EPERM unless the peer is an admin
	};
	// The entry of `op` (every op decode_header accepts has one).
	static const Entry &of(proto::Op op);

	template <class T>
	static bool decode(Request &r, T &out)
	{
		const auto s = proto::decode(r.body, out);
		if (!s.ok)
			r.malformed = s.error;
		return s.ok;
	}
	// Receive `len` more bytes of the request (a WRITE's payload) by its deadline. Close (and
	// a rate-limited warning for a slow or failing peer) if they do not arrive.
	static Next receive(Memserver &m, Request &r, void *buf, size_t len);
	// Receive and drop the rest of the request (a refused WRITE's payload), keeping the
	// stream in step.
	static Next skip_payload(Memserver &m, Request &r);
	// Send the reply: `status`, and if it is 0 `body` and `payload`, whole within the message
	// timeout. Close if the peer is gone or does not take it in time (warned).
	static Next reply(Memserver &m, Request &r, uint32_t status,
			  std::span<const std::byte> body = {}, const std::byte *payload = nullptr,
			  uint32_t payload_len = 0);

	static Next auth(Memserver &m, Request &r);
	static Next auth_proof(Memserver &m, Request &r);
	static Next hello(Memserver &m, Request &r);
	static Next alloc(Memserver &m, Request &r); // ALLOC and ALLOC_TAGGED
	static Next free_slab(Memserver &m, Request &r);
	static Next io(Memserver &m, Request &r);    // READ and WRITE
	static Next list(Memserver &m, Request &r);
	static Next bind(Memserver &m, Request &r);
	static Next set_tag(Memserver &m, Request &r);
	static Next volume_list(Memserver &m, Request &r);
	static Next give_back(Memserver &m, Request &r); // GIVEBACK and LEND
	static Next give_back_status(Memserver &m, Request &r);
	static Next wanted(Memserver &m, Request &r);
	static Next stats(Memserver &m, Request &r);
};

} // namespace rdmaswap
