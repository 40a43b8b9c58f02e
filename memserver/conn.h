// SPDX-License-Identifier: MIT
// Private to the memserver: one TCP connection (a state machine over preallocated buffers,
// driven by the event loop that owns it), one control request being applied, the event loop,
// and the per-op handlers (memserver/loop.cpp, memserver/handlers.cpp).
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

#include "common/net/socket.h"
#include "common/wire/auth.h"
#include "common/wire/protocol.h"
#include "common/wire/volume_key.h"
#include "memserver/server.h"
#include "memserver/sessions.h"

namespace rdmaswap {

// What serving one request leads to.
enum class Memserver::Next : uint8_t {
	Continue,  // the next request
	Close,     // the connection ends after its queued replies are sent (reason logged already)
	Malformed, // the body does not decode (Request::malformed says why): warn, then close
};

struct Memserver::Conn {
	// Receive buffer: a few requests with small payloads arrive in one recv. Larger
	// payloads go straight from the socket to the slab.
	static constexpr size_t kRxBuf = 16 * 1024;
	// Replies queued and not yet taken by the peer. When they are all in use, the loop reads
	// no further request from this connection (back-pressure on it alone).
	static constexpr unsigned kTxSlots = 32;
	// The largest reply body kept inline in a slot (HELLO's); larger ones (lists) own a vector.
	static constexpr size_t kSmallReply = 96;

	explicit Conn(std::span<const std::shared_ptr<const AuthKey>> keys) : auth(keys) {}
	Fd fd; // closed only by the loop that owns the connection
	AuthServer auth;
	Clock::time_point accepted = Clock::now();
	std::string peer;
	PeerAddr addr;                       // peer without its port (PeerTable)
	uint64_t id = random_u64();          // told to the client in the HELLO reply
	Loop *loop = nullptr;                // the event loop that owns it (set once)
	std::atomic<uint64_t> session{0};    // set once, by HELLO
	// Held while a request is applied (by the loop for a READ/WRITE's access to the slab,
	// by a worker for a control request), so that fence() can wait for it.
	std::mutex busy;
	std::atomic<bool> fenced{false};     // a reconnect replaced it: apply nothing more
	std::atomic<bool> done{false};       // closed and finished
	// Authentication state: the loop, or the worker applying a control request (never both:
	// the loop does not touch a connection that is parked).
	bool authed = false;
	bool admin = false;                  // authenticated with an admin key (or --insecure)
	Challenge challenge{};               // sent in the HELLO reply; a BIND on it signs it

	// --- Owned by the loop thread.
	std::unique_ptr<std::byte[]> rx;     // kRxBuf bytes
	size_t rx_begin = 0, rx_end = 0;     // unparsed bytes
	bool readable = true;                // the socket may hold more (edge-triggered epoll)
	bool writable = true;
	bool eof = false;                    // the peer closed its side (or an error)
	bool closing = false;                // close once the queued replies are flushed
	bool parked = false;                 // a worker applies a control request of it
	bool cut = false;                    // finished while parked (socket closed already)
	size_t index = 0;                    // in the loop's connection list
	// A WRITE whose payload is arriving: it goes to `dst` (the slab; null: dropped), and the
	// reply (status `status`) is queued when `left` reaches 0.
	struct Payload {
		proto::Header h{};
		std::byte *dst = nullptr;
		uint32_t slab = proto::kNoSlab; // the access to end (kNoSlab: none open)
		uint32_t left = 0;
		uint32_t len = 0;
		uint32_t status = 0;
		bool active = false;
	} payload;
	// Since when the current message has been incomplete (time_point{}: none is).
	Clock::time_point msg_since{};
	// Queued replies: slots [tx_head, tx_head + tx_count) modulo kTxSlots; the first one
	// has `tx_off` bytes sent already.
	struct Tx {
		std::array<std::byte, proto::kHeaderSize + kSmallReply> head;
		uint32_t head_len = 0;
		std::vector<std::byte> big;            // a control reply body larger than kSmallReply
		const std::byte *payload = nullptr;    // a READ's bytes in its slab
		uint32_t payload_len = 0;
		uint32_t slab = proto::kNoSlab;        // the access that ends once it is sent
		Clock::time_point queued{};            // taken whole by then + message timeout
	};
	std::array<Tx, kTxSlots> tx;
	unsigned tx_head = 0, tx_count = 0;
	size_t tx_off = 0;

