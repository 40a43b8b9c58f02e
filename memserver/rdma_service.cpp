// SPDX-License-Identifier: MIT
// RdmaService: rdma_cm listener, per-session PD and per-slab MRs, QP lifecycle. The event
// thread handles connection events only and hands each connect request (which may register
// every slab of a session) to the memserver's workers; no CPU work happens per page.
#include "memserver/rdma_service.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <netdb.h>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/net/socket.h"
#include "common/net/verbs.h"
#include "common/obs/log.h"
#include "common/util/err_text.h"
#include "common/util/swap_safety.h"
#include "common/wire/auth.h"
#include "common/wire/rdma_connect.h"
#include "memserver/server.h"
#include "memserver/sessions.h"
#include "memserver/slab_pool.h"
#include "memserver/workers.h"

namespace rdmaswap {

using namespace rdma;

struct RdmaService::Impl {
	// One accepted data QP. Members in creation order (destroyed QP -> CQ -> id).
	struct Conn {
		CmId id;
		Cq cq;
		Qp qp;
		uint64_t session = 0;
		bool established = false;
		bool fenced = false; // moved to the error state: executes nothing more
	};
	// A session's RDMA state: its own PD, and one MR per granted slab in that PD, so an rkey
	// is useless on any other client's QP. Members in creation order (MRs before PD go).
	struct SessionState {
		ibv_context *verbs = nullptr;
		Pd pd;
		std::unordered_map<uint32_t, Mr> mrs;
	};

	Impl(SlabPool &p, SessionTable &s, Memserver &o, WorkerPool &w, bool check)
		: pool(p), sessions(s), owner(o), workers(w), check_attach(check)
	{
	}

	SlabPool &pool;
	SessionTable &sessions;
	Memserver &owner;
	WorkerPool &workers;
	const bool check_attach;
	EventChannel ch;
	CmId listen_id;
	std::mutex mu;
	std::unordered_map<uint64_t, SessionState> states; // destroyed after conns
	std::unordered_map<rdma_cm_id *, std::unique_ptr<Conn>> conns;
	std::atomic<uint32_t> qps{0};
	std::atomic<bool> stop{false};
	std::thread thread;

