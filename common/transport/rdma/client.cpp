// SPDX-License-Identifier: MIT
// RDMA client: device context + PD + registered channel buffers (setup), and RdmaDataPath, an
// RC QP doing one-sided READ/WRITE with preallocated work requests (data path).
#include "common/transport/rdma/client.h"

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "common/net/verbs.h"
#include "common/obs/log.h"
#include "common/transport/data_path_base.h"
#include "common/util/counters.h"
#include "common/util/deadline.h"
#include "common/util/err_text.h"
#include "common/wire/rdma_connect.h"

namespace rdmaswap::rdma {

namespace {
// Writes up to this size go inline in the work request (no DMA read of the local buffer).
constexpr uint32_t kWantInline = 128;
// RDMA READs we may have outstanding on one QP.
constexpr int kMaxReadDepth = 16;
} // namespace

Result<Ok> can_reach(const Endpoint &ep, std::chrono::milliseconds timeout)
{
	try {
		EventChannel ch = make_event_channel();
		rdma_cm_id *raw = nullptr;
		if (rdma_create_id(ch.get(), &raw, nullptr, RDMA_PS_TCP))
			throw std::runtime_error(errno_text("rdma_create_id"));
		CmId id(raw);
		resolve(id.get(), ch.get(), ep.host, ep.port, timeout);
		if (!id->verbs)
			throw std::runtime_error("no RDMA device on the route");
		return Result<Ok>::of({});
	} catch (const std::exception &e) {
		return Result<Ok>::fail(ep.str() + ": " + e.what());
	}
}

struct ClientContext::Impl {
	EventChannel ch;
	CmId probe;
	ibv_context *verbs = nullptr;
	ibv_device_attr attr{};
	Pd pd;
	std::mutex mu; // guards the registration below (setup only)
	Mr mr;
	std::byte *region = nullptr;
	size_t region_len = 0;

	uint32_t lkey_for(std::span<std::byte> r)
	{
		std::lock_guard lock(mu);
		if (!mr) {
			mr.reset(ibv_reg_mr(pd.get(), r.data(), r.size(), IBV_ACCESS_LOCAL_WRITE));
			if (!mr)
				throw std::runtime_error(errno_text("ibv_reg_mr(channel buffers)"));
			region = r.data();
			region_len = r.size();
		} else if (r.data() != region || r.size() != region_len) {
			throw std::logic_error("RDMA data paths must share one registered region");
		}
		return mr->lkey;
	}
};

ClientContext::ClientContext(const Endpoint &probe, std::chrono::milliseconds timeout)
	: impl_(std::make_unique<Impl>())
{
	impl_->ch = make_event_channel();
	rdma_cm_id *raw = nullptr;
	if (rdma_create_id(impl_->ch.get(), &raw, nullptr, RDMA_PS_TCP))
		throw std::runtime_error(errno_text("rdma_create_id"));
	impl_->probe.reset(raw);
	resolve(raw, impl_->ch.get(), probe.host, probe.port, timeout);
	impl_->verbs = raw->verbs;
	if (!impl_->verbs)
		throw std::runtime_error("no RDMA device routes to " + probe.str());
	if (ibv_query_device(impl_->verbs, &impl_->attr))
		throw std::runtime_error(errno_text("ibv_query_device"));
	impl_->pd.reset(ibv_alloc_pd(impl_->verbs));
	if (!impl_->pd)
		throw std::runtime_error(errno_text("ibv_alloc_pd"));
	logger("rdma")->debug("RDMA device {} reaches {}", ibv_get_device_name(impl_->verbs->device),
			      probe.str());
}

ClientContext::~ClientContext() = default;

std::shared_ptr<RdmaSession> make_rdma_session()
{
	return std::make_shared<RdmaSession>();
}

void RdmaSession::add_path()
{
	std::lock_guard lock(mu_);
	room_++;
	list_.reserve(room_);
}

void RdmaSession::unfenced(uint32_t qpn)
{
	std::lock_guard lock(mu_);
	if (std::find(list_.begin(), list_.end(), qpn) != list_.end())
		return;
	if (list_.size() >= room_ || list_.size() == list_.capacity()) {
		poisoned_.store(true); // (never: one entry per path at most) no write goes out again
		count_.store(unsigned(list_.size()) + 1);
		return;
	}
	list_.push_back(qpn); // within the capacity add_path() reserved: no allocation
	count_.store(unsigned(list_.size()) + (poisoned_.load() ? 1 : 0));
}

unsigned RdmaSession::to_name(uint32_t first, std::span<uint32_t> out) const
{
	std::lock_guard lock(mu_);
	unsigned n = 0;
	if (first && n < out.size() && std::find(list_.begin(), list_.end(), first) != list_.end())
		out[n++] = first;
	for (size_t i = 0; i < list_.size() && n < out.size(); i++)
		if (list_[i] != first)
			out[n++] = list_[i];
	return n;
}

void RdmaSession::fenced(std::span<const uint32_t> qpns)
{
	std::lock_guard lock(mu_);
	for (uint32_t q : qpns)
		std::erase(list_, q);
	count_.store(unsigned(list_.size()) + (poisoned_.load() ? 1 : 0));
}

namespace {

class RdmaDataPath final : public DataPathBase {
public:
	RdmaDataPath(ClientContext::Impl &ctx, const Endpoint &ep, uint64_t session_id,
		     uint64_t token, const Mac &attach_key, std::chrono::milliseconds timeout,
		     std::span<std::byte> region, std::shared_ptr<std::atomic<bool>> lost,
		     std::shared_ptr<RdmaSession> session)
		: DataPathBase("rdma", "data path to " + ep.str(), region, std::move(lost)),
		  ctx_(ctx), ep_(ep), session_id_(session_id), token_(token),
		  attach_key_(attach_key), timeout_(timeout), lkey_(ctx.lkey_for(region)),
		  session_(session ? std::move(session) : std::make_shared<RdmaSession>())
	{
		session_->add_path();
		// Throws: the first connection is part of setup (each step bounded by the timeout).
		connect(Deadline::max());
	}

