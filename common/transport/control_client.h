// SPDX-License-Identifier: MIT
// One request/response exchange bounded by a deadline, and the control connection built on it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/net/socket.h"
#include "common/wire/auth.h"
#include "common/wire/protocol.h"
#include "common/wire/volume_key.h"

namespace rdmaswap {

// Send a request (header + `body`) and read its whole response into `reply` (exactly the reply
// body size of `op`), all by `deadline` (one deadline for the exchange, however the bytes
// trickle). Returns 0, the server's errno for an error response, EPROTO for a malformed or
// mismatched response, ETIMEDOUT at the deadline, ECANCELED on a stop request, or a socket
// errno. `in_step` (may be null) is set true when a whole response was read (0 or the server's
// errno: the connection can carry the next request) and false otherwise (the caller must drop
// the connection). No allocation.
int rpc(int fd, uint64_t request_id, proto::Op op, std::span<const std::byte> body,
	std::span<std::byte> reply, Deadline deadline, bool *in_step = nullptr);
// Same, for a reply of variable length up to reply.size(); its length goes to `reply_len`.
int rpc_var(int fd, uint64_t request_id, proto::Op op, std::span<const std::byte> body,
	    std::span<std::byte> reply, size_t &reply_len, Deadline deadline,
	    bool *in_step = nullptr);

// Connect to a memserver and, with a key (null: an --insecure server), run the mutual
// authentication (common/wire/auth.h), the whole handshake done by `deadline`. `attach` (may be
// null) receives the attach key of a session this connection creates. Returns the socket, or
// an invalid Fd with `err` set: a socket errno, ETIMEDOUT (the handshake was not done by the
// deadline), ECANCELED (stop requested), EACCES (the server refused our proof), EKEYREJECTED
// (the server did not prove it holds our key: an impostor, or a server with another key),
// EOPNOTSUPP (the server runs without authentication), EPROTO (not a memserver), ENOKEY (the
// key carries a donor check, AuthKey::with_donor_check, and the server is not a certified
// donor for `addr`: DONOR_PROOF after AUTH_PROOF, common/wire/donor_cert.h; warned, naming why).
Fd connect_memserver(const SockAddr &addr, Deadline deadline, const AuthKey *key, Mac *attach,
		     int &err);
// Operator-facing text for an error of connect_memserver or of the first call on it.
std::string connect_error_text(int err);

// The control connection of one client to one memserver. Thread-safe; calls are serialised on
// mu_, which a call holds for its whole exchange. Each call is done within `timeout` in all:
// the reconnect it may need (connect, AUTH, AUTH_PROOF, HELLO), the request and its whole reply
// (one deadline, not per syscall; a stop request ends it at once with ECANCELED). Any transport failure or timeout
// closes the socket (the stream may be out of step) and marks the outcome unknown; the next
// call reconnects (and, when a session was established, rejoins it; if the server no longer
// knows the session, calls fail with ENOENT and session_lost() becomes true).
class ControlClient {
public:
	// `key`: the cluster key, or null for a memserver run with --insecure.
	ControlClient(SockAddr addr, std::chrono::milliseconds timeout,
		      std::shared_ptr<const AuthKey> key);

	// Connect and create a new session (want_rdma as given). 0 or errno.
	int open_session(bool want_rdma, proto::HelloReply &reply);
	int alloc(proto::AllocReply &reply);
	int free_slab(uint32_t id);
	// The slabs this session holds, into `ids`; returns the count or -errno.
	long list(std::span<uint32_t> ids);
	// STATS needs no session: usable right after construction.
	int stats(proto::StatsReply &reply);
	// Reattach (protocol.h): BIND, ALLOC_TAGGED, SET_TAG. 0 or errno.
	// BIND binds the session to volume key.name() and proves it holds `key`: the proof signs
	// the challenge of the connection the request goes out on (after any reconnect) and our
	// session id. EPERM: the server refused the proof.
	int bind(const VolumeKey &key, uint32_t lease_s, proto::BindReply &reply);
	int alloc_tagged(uint64_t chunk, uint64_t epoch, proto::AllocReply &reply);
	int set_tag(uint32_t slab_id, uint64_t chunk, uint64_t epoch);
	// One VOLUME_LIST page into `out` (resized to the entries). 0 or errno. Control path
	// (allocates).
	int volume_list(proto::ListWhat what, uint64_t start, std::vector<proto::VolumeEntry> &out);
	int sessions(uint64_t start, std::vector<proto::SessionEntry> &out);
	// Give-back (no session needed): withdraw `bytes` of the server's capacity, or only
	// report how much is withdrawn and pending. 0 or errno.
	int give_back(uint64_t bytes, proto::GiveBackReply &reply);
	int give_back_status(proto::GiveBackReply &reply);
	// LEND (admin): re-offer up to `bytes` of withdrawn capacity. 0 or errno (EPERM: this
	// connection did not authenticate with the memserver's admin key).
	int lend(uint64_t bytes, proto::GiveBackReply &reply);