	void loop();
	// What a worker needs of a connect request (its event is acked by then).
	struct ConnectRequest {
		rdma_cm_id *id = nullptr;        // ours from the event on: accepted or destroyed
		int parsed = EPROTO;             // parse_connect_data() of its private data
		ConnectData cd;
		uint8_t responder_resources = 0;
	};
	// Accept or reject a data QP (on a worker: it may register every slab of the session).
	void on_connect_request(const ConnectRequest &req);
	std::unique_ptr<Conn> take_conn(rdma_cm_id *id);
	int register_slab(SessionState &st, uint32_t slab);
	// Under `mu`: move the QP to the error state (the responder executes no packet after this
	// returns). 0 or an errno.
	static int fence(Conn &c);
	// Under `mu`: fence the QP numbered `qpn` if it is one of `session`'s (a QP of another
	// session is never touched; one we no longer have is destroyed already) and start its
	// disconnect. 0 or an errno.
	int fence_named(uint64_t session, uint32_t qpn);
};

int RdmaService::Impl::fence(Conn &c)
{
	if (c.fenced || !c.qp)
		return 0;
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_ERR;
	if (int rc = ibv_modify_qp(c.qp->qp, &a, IBV_QP_STATE))
		return rc > 0 ? rc : EIO;
	c.fenced = true;
	return 0;
}

int RdmaService::Impl::fence_named(uint64_t session, uint32_t qpn)
{
	for (auto &[id, c] : conns) {
		if (!c->qp || c->qp->qp->qp_num != qpn)
			continue;
		if (c->session != session)
			return 0; // another session's (the number was reused): ours is gone
		if (c->fenced)
			return 0;
		if (int err = fence(*c))
			return err;
		rdma_disconnect(id); // its DISCONNECTED event takes it out (take_conn)
		logger("rdma")->info("RDMA QP {} of session {:016x} fenced: a new connect named it "
				     "(a failed write's)",
				     qpn, session);
		return 0;
	}
	return 0; // not ours any more: destroyed (take_conn fenced it before letting it go)
}

bool RdmaService::devices_present()
{
	return rdma::devices_present();
}

RdmaService::RdmaService(const std::string &listen, uint16_t port, SlabPool &pool,
			 SessionTable &sessions, Memserver &owner, WorkerPool &workers,
			 bool check_attach)
	: impl_(std::make_unique<Impl>(pool, sessions, owner, workers, check_attach))
{
	if (!rdma::devices_present())
		throw std::runtime_error("no RDMA device (for Soft-RoCE: rdma link add rxe0 type rxe "
					 "netdev ETH)");
	impl_->ch = make_event_channel();
	rdma_cm_id *raw = nullptr;
	if (rdma_create_id(impl_->ch.get(), &raw, nullptr, RDMA_PS_TCP))
		throw std::runtime_error(errno_text("rdma_create_id"));
	impl_->listen_id.reset(raw);
	addrinfo hints{};
	hints.ai_family = AF_UNSPEC;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	hints.ai_socktype = SOCK_STREAM;
	addrinfo *res = nullptr;
	const std::string p = std::to_string(port);
	if (int rc = getaddrinfo(listen.c_str(), p.c_str(), &hints, &res))
		throw std::runtime_error("cannot resolve " + listen + ": " + gai_strerror(rc));
	const int rc = rdma_bind_addr(raw, res->ai_addr);
	const int err = errno;
	freeaddrinfo(res);
	if (rc) {
		errno = err;
		throw std::runtime_error(errno_text("rdma_bind_addr") + " on " + listen + ":" + p);
	}
	if (rdma_listen(raw, 64))
		throw std::runtime_error(errno_text("rdma_listen"));
	impl_->thread = std::thread([this] {
		prefault_stack();
		// Its loss leaves no RDMA connect answered: the memserver stops (exception
		// boundaries, docs/architecture.md).
		guarded_thread("rdma", "the RDMA event thread", Memserver::kStops,
			       [this] { impl_->loop(); },
			       impl_->owner.stop_on_failure("the RDMA event thread"));
	});
	logger("rdma")->info("RDMA listening on {}:{}", listen, port);
}

void RdmaService::stop_events()
{
	impl_->stop.store(true);
	if (impl_->thread.joinable())
		impl_->thread.join();
}

RdmaService::~RdmaService()
{
	stop_events();
	std::lock_guard lock(impl_->mu);
	for (auto &[id, c] : impl_->conns)
		rdma_disconnect(id);
	impl_->conns.clear();
	impl_->states.clear();
}

uint32_t RdmaService::qps() const
{
	return impl_->qps.load();
}

int RdmaService::Impl::register_slab(SessionState &st, uint32_t slab)
{
	ibv_mr *mr = ibv_reg_mr(st.pd.get(), pool.slab_base(slab), pool.slab_size(),
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
					IBV_ACCESS_REMOTE_WRITE);
	if (!mr)
		return errno ? errno : ENOMEM;
	st.mrs[slab].reset(mr);
	return 0;
}

int RdmaService::expose_slab(uint64_t session, uint32_t id, uint64_t &addr, uint32_t &rkey)
{
	std::lock_guard lock(impl_->mu);
	auto it = impl_->states.find(session);
	if (it == impl_->states.end() || !it->second.pd)
		return EAGAIN; // no QP attached yet: connect data paths before allocating
	auto &st = it->second;
	if (!st.mrs.count(id))
		if (int err = impl_->register_slab(st, id))
			return err;
	addr = reinterpret_cast<uint64_t>(impl_->pool.slab_base(id));
	rkey = st.mrs[id]->rkey;
	return 0;
}

void RdmaService::unexpose_slab(uint64_t session, uint32_t id)
{
	std::lock_guard lock(impl_->mu);
	auto it = impl_->states.find(session);
	if (it != impl_->states.end())
		it->second.mrs.erase(id); // deregisters: no QP can reach the slab any more
}

void RdmaService::end_session(uint64_t session)
{
	std::lock_guard lock(impl_->mu);
	impl_->states.erase(session);
}

void RdmaService::Impl::on_connect_request(const ConnectRequest &req)
{
	auto log = logger("rdma");
	rdma_cm_id *id = req.id;
	CmId reject_id;                 // destroyed on return (the event was acked already)
	std::vector<uint64_t> leave;    // sessions left on return, without `mu`
	struct LeaveOnReturn {
		Memserver &owner;
		std::vector<uint64_t> &leave;
		~LeaveOnReturn()
		{
			for (uint64_t s : leave)
				owner.leave_session(s); // may call end_session, which takes `mu`
		}
	} leave_on_return{owner, leave};
	auto reject = [&](uint32_t status, const char *why) {
		SockAddr peer;
		if (const sockaddr *sa = rdma_get_peer_addr(id))
			std::memcpy(&peer.ss, sa,
				    sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
		owner.warn_peer(Memserver::PeerEvent::Auth, "refusing RDMA connection from " + peer.str() + ": " + why);
		RejectData r{status};
		rdma_reject(id, &r, sizeof r);
		reject_id.reset(id);
	};
	if (req.parsed) {
		reject(EPROTO, "connect request without session data, or with a bad magic or "
			       "version");
		return;
	}
	const ConnectData &cd = req.cd;
	if (check_attach) {
		// Only a client of an authenticated session knows its attach key. (Version 3: the
		// MAC covers the QPs it names too.)
		Mac key;
		if (!sessions.attach_key(cd.session_id, key)) {
			reject(ENOENT, "unknown session");
			return;
		}
		const auto want = connect_mac(key, cd);
		if (!mac_equal(want, std::as_bytes(std::span(cd.mac)))) {
			reject(EACCES, "attach proof does not match the session (not a client of an "
				       "authenticated session)");
			return;
		}
	}
	if (!owner.room_for_connection()) { // --max-connections counts QPs and TCP connections
		reject(EBUSY, "over --max-connections (TCP connections and RDMA QPs together)");
		return;
	}
	// The join and the session's PD in one step with respect to the other session
	// transitions: a session being detached or ended drops its PD under the same lock, so it
	// never drops the PD of a QP that joined in between (and an ended session is not joined).
	auto life = owner.lifecycle_lock();
	if (!sessions.join(cd.session_id, cd.token)) {
		reject(ENOENT, "unknown session or wrong token");
		return;
	}
	std::lock_guard lock(mu);
	auto fail = [&](uint32_t status, const std::string &why) {
		reject(status, why.c_str());
		leave.push_back(cd.session_id);
	};
	SessionState &st = states[cd.session_id];
	if (!st.pd) {
		st.verbs = id->verbs;
		st.pd.reset(ibv_alloc_pd(id->verbs));
		if (!st.pd) {
			fail(ENOMEM, errno_text("ibv_alloc_pd"));
			return;
		}
		for (uint32_t slab : pool.owned_by(cd.session_id))
			if (int err = register_slab(st, slab)) {
				fail(uint32_t(err), "cannot register slab");
				return;
			}
	} else if (st.verbs != id->verbs) {
		fail(EXDEV, "session already uses another RDMA device");
		return;
	}
	// The fence (version 3), once the session is proven ours and before the accept: the QPs
	// of this session it names execute nothing more, so a write the client saw fail cannot
	// land after one it sends on the new QP (docs/architecture.md, "A failed write's outcome").
	for (uint32_t q : cd.replaces)
		if (q)
			if (int err = fence_named(cd.session_id, q)) {
				fail(uint32_t(err), "cannot fence QP " + std::to_string(q) +
							    ": ibv_modify_qp(error state): " +
							    err_text(err));
				return;
			}
	auto c = std::make_unique<Conn>();
	c->id.reset(id);
	c->session = cd.session_id;
	c->cq.reset(ibv_create_cq(id->verbs, 2, nullptr, nullptr, 0));
	if (!c->cq) {
		c->id.release();
		fail(ENOMEM, errno_text("ibv_create_cq"));
		return;
	}
	ibv_qp_init_attr qa{};
	qa.send_cq = c->cq.get();
	qa.recv_cq = c->cq.get();
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 1;
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, st.pd.get(), &qa)) {
		c->cq.reset();
		c->id.release();
		fail(ENOMEM, errno_text("rdma_create_qp"));
		return;
	}
	c->qp.reset(id);
	ibv_device_attr attr{};
	ibv_query_device(id->verbs, &attr);
	// Our QP's number goes back in the accept: a later connect names it to fence it.
	AcceptData ad;
	ad.qp_num = id->qp->qp_num;
	rdma_conn_param cp{};
	cp.responder_resources =
		uint8_t(std::min<int>(req.responder_resources, attr.max_qp_rd_atom));
	cp.initiator_depth = 0;
	cp.rnr_retry_count = 7;
	cp.private_data = &ad;
	cp.private_data_len = sizeof ad;
	// In the table before the accept (still under `mu`): its ESTABLISHED event finds it.
	Conn &ref = *c;
	conns[id] = std::move(c);
	if (rdma_accept(id, &cp)) {
		const std::string why = errno_text("rdma_accept");
		auto gone = std::move(conns[id]);
		conns.erase(id);
		ref.qp.reset();
		ref.cq.reset();
		ref.id.release();
		fail(EIO, why);
		return;
	}
	log->debug("accepted RDMA QP for session {:016x}", cd.session_id);
}