	~RdmaDataPath() override { teardown(); }

	int post_read(const SlabGrant &slab, uint64_t off, uint32_t len, std::byte *local) override
	{
		return post(IBV_WR_RDMA_READ, slab, off, len, local);
	}

	int post_write(const SlabGrant &slab, uint64_t off, uint32_t len,
		       const std::byte *local) override
	{
		return post(IBV_WR_RDMA_WRITE, slab, off, len, const_cast<std::byte *>(local));
	}

	int complete() override;
	DataPathCounters counters() const override;
	uint32_t remote_qpn() const { return qp_ ? remote_qpn_ : 0; }

private:
	// Connect a new QP and rejoin the session by `until` (max: each step within the timeout),
	// naming in `replaces` this path's old QP if it is unfenced, then others of the session.
	// Throws.
	void connect(Deadline until);
	void teardown();
	bool connected() const override { return bool(qp_); }
	int reconnect() override;
	void disconnect() override { teardown(); }
	int post(ibv_wr_opcode op, const SlabGrant &slab, uint64_t off, uint32_t len, std::byte *local);
	// The batch failed: logs, drops the QP (nothing lands in our buffers after this) and
	// latches `err`. `unfenced`: WRITEs of it were posted, so the memserver's QP may still
	// execute them: it goes on the session's list.
	int fail(int err, const char *what, const char *detail, bool unfenced);
	int wait(uint64_t seq, Deadline deadline, bool writes);
	// Before a batch with a WRITE goes out while QPs of the session are unfenced: reconnect
	// this path (whose QP has nothing in flight) naming them, until none is left, by
	// `deadline`. 0 or EIO (the path is then down).
	int fence_session(Deadline deadline);
	// Connect again by `until`, ignoring the backoff if `eager`. 0 or EIO.
	int reconnect_by(Deadline until, bool eager);

	ClientContext::Impl &ctx_;
	const Endpoint ep_;
	const uint64_t session_id_;
	const uint64_t token_;
	const Mac attach_key_;
	const std::chrono::milliseconds timeout_;
	const uint32_t lkey_;
	const std::shared_ptr<RdmaSession> session_;

	// Creation order; destroyed in reverse by teardown().
	EventChannel ch_;
	CmId id_;
	CompChannel comp_;
	Cq cq_;
	Qp qp_;
	uint32_t max_inline_ = 0;
	uint32_t remote_qpn_ = 0;   // the memserver's QP behind qp_ (0: it did not say)
	uint32_t own_unfenced_ = 0; // our last QP's number at the memserver, if it is unfenced
	Deadline connect_until_{};  // reconnect()'s bound when set (else now + the timeout)
	bool warned_no_fence_ = false;