	// --- A control request handed to a worker (the connection is parked meanwhile).
	proto::Header ctl_h{};
	std::array<std::byte, proto::kMaxFixedBody> ctl_body{};
	size_t ctl_len = 0;
	uint32_t ctl_status = 0;
	std::vector<std::byte> ctl_reply;
	Next ctl_next{};
	bool ctl_replied = false;
	// Set (release) by the worker once the fields above hold its result. A fence may hand
	// the connection to its loop before that: the loop unparks it only when this is set.
	std::atomic<bool> ctl_done{false};
};

// One control request being applied (by a worker, or inline by the loop for the cheap ops):
// its header and fixed body; the reply goes into `status`/`out` (Handlers::reply).
struct Memserver::Request {
	Conn &c;
	const proto::Header &h;
	std::span<const std::byte> body;                // the fixed body
	std::unique_lock<std::mutex> &busy;             // c.busy when applied by a worker
	const char *malformed = nullptr;                // set by Handlers::decode
	uint32_t status = 0;
	bool replied = false;
	std::array<std::byte, Conn::kSmallReply> small{};
	size_t small_len = 0;
	std::vector<std::byte> big;                     // a body larger than kSmallReply
	uint64_t session() const { return c.session.load(std::memory_order_relaxed); }
};

// One function per control op. A handler decodes its body with decode() (Next::Malformed on
// failure: the loop warns and disconnects), applies the request and sets its reply with
// reply(). The loop has already checked authentication, the admin role and, for the ops that
// need one, that the connection has a session (Entry). READ and WRITE are the loop's own.
struct Memserver::Handlers {
	using Fn = Next (*)(Memserver &, Request &);
	struct Entry {
		Fn fn = nullptr;
		bool before_auth = false;   // allowed before the peer authenticated
		bool needs_session = false; // refused with EACCES before HELLO
		bool admin = false;         // refused with EPERM unless the peer is an admin
		// Run on a worker: it may block (register memory, zero a slab, wait for a session
		// transition or another connection). Otherwise the loop applies it at once; those
		// allocate nothing in steady state (WANTED, STATS).
		bool blocking = false;
	};
	// The entry of `op` (every op decode_header accepts has one, READ/WRITE with no fn).
	static const Entry &of(proto::Op op);

	template <class T>
	static bool decode(Request &r, T &out)
	{
		const auto s = proto::decode(r.body, out);
		if (!s.ok)
			r.malformed = s.error;
		return s.ok;
	}
	// Set the reply: `status`, and if it is 0 `body`. Returns Next::Continue.
	static Next reply(Memserver &m, Request &r, uint32_t status,
			  std::span<const std::byte> body = {});

	static Next auth(Memserver &m, Request &r);
	static Next auth_proof(Memserver &m, Request &r);
	static Next donor_proof(Memserver &m, Request &r);
	static Next hello(Memserver &m, Request &r);
	static Next alloc(Memserver &m, Request &r); // ALLOC and ALLOC_TAGGED
	static Next free_slab(Memserver &m, Request &r);
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

namespace rdmaswap {

// One event loop: a thread that serves its connections with epoll (edge-triggered), reading
// every request already queued on a connection before it sleeps and answering them with one
// sendmsg. READ, WRITE and the cheap control ops are applied on the loop; the others go to the
// worker pool, and their connection is parked (nothing more read from it) until they are
// done. docs/architecture.md, "Concurrency model: memserver".
class Memserver::Loop {
public:
	Loop(Memserver &m, unsigned index);
	~Loop(); // join()s
	// Wait for the thread to end: after Memserver::stop_ was set, it closes its connections
	// (those a worker holds once they are handed back) and ends.
	void join();
	Loop(const Loop &) = delete;
	Loop &operator=(const Loop &) = delete;