	// True after a call failed in a way that leaves its outcome unknown (the request may
	// have been executed by the server: timeout, connection lost). Cleared by the caller.
	// Atomic: set_outcome_unknown() never waits (not even for a call in flight).
	bool outcome_unknown() const { return unknown_.load(); }
	void clear_outcome_unknown() { unknown_.store(false); }
	void set_outcome_unknown() { unknown_.store(true); }

	uint64_t session_id() const { return session_id_; }
	uint64_t token() const { return token_; }
	// The attach key of our session (zeros without a key): RDMA connects prove it.
	const Mac &attach_key() const { return attach_; }
	bool session_lost() const { return lost_.load(); }
	const SockAddr &addr() const { return addr_; }
	// Close the connection for good (after a call in progress ends): every later call fails
	// with ENOTCONN at once and nothing reconnects. The server detaches our session (kept
	// for its volume's lease when it is bound to one).
	void close();

private:
	int call(proto::Op op, std::span<const std::byte> body, std::span<std::byte> reply,
		 size_t *reply_len = nullptr);
	// GIVEBACK or LEND of `bytes`. 0 or errno.
	int capacity_call(proto::Op op, uint64_t bytes, proto::GiveBackReply &out);
	// The exchange part of call(), on the connection ensure_connected() made, by `deadline`.
	int exchange(proto::Op op, std::span<const std::byte> body, std::span<std::byte> reply,
		     size_t *reply_len, Deadline deadline);
	// One VOLUME_LIST page of `what` from `start` into `out` (at most `max` entries). 0 or errno.
	template <typename Entry>
	int list_page(proto::ListWhat what, uint64_t start, size_t max, std::vector<Entry> &out);
	// call() with a fixed reply body of N bytes decoded into `out`: 0, call()'s errno, or
	// EPROTO for a reply that does not decode (the connection is dropped). Caller holds mu_.
	template <size_t N, typename Reply>
	int call_decode(proto::Op op, std::span<const std::byte> body, Reply &out)
	{
		std::array<std::byte, N> reply;
		if (int r = call(op, body, reply))
			return r;
		if (!proto::decode(reply, out).ok) {
			fd_.reset();
			return EPROTO;
		}
		return 0;
	}
	// Reconnect (and rejoin the session) if needed, the handshake done by `deadline`.
	int ensure_connected(Deadline deadline);

	const SockAddr addr_;
	const std::chrono::milliseconds timeout_;
	const std::shared_ptr<const AuthKey> key_;
	std::mutex mu_;
	Fd fd_;
	uint64_t next_id_ = 1;
	uint64_t session_id_ = 0;
	uint64_t token_ = 0;
	Mac attach_{};
	bool want_rdma_ = false;
	std::atomic<bool> closed_{false};
	uint64_t conn_id_ = 0;
	Challenge challenge_{}; // of the current connection's HELLO reply (BIND signs it)
	std::atomic<bool> lost_{false};    // written under mu_, read by anyone
	std::atomic<bool> unknown_{false}; // set by anyone, cleared by the owner of the outcome
	std::vector<std::byte> list_buf_; // LIST replies (sized once, at the first list())
};

// Connect a new socket (authenticated with `key` unless null) and join an existing session
// with HELLO, fencing connection `replaces` (0: none), the whole handshake (connect, AUTH,
// AUTH_PROOF, HELLO) done by `deadline`. Returns the socket (its id in `conn_id`, the HELLO
// reply's challenge in `challenge` unless null), or an invalid Fd with `err` set (ENOENT: the
// server does not know the session; else as connect_memserver).
Fd join_session(const SockAddr &addr, Deadline deadline, const AuthKey *key, uint64_t session_id,
		uint64_t token, bool want_rdma, uint64_t replaces, uint64_t &conn_id, int &err,
		Challenge *challenge = nullptr);

} // namespace rdmaswap