	// Preallocated work requests: filled by post(), chained and posted once by complete().
	std::array<ibv_send_wr, kMaxBatch> wrs_{};
	std::array<ibv_sge, kMaxBatch> sges_{};
	uint64_t seq_ = 0;

	// Accounting (counters()): written by the thread holding the path, read by the status.
	struct {
		SoloCounter posts, doorbells, polls, polls_empty, completions, arms, sleeps, batches;
	} acct_;
};

void RdmaDataPath::connect(Deadline until)
{
	ch_ = make_event_channel();
	rdma_cm_id *raw = nullptr;
	if (rdma_create_id(ch_.get(), &raw, nullptr, RDMA_PS_TCP))
		throw std::runtime_error(errno_text("rdma_create_id"));
	id_.reset(raw);
	resolve(raw, ch_.get(), ep_.host, ep_.port, timeout_, until);
	if (raw->verbs != ctx_.verbs)
		throw std::runtime_error("memserver " + ep_.str() +
					 " is reached through another RDMA device than the first "
					 "server; use one device for all");
	comp_.reset(ibv_create_comp_channel(raw->verbs));
	if (!comp_)
		throw std::runtime_error(errno_text("ibv_create_comp_channel"));
	const int flags = fcntl(comp_->fd, F_GETFL);
	fcntl(comp_->fd, F_SETFL, flags | O_NONBLOCK);
	cq_.reset(ibv_create_cq(raw->verbs, int(2 * kMaxBatch), nullptr, comp_.get(), 0));
	if (!cq_)
		throw std::runtime_error(errno_text("ibv_create_cq"));

	ibv_qp_init_attr qa{};
	qa.send_cq = cq_.get();
	qa.recv_cq = cq_.get();
	qa.qp_type = IBV_QPT_RC;
	qa.sq_sig_all = 0; // selective signaling: only the last WR of a batch is signaled
	qa.cap.max_send_wr = kMaxBatch;
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = kWantInline;
	if (rdma_create_qp(raw, ctx_.pd.get(), &qa)) {
		qa.cap.max_inline_data = 0; // some devices have no inline support
		if (rdma_create_qp(raw, ctx_.pd.get(), &qa))
			throw std::runtime_error(errno_text("rdma_create_qp"));
	}
	qp_.reset(raw);
	max_inline_ = qa.cap.max_inline_data;

	ConnectData cd;
	cd.session_id = session_id_;
	cd.token = token_;
	random_bytes(std::as_writable_bytes(std::span(&cd.cm_nonce, 1)));
	const unsigned named = session_->to_name(own_unfenced_, cd.replaces);
	if (named == 0)
		cd.version = 2; // names nothing: what a memserver of version 2 takes too
	const auto mac = connect_mac(attach_key_, cd);
	std::memcpy(cd.mac, mac.data(), sizeof cd.mac);
	rdma_conn_param cp{};
	cp.private_data = &cd;
	cp.private_data_len = cd.version == 2 ? uint8_t(kConnectDataV2Size) : uint8_t(sizeof cd);
	cp.initiator_depth = uint8_t(std::min(kMaxReadDepth, ctx_.attr.max_qp_init_rd_atom));
	cp.responder_resources = 0;
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (rdma_connect(raw, &cp))
		throw std::runtime_error(errno_text("rdma_connect"));
	PrivateData reply;
	AcceptData accept;
	uint32_t reject = 0;
	try {
		expect_event(ch_.get(), RDMA_CM_EVENT_ESTABLISHED, bounded(timeout_, until),
			     "RDMA connect", &reply);
	} catch (const std::runtime_error &e) {
		if (RejectData r; reply.len >= sizeof r) {
			std::memcpy(&r, reply.bytes.data(), sizeof r);
			reject = r.status;
		}
		if (reject == ENOENT) {
			session_lost_->store(true);
			throw std::runtime_error("memserver " + ep_.str() +
						 " does not know our session: its slabs are lost");
		}
		throw std::runtime_error("memserver " + ep_.str() + ": " + e.what() +
					 (reject ? std::string(" (refused: ") + err_text(int(reject)) + ")"
						 : std::string()));
	}
	parse_accept_data(reply.bytes.data(), reply.len, accept); // (none from a version 2 memserver)
	remote_qpn_ = accept.qp_num;
	if (named) {
		// Accepted: the memserver executes nothing more from the QPs named.
		session_->fenced(std::span<const uint32_t>(cd.replaces, named));
		logger("rdma")->debug("{}: fenced {} earlier QP(s) of the session ({}{})", name_,
				      named, cd.replaces[0], named > 1 ? ", ..." : "");
	}
	own_unfenced_ = 0; // named if it was still unfenced; otherwise fenced by another path
}

void RdmaDataPath::teardown()
{
	if (qp_)
		rdma_disconnect(qp_.get());
	qp_.reset();
	cq_.reset();
	comp_.reset();
	id_.reset();
	ch_.reset();
}

int RdmaDataPath::fail(int err, const char *what, const char *detail, bool unfenced)
{
	if (qp_)
		logger("rdma")->error("data path to {} failed: {}: {}{}", ep_.str(), what, detail,
				      unfenced ? " (with writes posted: fencing its QP)" : "");
	if (unfenced && qp_) {
		if (remote_qpn_) {
			own_unfenced_ = remote_qpn_;
			session_->unfenced(remote_qpn_);
		} else if (!warned_no_fence_) {
			warned_no_fence_ = true;
			logger("rdma")->warn("memserver {} does not fence the QP of a failed write (a "
					     "memserver older than this client): that write may still "
					     "land after a newer one; upgrade it",
					     ep_.str());
		}
	}
	// Destroy the QP now: nothing may land in the channel buffer once we report the error.
	drop();
	return latch(err);
}

int RdmaDataPath::reconnect()
{
	try {
		// Its CM waits also end at a stop request (next_event).
		connect(connect_until_ != Deadline{} ? connect_until_ : Clock::now() + timeout_);
		return 0;
	} catch (const std::exception &e) {
		logger("rdma")->error("reconnect to {} failed: {}", ep_.str(), e.what());
		return EIO; // connect() set the session lost itself if the server said so
	}
}

int RdmaDataPath::reconnect_by(Deadline until, bool eager)
{
	connect_until_ = until;
	const int err = ensure_connected(eager);
	connect_until_ = Deadline{};
	return err;
}

int RdmaDataPath::fence_session(Deadline deadline)
{
	while (session_->unfenced_count()) {
		if (session_->poisoned() || Clock::now() >= deadline)
			return EIO;
		// Nothing of ours is in flight: our QP can go. (Eager: the path was up a moment ago.)
		teardown();
		if (reconnect_by(deadline, true)) {
			logger("rdma")->debug("{}: a write waits for earlier QPs of the session to be "
					      "fenced, which failed",
					      name_);
			return EIO;
		}
	}
	return 0;
}

int RdmaDataPath::post(ibv_wr_opcode op, const SlabGrant &slab, uint64_t off, uint32_t len,
		       std::byte *local)
{
	if (int err = admit(op == IBV_WR_RDMA_READ, slab, off, len, local))
		return err;
	if (int err = ensure_connected())
		return latch(err);
	{
		const unsigned n = batch_size();
		ibv_sge &sge = sges_[n];
		sge.addr = reinterpret_cast<uint64_t>(local);
		sge.length = len;
		sge.lkey = lkey_;
		ibv_send_wr &wr = wrs_[n];
		wr = ibv_send_wr{};
		wr.wr_id = 0;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = op;
		wr.send_flags = (op == IBV_WR_RDMA_WRITE && len <= max_inline_) ? IBV_SEND_INLINE : 0;
		wr.wr.rdma.remote_addr = slab.addr + off;
		wr.wr.rdma.rkey = slab.rkey;
		queued();
		return 0;
	}
}

int RdmaDataPath::wait(uint64_t seq, Deadline deadline, bool writes)
{
	const auto start = Clock::now();
	bool armed = false;
	for (;;) {
		ibv_wc wc[kMaxBatch];
		const int n = ibv_poll_cq(cq_.get(), int(kMaxBatch), wc);
		acct_.polls.add();
		if (n > 0)
			acct_.completions.add(unsigned(n));
		else if (n == 0)
			acct_.polls_empty.add();
		if (n < 0)
			return fail(EIO, "ibv_poll_cq", err_text(errno), writes);
		bool done = false;
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				return fail(EIO, "work completion", ibv_wc_status_str(wc[i].status),
					    writes);
			if (wc[i].wr_id == seq)
				done = true;
		}
		if (done)
			return 0;
		if (n > 0)
			continue;
		const auto now = Clock::now();
		if (now >= deadline)
			return fail(EIO, "completion", "timed out", writes);
		if (busy_poll() && now - start < kBusyPollSpin)
			continue; // bounded busy-poll: most completions arrive within it on real NICs
		if (!armed) {
			acct_.arms.add();
			if (ibv_req_notify_cq(cq_.get(), 0))
				return fail(EIO, "ibv_req_notify_cq", err_text(errno), writes);
			armed = true;
			continue; // poll once more: a completion may have raced the arming
		}
		// Sleep on the completion channel until the deadline, or until a stop request.
		acct_.sleeps.add();
		const int w = wait_ready(comp_->fd, POLLIN, deadline);
		if (w == ECANCELED)
			return fail(EIO, "completion", "stopped (shutting down)", writes);
		if (w == ETIMEDOUT)
			continue; // the deadline check above reports it
		if (w)
			return fail(EIO, "poll(completion channel)", err_text(w), writes);
		ibv_cq *ev_cq = nullptr;
		void *ev_ctx = nullptr;
		if (ibv_get_cq_event(comp_.get(), &ev_cq, &ev_ctx) == 0) {
			ibv_ack_cq_events(ev_cq, 1);
			armed = false;
		}
	}
}

int RdmaDataPath::complete()
{
	acct_.batches.add();
	const unsigned n = batch_size();
	if (latched() || n == 0)
		return end_batch();
	const bool writes = !batch_reads();
	// The batch's deadline: a fence before it and all its completions end by then.
	const Deadline deadline = Clock::now() + timeout_;
	// No write goes out while a QP of the session may still execute an older one.
	if (writes && session_->unfenced_count() && fence_session(deadline)) {
		latch(EIO);
		return end_batch(); // nothing was posted
	}
	for (unsigned i = 0; i + 1 < n; i++)
		wrs_[i].next = &wrs_[i + 1];
	ibv_send_wr &last = wrs_[n - 1];
	last.next = nullptr;
	last.send_flags |= IBV_SEND_SIGNALED;
	last.wr_id = ++seq_;
	acct_.posts.add(n);
	acct_.doorbells.add();
	ibv_send_wr *bad = nullptr;
	if (int rc = ibv_post_send(qp_->qp, &wrs_[0], &bad))
		fail(EIO, "ibv_post_send", err_text(rc), writes && bad != &wrs_[0]); // (some went?)
	else
		wait(last.wr_id, deadline, writes);
	// A write of this batch that failed may still land until its QP is fenced: not before it
	// is, or that failed. (own_unfenced_ is set only by this batch's failure: a connect
	// clears it, and a batch needs a connection.)
	if (own_unfenced_ && reconnect_by(deadline + timeout_, true) && !stop_requested())
		logger("rdma")->warn("{}: could not fence the QP of the failed write: no write goes to "
				     "this memserver until it is",
				     name_);
	return end_batch();
}
DataPathCounters RdmaDataPath::counters() const
{
	DataPathCounters c;
	c.posts = acct_.posts.get();
	c.doorbells = acct_.doorbells.get();
	c.polls = acct_.polls.get();
	c.polls_empty = acct_.polls_empty.get();
	c.completions = acct_.completions.get();
	c.arms = acct_.arms.get();
	c.sleeps = acct_.sleeps.get();
	c.batches = acct_.batches.get();
	return c;
}

} // namespace

std::unique_ptr<DataPath> ClientContext::open_data_path(const Endpoint &ep, uint64_t session_id,
							 uint64_t token,
							 const Mac &attach_key,
							 std::chrono::milliseconds timeout,
							 std::span<std::byte> region,
							 std::shared_ptr<std::atomic<bool>> session_lost,
							 std::shared_ptr<RdmaSession> session)
{
	return std::make_unique<RdmaDataPath>(*impl_, ep, session_id, token, attach_key, timeout,
					      region, std::move(session_lost), std::move(session));
}

uint32_t remote_qp_num(const DataPath &path)
{
	const auto *p = dynamic_cast<const RdmaDataPath *>(&path);
	return p ? p->remote_qpn() : 0;
}

} // namespace rdmaswap::rdma