	// Give a newly accepted connection to this loop (the accept thread).
	void adopt(std::shared_ptr<Conn> c);
	// Hand `c` back to its loop: a worker finished its control request, or fence() asks the
	// loop to close it. Any thread.
	void wake(std::shared_ptr<Conn> c);
	// Connections this loop serves now.
	size_t load() const { return load_.load(std::memory_order_relaxed); }

private:
	void run();
	// Take what other threads handed over (new connections, finished control requests).
	void take_handovers();
	// Read and apply what can be read, then send what is queued, until it would block.
	void serve(Conn &c);
	// Read and apply requests until it would block. True if it stopped only because the
	// reply queue is full (back-pressure).
	bool process_input(Conn &c);
	// One request whose header and fixed body are in c.rx.
	void dispatch(Conn &c, const proto::Header &h, std::span<const std::byte> body);
	void io(Conn &c, const proto::Header &h, std::span<const std::byte> body);
	// Move a WRITE's payload from the socket to its slab. False when it must wait.
	bool pump_payload(Conn &c);
	// recv into c.rx. False when nothing more can be read now (would block, or the end).
	bool fill(Conn &c);
	void queue_reply(Conn &c, const proto::Header &req, uint32_t status,
			 std::span<const std::byte> body = {}, std::vector<std::byte> big = {},
			 const std::byte *payload = nullptr, uint32_t payload_len = 0,
			 uint32_t slab = proto::kNoSlab);
	void flush(Conn &c);
	// A parked connection's socket is ready: send the replies queued before its control
	// request (their slab accesses end as they go out); finish it if its peer is gone.
	void flush_parked(Conn &c);
	// Drop the queued replies, ending the slab accesses they hold.
	void drop_replies(Conn &c);
	// Hand a control request to a worker; the connection is parked until it is back. The
	// loop still sends its queued replies and checks their deadlines meanwhile.
	void park(Conn &c, const proto::Header &h, std::span<const std::byte> body);
	// The worker is done with c's control request: queue its reply, go on with the input.
	void unpark(Conn &c);
	// Close once the queued replies are out (or at once if the peer is gone).
	void close_after_flush(Conn &c) { c.closing = true; }
	// Close now: open slab accesses ended, socket closed (with a reset if `reset`: a peer
	// dropped for being slow), session left (on a worker). A parked connection is cut off:
	// the same at once, but it leaves the loop's list (and its session is left) only when its
	// worker hands it back.
	void finish(Conn &c, bool reset = false);
	// The deadlines of every connection (handshake, message, reply), every kTick; of a
	// parked one, its queued replies'. True if one of them is still running (a handshake,
	// a message partly received, a reply queued): false lets the loop sleep without a tick
	// until its next event (an idle donor's loops cost no wake-ups).
	bool check_deadlines();
	// Its first queued reply was not taken within the message timeout: warn, finish.
	void slow_reader(Conn &c);

	Memserver &m_;
	const unsigned index_;
	char name_[32] = {}; // "event loop N" (its exception boundary's)
	LoopCounters &io_; // this loop's READ/WRITE counters
	Fd ep_, ev_;
	std::thread thread_;
	std::atomic<size_t> load_{0};
	Clock::time_point now_ = Clock::now(); // read once per wake-up
	std::mutex mu_;                          // the handover lists
	std::vector<std::shared_ptr<Conn>> adopted_, woken_;
	// Loop thread only.
	std::vector<std::shared_ptr<Conn>> conns_;
	std::vector<std::shared_ptr<Conn>> handover_, dead_;
	// Connections to serve again at once (they used up their turn with work left).
	std::vector<std::shared_ptr<Conn>> again_, retry_;
};

} // namespace rdmaswap