std::unique_ptr<RdmaService::Impl::Conn> RdmaService::Impl::take_conn(rdma_cm_id *id)
{
	std::lock_guard lock(mu);
	auto it = conns.find(id);
	if (it == conns.end())
		return nullptr;
	auto c = std::move(it->second);
	// Out of the table it can no longer be named by a fence: so it executes nothing from now
	// on (it is destroyed outside `mu`). (Best effort: a QP the device lost is dead anyway.)
	(void)fence(*c);
	conns.erase(it);
	if (c->established)
		qps.fetch_sub(1);
	return c;
}

void RdmaService::Impl::loop()
{
	auto log = logger("rdma");
	while (!stop.load()) {
		std::string why;
		rdma_cm_event *ev = next_event(ch.get(), std::chrono::milliseconds(200), why);
		if (!ev)
			continue;
		std::vector<uint64_t> leave;
		std::unique_ptr<Conn> gone;
		switch (ev->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST: {
			// To a worker, in the handshake lane (never behind other control work):
			// joining may register every slab of the session in a new PD, which must
			// not hold up the other connections' events.
			ConnectRequest req;
			req.id = ev->id;
			req.parsed = parse_connect_data(ev->param.conn.private_data,
							ev->param.conn.private_data_len, req.cd);
			req.responder_resources = ev->param.conn.responder_resources;
			workers.submit(WorkerPool::Lane::Handshake,
				       [this, req] { on_connect_request(req); });
			break;
		}
		case RDMA_CM_EVENT_ESTABLISHED: {
			std::lock_guard lock(mu);
			auto it = conns.find(ev->id);
			if (it != conns.end() && !it->second->established) {
				it->second->established = true;
				qps.fetch_add(1);
			}
			break;
		}
		case RDMA_CM_EVENT_DISCONNECTED:
		case RDMA_CM_EVENT_REJECTED:
		case RDMA_CM_EVENT_CONNECT_ERROR:
		case RDMA_CM_EVENT_UNREACHABLE:
			gone = take_conn(ev->id);
			break;
		case RDMA_CM_EVENT_DEVICE_REMOVAL:
			log->error("RDMA device removed");
			gone = take_conn(ev->id);
			break;
		default:
			break;
		}
		rdma_ack_cm_event(ev);
		if (gone) {
			leave.push_back(gone->session);
			rdma_disconnect(gone->id.get());
			gone.reset();
			log->debug("RDMA QP of session {:016x} closed", leave.back());
		}
		// Cheap: an ended session's slabs are zeroed by the pool's scrubber, not here.
		for (uint64_t s : leave)
			owner.leave_session(s); // may call end_session, which takes `mu`
	}
}

} // namespace rdmaswap
