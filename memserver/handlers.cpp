// SPDX-License-Identifier: MIT
// Memserver: one handler per request op, and the table the request loop dispatches with.
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "common/obs/log.h"
#include "common/util/encoding.h"
#include "common/util/err_text.h"
#include "common/wire/donor_cert.h"
#include "memserver/conn.h"
#include "memserver/rdma_service.h"

namespace rdmaswap {

namespace {
// The address part of a peer name ("10.0.0.5" of "10.0.0.5:41234", "[::1]" of "[::1]:80").
std::string_view peer_host(std::string_view peer)
{
	const size_t colon = peer.rfind(':');
	return colon == std::string_view::npos ? peer : peer.substr(0, colon);
}
} // namespace

Memserver::Next Memserver::Handlers::reply(Memserver &, Request &r, uint32_t status,
					   std::span<const std::byte> body)
{
	r.replied = true;
	r.status = status;
	if (status)
		return Next::Continue;
	if (body.size() <= r.small.size()) {
		std::copy(body.begin(), body.end(), r.small.begin());
		r.small_len = body.size();
	} else {
		r.big.assign(body.begin(), body.end()); // control path (lists)
	}
	return Next::Continue;
}

const Memserver::Handlers::Entry &Memserver::Handlers::of(proto::Op op)
{
	using proto::Op;
	// Indexed by op number. Entries: handler, allowed before authentication, needs a
	// session, needs the admin key, runs on a worker. READ and WRITE are the loop's own
	// (memserver/loop.cpp): no handler here.
	static const std::array<Entry, 19> table = [] {
		std::array<Entry, 19> t{};
		auto set = [&](Op o, Fn fn, bool before_auth, bool needs_session, bool admin,
			       bool blocking) {
			t[size_t(o)] = Entry{fn, before_auth, needs_session, admin, blocking};
		};
		set(Op::Auth, &auth, true, false, false, false);
		set(Op::AuthProof, &auth_proof, true, false, false, false);
		set(Op::DonorProof, &donor_proof, false, false, false, true); // Ed25519 signing
		set(Op::Hello, &hello, false, false, false, true);     // joins, fences
		set(Op::Alloc, &alloc, false, true, false, true);      // ibv_reg_mr
		set(Op::AllocTagged, &alloc, false, true, false, true);
		set(Op::Free, &free_slab, false, true, false, true);   // zeroes the slab
		set(Op::Read, nullptr, false, true, false, false);
		set(Op::Write, nullptr, false, true, false, false);
		set(Op::List, &list, false, true, false, true);
		set(Op::Bind, &bind, false, true, false, true);        // takeover
		// On the loop: a slab's tag or a floor (mmap-backed), no wait; it is on the write
		// path's fence, and a million of them must cost no allocation each.
		set(Op::SetTag, &set_tag, false, true, false, false);
		// Listing sessions needs none; slabs may be registered (ibv_reg_mr).
		set(Op::VolumeList, &volume_list, false, false, false, true);
		set(Op::GiveBack, &give_back, false, false, true, true);
		set(Op::GiveBackStatus, &give_back_status, false, false, false, false);
		set(Op::Lend, &give_back, false, false, true, true);
		set(Op::Wanted, &wanted, false, true, false, false);
		set(Op::Stats, &stats, false, false, false, false);
		return t;
	}();
	static const Entry none{};
	const size_t i = size_t(op);
	return i < table.size() ? table[i] : none;
}

Memserver::Next Memserver::Handlers::auth(Memserver &m, Request &r)
{
	if (m.opts_.insecure)
		return reply(m, r, EOPNOTSUPP);
	proto::AuthRequest req;
	if (!decode(r, req))
		return Next::Malformed;
	proto::AuthReply out;
	if (!r.c.auth.challenge(req.client_nonce, req.key_id, out.server_nonce, out.server_mac)) {
		m.warn_peer(PeerEvent::Auth,
			    fmt::format("{}: authentication failed: {}; disconnecting", r.c.peer,
					r.c.authed ? "AUTH after authentication"
						   : fmt::format("unknown key (id {:016x})",
								 req.key_id)));
		reply(m, r, EACCES);
		return Next::Close;
	}
	std::array<std::byte, proto::kAuthReplySize> b;
	proto::encode(out, b);
	return reply(m, r, 0, b);
}

Memserver::Next Memserver::Handlers::auth_proof(Memserver &m, Request &r)
{
	if (m.opts_.insecure)
		return reply(m, r, EOPNOTSUPP);
	proto::AuthProofRequest req;
	if (!decode(r, req))
		return Next::Malformed;
	if (r.c.authed || !r.c.auth.verify(req.client_mac)) {
		m.warn_peer(PeerEvent::Auth, r.c.peer + ": authentication failed: " +
				     (r.c.authed ? "AUTH_PROOF after authentication"
						 : "wrong proof (another key?)") +
				     "; disconnecting");
		reply(m, r, EACCES);
		return Next::Close;
	}
	r.c.authed = true;
	const uint64_t id = r.c.auth.key_id();
	r.c.admin = std::any_of(m.opts_.admin_keys.begin(), m.opts_.admin_keys.end(),
				[id](const auto &k) { return k->id() == id; });
	logger("memserver")->debug("{}: authenticated{}", r.c.peer, r.c.admin ? " (admin)" : "");
	return reply(m, r, 0);
}

// DONOR_PROOF: our certificate and the signature, under the certified key, of this
// connection's nonces and the address the client dialled (donor_cert.h). The client checks that
// address against the certificate, so a proof is good for one connection to one address only.
Memserver::Next Memserver::Handlers::donor_proof(Memserver &m, Request &r)
{
	proto::DonorProofRequest req;
	if (!decode(r, req))
		return Next::Malformed;
	if (!m.opts_.donor_key || m.opts_.donor_cert.empty() || m.opts_.insecure)
		return reply(m, r, ENOENT);
	const auto msg = donor_proof_message(r.c.auth.client_nonce(), r.c.auth.server_nonce(),
					     proto::dialled_text(req));
	const Signature sig = donor_sign(*m.opts_.donor_key, msg);
	std::vector<std::byte> out(m.opts_.donor_cert);
	out.insert(out.end(), sig.begin(), sig.end());
	return reply(m, r, 0, out);
}

Memserver::Next Memserver::Handlers::hello(Memserver &m, Request &r)
{
	proto::HelloRequest req;
	if (!decode(r, req))
		return Next::Malformed;
	Conn &c = r.c;
	if (r.session())
		return reply(m, r, EINVAL);
	if (req.want_rdma && !m.rdma_)
		return reply(m, r, EPROTONOSUPPORT);
	SessionTable::Creds cr{req.session_id, req.token};
	if (req.session_id == 0) {
		// --max-peer-sessions: refused before the session exists.
		if (!m.peers_.reserve_session(c.addr)) {
			m.warn_peer(PeerEvent::Limit,
				    fmt::format("{}: HELLO refused (EUSERS): {} sessions created from {} "
						"exist already (--max-peer-sessions)",
						c.peer, m.opts_.max_peer_sessions, c.addr.str()));
			return reply(m, r, EUSERS);
		}
		cr = m.sessions_.create(req.want_rdma, c.auth.attach_key());
		// Counted to its address until it binds a volume (then to the volume's key).
		m.pool_.assign(cr.id, address_owner(c.addr));
		m.peers_.own_session(c.addr, cr.id);
		m.sessions_.set_peer(cr.id, c.peer);
		m.session_info(c.addr, "{}: new session {:016x}{}", c.peer, cr.id,
			       req.want_rdma ? " (rdma)" : "");
	} else if (!m.join_session(req.session_id, req.token)) {
		m.warn_peer(PeerEvent::Auth,
			    c.peer + ": HELLO for an unknown session or with a wrong token");
		return reply(m, r, ENOENT);
	}
	c.session.store(cr.id);
	if (req.replaces) {
		r.busy.unlock(); // fence() may wait for another connection's request
		m.fence(cr.id, req.replaces);
		r.busy.lock();
	}
	proto::HelloReply out;
	out.session_id = cr.id;
	out.token = cr.token;
	out.slab_size = m.pool_.slab_size();
	out.slabs_total = m.pool_.slabs_total();
	out.slabs_free = m.pool_.slabs_free();
	out.max_io = proto::kMaxIo;
	out.server_flags = m.rdma_ ? proto::kServerRdma : 0;
	out.conn_id = c.id;
	random_bytes(c.challenge); // a BIND on this connection must sign it (volume_key.h)
	out.challenge = c.challenge;
	std::array<std::byte, proto::kHelloReplySize> b;
	proto::encode(out, b);
	return reply(m, r, 0, b);
}

Memserver::Next Memserver::Handlers::alloc(Memserver &m, Request &r)
{
	const bool tagged = r.h.op == proto::Op::AllocTagged; // ALLOC that also sets the tag
	proto::AllocTaggedRequest tag;
	if (tagged && !decode(r, tag))
		return Next::Malformed;
	const uint64_t session = r.session();
	bool over_quota = false;
	const auto id = m.pool_.allocate(session, &over_quota);
	if (!id) {
		// Over its owner's quota: ENOSPC as for a full donor, which the plugin answers by
		// placing the slab on another donor (EDQUOT would make it count this one failed).
		if (over_quota)
			m.warn_peer(PeerEvent::Limit,
				    fmt::format("{}: ALLOC refused (ENOSPC): {} holds {} slabs, its "
						"quota (--max-owner-share, --max-owner-slabs)",
						r.c.peer, m.pool_.owner_name(session),
						m.pool_.owner_held(session)));
		return reply(m, r, ENOSPC);
	}
	if (tagged)
		m.pool_.set_tag(*id, session, {tag.chunk, tag.epoch});
	proto::AllocReply out;
	out.slab_id = *id;
	out.length = m.pool_.slab_size();
	// What this client may still take here: the free slabs, or fewer if its quota is nearer.
	out.slabs_free = std::min(m.pool_.slabs_free(), m.pool_.owner_left(session));
	if (m.rdma_ && m.sessions_.wants_rdma(session)) {
		if (int e = m.rdma_->expose_slab(session, *id, out.addr, out.rkey)) {
			m.pool_.release(*id, session);
			logger("memserver")->warn("{}: cannot register slab {} for RDMA: {}",
						  r.c.peer, *id, err_text(e));
			return reply(m, r, uint32_t(e));
		}
	}
	logger("memserver")->debug("{}: granted slab {}", r.c.peer, *id);
	std::array<std::byte, proto::kAllocReplySize> b;
	proto::encode(out, b);
	return reply(m, r, 0, b);
}

Memserver::Next Memserver::Handlers::free_slab(Memserver &m, Request &r)
{
	proto::FreeRequest req;
	if (!decode(r, req))
		return Next::Malformed;
	const uint64_t session = r.session();
	if (!m.pool_.owns(req.slab_id, session))
		return reply(m, r, EACCES);
	if (m.rdma_)
		m.rdma_->unexpose_slab(session, req.slab_id);
	m.pool_.release(req.slab_id, session);
	logger("memserver")->debug("{}: freed slab {}", r.c.peer, req.slab_id);
	return reply(m, r, 0);
}

Memserver::Next Memserver::Handlers::list(Memserver &m, Request &r)
{
	// Control path: the reply is built in a per-request buffer.
	const std::vector<uint32_t> ids = m.pool_.owned_by(r.session());
	std::vector<std::byte> out(4 + 4 * ids.size());
	proto::encode_list(ids, out);
	return reply(m, r, 0, out);
}

Memserver::Next Memserver::Handlers::bind(Memserver &m, Request &r)
{
	proto::BindRequest req;
	if (!decode(r, req))
		return Next::Malformed;
	auto log = logger("memserver");
	const uint64_t session = r.session();
	const std::string name(req.name.data(), strnlen(req.name.data(), req.name.size()));
	// The owner's proof, first: a wrong one binds nothing and touches no slab.
	if (!verify_volume_proof(req.pubkey,
				 bind_proof_message(r.c.challenge, session, req.name, req.lease_s,
						    req.pubkey),
				 req.proof)) {
		m.warn_peer(PeerEvent::Auth,
			    fmt::format("{}: BIND of volume {} refused: wrong proof of its volume "
					"key {} (EPERM)",
					r.c.peer, name, hex(req.pubkey)));
		return reply(m, r, EPERM);
	}
	if (req.lease_s > m.opts_.max_lease_s) { // --max-lease: refused before anything changes
		m.warn_peer(PeerEvent::Limit,
			    fmt::format("{}: BIND of volume {} refused (ERANGE): lease {} s is over "
					"--max-lease {} s",
					r.c.peer, name, req.lease_s, m.opts_.max_lease_s));
		return reply(m, r, ERANGE);
	}
	// Scoped to the cluster key the peer proved it holds and to the volume key: another key
	// of either kind never matches (no takeover, no planting).
	const std::string scoped =
		fmt::format("{:016x}/{}/{}", r.c.auth.key_id(), name, hex(req.pubkey));
	// Its quota owner from now on: the volume key. Volume keys are free to mint, so one
	// address binds at most --max-peer-owners distinct ones per period.
	const std::string qowner = key_owner(hex(req.pubkey));
	if (m.owner_window_.max() > 0 &&
	    !m.owner_window_.admit(r.c.addr, qowner, OwnerWindow::Clock::now())) {
		m.warn_peer(PeerEvent::Limit,
			    fmt::format("{}: BIND of volume {} refused (EUSERS): {} has bound {} "
					"other volume keys in the last {} s (--max-peer-owners)",
					r.c.peer, name, r.c.addr.str(), m.owner_window_.max(),
					m.owner_window_.period().count()));
		return reply(m, r, EUSERS);
	}
	// Slabs it took before binding move to the volume key's count (below): not beyond its
	// quota.
	if (m.pool_.check_assign(session, qowner) == EDQUOT) {
		m.warn_peer(PeerEvent::Limit,
			    fmt::format("{}: BIND of volume {} refused (EDQUOT): the session's slabs "
					"would put {} over its quota",
					r.c.peer, name, qowner));
		return reply(m, r, EDQUOT);
	}
	const Bound b = m.bind_volume(session, scoped, name, req.lease_s);
	if (b.bind.err == EBUSY) {
		log->warn("{}: volume {} refused: session of {} still has live connections "
			  "(never two owners)",
			  r.c.peer, name, b.bind.other_peer);
		return reply(m, r, EBUSY);
	}
	if (b.bind.err)
		return reply(m, r, uint32_t(b.bind.err));
	// Bound: the volume key's session from now on (with the slabs of a session it took
	// over: they were the same key's already).
	m.pool_.assign(session, qowner, true);
	proto::BindReply out;
	if (b.bind.took_over) {
		out.reattached = 1;
		out.slabs = b.slabs;
		out.detached_ms = uint64_t(b.bind.detached_for.count());
		m.session_info(r.c.addr,
			       "{}: volume {} reattached: session {:016x} took over {} slabs of "
			       "session {:016x} (detached {} ms)",
			       r.c.peer, name, session, out.slabs, b.bind.took_over, out.detached_ms);
	} else {
		m.session_info(r.c.addr, "{}: session {:016x} bound to volume {} (lease {} s)",
			       r.c.peer, session, name, req.lease_s);
	}
	std::array<std::byte, proto::kBindReplySize> buf;
	proto::encode(out, buf);
	return reply(m, r, 0, buf);
}

Memserver::Next Memserver::Handlers::set_tag(Memserver &m, Request &r)
{
	proto::SetTagRequest req;
	if (!decode(r, req))
		return Next::Malformed;
	const uint64_t session = r.session();
	int status = 0;
	if (req.slab_id == proto::kNoSlab) {
		status = m.sessions_.set_floor(session, req.chunk, req.epoch);
		if (status == ENOSPC)
			m.warn_peer(PeerEvent::Limit,
				    fmt::format("{}: SET_TAG refused (ENOSPC): session {:016x} has "
						"--max-floors {} epoch floors already",
						r.c.peer, session, m.sessions_.max_floors()));
	} else if (!m.pool_.set_tag(req.slab_id, session, {req.chunk, req.epoch}))
		status = EACCES;
	return reply(m, r, uint32_t(status));
}

Memserver::Next Memserver::Handlers::volume_list(Memserver &m, Request &r)
{
	proto::VolumeListRequest req;
	if (!decode(r, req))
		return Next::Malformed;
	// Control path: allocates.
	std::vector<std::byte> out;
	if (req.what == proto::ListWhat::Sessions) { // needs no session
		// An admin sees every session; anyone else those created from its own address
		// (the compute host's own volumes), never other clients' volume names or peers.
		const auto all = m.sessions_.report(SessionTable::Clock::now());
		const std::string_view host = peer_host(r.c.peer);
		const auto page = list_page(
			all,
			[&](const SessionTable::Report &s) {
				return r.c.admin || peer_host(s.peer) == host;
			},
			req.start, proto::kMaxSessionEntries);
		std::vector<proto::SessionEntry> v;
		for (const SessionTable::Report *p : page) {
			const SessionTable::Report &s = *p;
			proto::SessionEntry e;
			e.session = s.id;
			e.slabs = uint32_t(m.pool_.owned_by(s.id).size());
			e.flags = (s.detached ? proto::kSessionDetached : 0) |
				  (s.rdma ? proto::kSessionRdma : 0) |
				  (s.bound ? proto::kSessionBound : 0);
			e.lease_left_ms = uint64_t(s.lease_left.count());
			e.lease_s = s.lease_s;
			e.connections = s.refs;
			std::memcpy(e.volume.data(), s.name.data(),
				    std::min(s.name.size(), e.volume.size()));
			std::memcpy(e.peer.data(), s.peer.data(),
				    std::min(s.peer.size(), e.peer.size() - 1));
			v.push_back(e);
		}
		out.resize(4 + v.size() * proto::kSessionEntrySize);
		proto::encode_entries(v, out);
		return reply(m, r, 0, out);
	}
	const uint64_t session = r.session();
	if (!session)
		return reply(m, r, EACCES);
	std::vector<proto::VolumeEntry> v;
	if (req.what == proto::ListWhat::Floors) {
		for (const auto &[chunk, epoch] :
		     m.sessions_.floors(session, req.start, proto::kMaxVolumeEntries))
			v.push_back(proto::VolumeEntry{proto::kNoSlab, 0, 0, chunk, epoch});
	} else {
		const bool rdma = m.rdma_ && m.sessions_.wants_rdma(session);
		for (uint32_t id : m.pool_.owned_by(session)) {
			if (id < req.start)
				continue;
			if (v.size() >= proto::kMaxVolumeEntries)
				break;
			const SlabPool::Tag t = m.pool_.tag(id);
			proto::VolumeEntry e{id, 0, 0, t.chunk, t.epoch};
			if (rdma)
				if (int err = m.rdma_->expose_slab(session, id, e.addr, e.rkey))
					return reply(m, r, uint32_t(err)); // EAGAIN: attach QPs first
			v.push_back(e);
		}
	}
	out.resize(4 + v.size() * proto::kVolumeEntrySize);
	proto::encode_entries(v, out);
	return reply(m, r, 0, out);
}

Memserver::Next Memserver::Handlers::give_back(Memserver &m, Request &r)
{
	const bool lend = r.h.op == proto::Op::Lend; // the reverse of GIVEBACK
	proto::GiveBackRequest req;
	if (!decode(r, req))
		return Next::Malformed;
	logger("memserver")->info("{}: asked to {} {} bytes", r.c.peer,
				  lend ? "lend again" : "give back", req.bytes);
	std::array<std::byte, proto::kGiveBackReplySize> out;
	proto::encode(lend ? m.lend(req.bytes) : m.give_back(req.bytes), out);
	return reply(m, r, 0, out);
}

Memserver::Next Memserver::Handlers::give_back_status(Memserver &m, Request &r)
{
	std::array<std::byte, proto::kGiveBackReplySize> out;
	proto::encode(m.give_back_status(), out);
	return reply(m, r, 0, out);
}

Memserver::Next Memserver::Handlers::wanted(Memserver &m, Request &r)
{
	// Control path (every client polls it twice a second): when nothing is wanted back, as
	// in steady state, it allocates nothing (tests/alloc counts the whole memserver).
	std::vector<uint32_t> ids = m.pool_.wanted_by(r.session());
	if (ids.empty()) {
		std::array<std::byte, 4> none{};
		proto::encode_list({}, none);
		return reply(m, r, 0, none);
	}
	if (ids.size() > proto::kMaxListIds)
		ids.resize(proto::kMaxListIds);
	std::vector<std::byte> out(4 + 4 * ids.size());
	proto::encode_list(ids, out);
	return reply(m, r, 0, out);
}

Memserver::Next Memserver::Handlers::stats(Memserver &m, Request &r)
{
	std::array<std::byte, proto::kStatsReplySize> out;
	proto::encode(m.stats(), out);
	return reply(m, r, 0, out);
}

} // namespace rdmaswap
