// SPDX-License-Identifier: MIT
// Request/response bounded by a deadline per exchange; the control connection.
#include "common/transport/control_client.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "common/util/err_text.h"
#include "common/wire/donor_cert.h"

namespace rdmaswap {

int rpc(int fd, uint64_t request_id, proto::Op op, std::span<const std::byte> body,
	std::span<std::byte> reply, Deadline deadline, bool *in_step)
{
	size_t len = 0;
	const int r = rpc_var(fd, request_id, op, body, reply, len, deadline, in_step);
	if (r == 0 && len != reply.size()) {
		if (in_step)
			*in_step = false; // a server that answers the wrong size is not trusted further
		return EPROTO;
	}
	return r;
}

int rpc_var(int fd, uint64_t request_id, proto::Op op, std::span<const std::byte> body,
	    std::span<std::byte> reply, size_t &reply_len, Deadline deadline, bool *in_step)
{
	bool step_dummy = false;
	bool &step = in_step ? *in_step : step_dummy;
	step = false;
	std::array<std::byte, proto::kHeaderSize> hdr;
	proto::Header h;
	h.op = op;
	h.body_len = uint32_t(body.size());
	h.request_id = request_id;
	proto::encode_header(h, hdr);
	iovec iov[2] = {{hdr.data(), hdr.size()},
			{const_cast<std::byte *>(body.data()), body.size()}};
	if (int r = sendv_all_until(fd, iov, body.empty() ? 1 : 2, deadline))
		return r;
	if (int r = recv_all_until(fd, hdr.data(), hdr.size(), deadline))
		return r;
	proto::Header rh;
	if (!proto::decode_header(hdr, rh).ok || !rh.is_response() || rh.op != op ||
	    rh.request_id != request_id)
		return EPROTO;
	if (rh.status) {
		step = rh.body_len == 0;
		return int(rh.status);
	}
	if (rh.body_len > reply.size())
		return EPROTO;
	if (int r = recv_all_until(fd, reply.data(), rh.body_len, deadline))
		return r;
	reply_len = rh.body_len;
	step = true;
	return 0;
}

namespace {

// DONOR_PROOF (donor_cert.h): the server must present a certificate `donors` accepts for the
// address we dialled, and sign this connection's nonces and that address with the certified
// key. 0, or ENOKEY (refused: warned, naming why), or the exchange's errno.
int check_donor(int fd, const SockAddr &addr, const AuthClient &ac, DonorVerifier &donors,
		Deadline deadline)
{
	const std::string dialled = addr.str();
	proto::DonorProofRequest req;
	std::copy_n(dialled.begin(), std::min(dialled.size(), req.dialled.size()),
		    req.dialled.begin());
	std::array<std::byte, proto::kDonorProofRequestSize> body;
	proto::encode(req, body);
	std::array<std::byte, proto::kMaxDonorProofReply> reply;
	size_t len = 0;
	const int r = rpc_var(fd, 0, proto::Op::DonorProof, body, reply, len, deadline);
	std::string why;
	if (r == ENOENT) {
		why = "it has no donor certificate (memserver run without --donor-cert)";
	} else if (r == EPROTO || r == ECONNRESET) {
		why = "it did not answer DONOR_PROOF (no donor certificate support, or not a "
		      "memserver)";
	} else if (r) {
		return r; // timeout, stop: not a verdict on the donor
	} else {
		const auto all = std::span(reply).first(len);
		const auto cert_bytes = all.first(len - proto::kDonorProofSigSize);
		Signature sig{};
		std::copy_n(all.last(proto::kDonorProofSigSize).begin(), sig.size(), sig.begin());
		std::string perr;
		const auto cert = parse_cert(cert_bytes, perr);
		if (!cert)
			why = "its certificate does not parse: " + perr;
		else if (why = donors.check(*cert, dialled); !why.empty())
			why = "donor '" + cert->name + "' (serial " + std::to_string(cert->serial) +
			      "): " + why;
		else if (!verify_donor_signature(
				 *cert,
				 donor_proof_message(ac.client_nonce(), ac.server_nonce(), dialled),
				 sig))
			why = "donor '" + cert->name + "': its proof of the certified key is wrong "
			      "(it does not hold the key, or replays another connection's proof)";
	}
	if (why.empty())
		return 0;
	donors.warn_refused(dialled, why);
	return ENOKEY;
}

} // namespace

Fd connect_memserver(const SockAddr &addr, Deadline deadline, const AuthKey *key, Mac *attach,
		     int &err)
{
	err = 0;
	Fd fd = connect_tcp(addr, deadline);
	if (!fd) {
		err = errno ? errno : EIO;
		return {};
	}
	if (!key)
		return fd;
	AuthClient ac(*key);
	proto::AuthRequest req;
	req.client_nonce = ac.client_nonce();
	req.key_id = ac.key_id();
	std::array<std::byte, proto::kAuthRequestSize> body;
	std::array<std::byte, proto::kAuthReplySize> reply;
	proto::encode(req, body);
	if ((err = rpc(fd.get(), 0, proto::Op::Auth, body, reply, deadline)))
		return {};
	proto::AuthReply r;
	proto::AuthProofRequest proof;
	if (!proto::decode(reply, r).ok) {
		err = EPROTO;
		return {};
	}
	if (!ac.check(r.server_nonce, r.server_mac, proof.client_mac)) {
		err = EKEYREJECTED;
		return {};
	}
	std::array<std::byte, proto::kAuthProofRequestSize> pbody;
	proto::encode(proof, pbody);
	if ((err = rpc(fd.get(), 0, proto::Op::AuthProof, pbody, {}, deadline)))
		return {};
	if (DonorVerifier *donors = key->donor_check()) {
		if ((err = check_donor(fd.get(), addr, ac, *donors, deadline)))
			return {};
	}
	if (attach)
		*attach = ac.attach_key();
	return fd;
}

std::string connect_error_text(int err)
{
	switch (err) {
	case EPROTO:
		return "protocol error (not a memserver, or an incompatible version)";
	case EACCES:
		return "authentication failed: the memserver refused us (no auth-key=, or another "
		       "key than its --auth-key)";
	case EKEYREJECTED:
		return "authentication failed: the server did not prove it holds our auth key (an "
		       "impostor, or a memserver with another --auth-key)";
	case EAGAIN:
	case ETIMEDOUT:
		return "no answer within the timeout (or an answer too slow to finish within it)";
	case ECANCELED:
		return "stopped (shutting down)";
	case ECONNRESET:
		return "connection closed by the memserver (at its --max-connections limit, or a "
		       "memserver of another rdmaswap protocol version: its log says which)";
	case ENOKEY:
		return "not a certified donor (donor-ca=): refused; the warning before says why";
	case EOPNOTSUPP:
		return "the memserver runs without authentication (--insecure) but we have an "
		       "auth-key=: refusing an unauthenticated server";
	default:
		return err_text(err);
	}
}

ControlClient::ControlClient(SockAddr addr, std::chrono::milliseconds timeout,
			     std::shared_ptr<const AuthKey> key)
	: addr_(addr), timeout_(timeout), key_(std::move(key))
{
}

Fd join_session(const SockAddr &addr, Deadline deadline, const AuthKey *key, uint64_t session_id,
		uint64_t token, bool want_rdma, uint64_t replaces, uint64_t &conn_id, int &err,
		Challenge *challenge)
{
	Fd fd = connect_memserver(addr, deadline, key, nullptr, err);
	if (!fd)
		return {};
	proto::HelloRequest req;
	req.want_rdma = want_rdma;
	req.session_id = session_id;
	req.token = token;
	req.replaces = replaces;
	std::array<std::byte, proto::kHelloRequestSize> body;
	std::array<std::byte, proto::kHelloReplySize> reply;
	proto::encode(req, body);
	err = rpc(fd.get(), 0, proto::Op::Hello, body, reply, deadline);
	if (err)
		return {};
	proto::HelloReply r;
	if (!proto::decode(reply, r).ok || r.session_id != session_id) {
		err = EPROTO;
		return {};
	}
	conn_id = r.conn_id;
	if (challenge)
		*challenge = r.challenge;
	return fd;
}

int ControlClient::ensure_connected(Deadline deadline)
{
	if (fd_)
		return 0;
	if (closed_.load())
		return ENOTCONN;
	if (lost_.load())
		return ENOENT;
	int err = 0;
	if (session_id_ == 0) {
		fd_ = connect_memserver(addr_, deadline, key_.get(), &attach_, err);
		return err;
	}
	fd_ = join_session(addr_, deadline, key_.get(), session_id_, token_, want_rdma_, conn_id_,
			   conn_id_, err, &challenge_);
	if (err == ENOENT)
		lost_.store(true);
	return err;
}

int ControlClient::call(proto::Op op, std::span<const std::byte> body, std::span<std::byte> reply,
			size_t *reply_len)
{
	// The call within the timeout, however the bytes trickle: a reconnect it needs (handshake
	// included), the request and its whole reply.
	const Deadline deadline = deadline_after(timeout_);
	if (int r = ensure_connected(deadline))
		return r;
	return exchange(op, body, reply, reply_len, deadline);
}

int ControlClient::exchange(proto::Op op, std::span<const std::byte> body,
			    std::span<std::byte> reply, size_t *reply_len, Deadline deadline)
{
	bool in_step = false;
	const int r = reply_len ? rpc_var(fd_.get(), next_id_++, op, body, reply, *reply_len,
					  deadline, &in_step)
				: rpc(fd_.get(), next_id_++, op, body, reply, deadline, &in_step);
	// A server-side refusal leaves the stream in step; a timeout, a lost connection or a
	// malformed reply may not, and the server may have executed the request: drop the
	// connection (the next call reconnects) and mark the outcome unknown.
	if (!in_step) {
		fd_.reset();
		unknown_.store(true);
	}
	return r;
}

void ControlClient::close()
{
	std::lock_guard lock(mu_);
	closed_.store(true);
	fd_.reset();
}

int ControlClient::open_session(bool want_rdma, proto::HelloReply &out)
{
	std::lock_guard lock(mu_);
	fd_.reset();
	session_id_ = token_ = 0;
	lost_.store(false);
	want_rdma_ = want_rdma;
	proto::HelloRequest req;
	req.want_rdma = want_rdma;
	std::array<std::byte, proto::kHelloRequestSize> body;
	proto::encode(req, body);
	if (int r = call_decode<proto::kHelloReplySize>(proto::Op::Hello, body, out))
		return r;
	session_id_ = out.session_id;
	token_ = out.token;
	conn_id_ = out.conn_id;
	challenge_ = out.challenge;
	return 0;
}

int ControlClient::alloc(proto::AllocReply &out)
{
	std::lock_guard lock(mu_);
	return call_decode<proto::kAllocReplySize>(proto::Op::Alloc, {}, out);
}

int ControlClient::free_slab(uint32_t id)
{
	std::lock_guard lock(mu_);
	std::array<std::byte, proto::kFreeRequestSize> body;
	proto::encode(proto::FreeRequest{id, 0}, body);
	return call(proto::Op::Free, body, {});
}

long ControlClient::list(std::span<uint32_t> ids)
{
	std::lock_guard lock(mu_);
	if (list_buf_.empty())
		list_buf_.resize(proto::kMaxIo);
	size_t len = 0;
	if (int r = call(proto::Op::List, {}, list_buf_, &len))
		return -r;
	const long n = proto::decode_list(std::span(list_buf_).first(len), ids);
	if (n < 0) {
		fd_.reset();
		return -EPROTO;
	}
	return n;
}

int ControlClient::stats(proto::StatsReply &out)
{
	std::lock_guard lock(mu_);
	return call_decode<proto::kStatsReplySize>(proto::Op::Stats, {}, out);
}

int ControlClient::bind(const VolumeKey &key, uint32_t lease_s, proto::BindReply &out)
{
	const std::string &volume = key.name();
	if (!proto::valid_volume_name(volume))
		return EINVAL;
	std::lock_guard lock(mu_);
	const Deadline deadline = deadline_after(timeout_);
	// Connected first: the proof signs the challenge of the connection it goes out on.
	if (int r = ensure_connected(deadline))
		return r;
	if (session_id_ == 0)
		return EINVAL; // no session to bind (open_session first)
	proto::BindRequest req;
	std::copy(volume.begin(), volume.end(), req.name.begin());
	req.lease_s = lease_s;
	req.pubkey = key.public_key();
	req.proof = key.sign(
		bind_proof_message(challenge_, session_id_, req.name, lease_s, req.pubkey));
	std::array<std::byte, proto::kBindRequestSize> body;
	proto::encode(req, body);
	std::array<std::byte, proto::kBindReplySize> reply;
	if (int r = exchange(proto::Op::Bind, body, reply, nullptr, deadline))
		return r;
	if (!proto::decode(reply, out).ok) {
		fd_.reset();
		return EPROTO;
	}
	return 0;
}

int ControlClient::alloc_tagged(uint64_t chunk, uint64_t epoch, proto::AllocReply &out)
{
	std::lock_guard lock(mu_);
	std::array<std::byte, proto::kAllocTaggedRequestSize> body;
	proto::encode(proto::AllocTaggedRequest{chunk, epoch}, body);
	return call_decode<proto::kAllocReplySize>(proto::Op::AllocTagged, body, out);
}

int ControlClient::set_tag(uint32_t slab_id, uint64_t chunk, uint64_t epoch)
{
	std::lock_guard lock(mu_);
	std::array<std::byte, proto::kSetTagRequestSize> body;
	proto::encode(proto::SetTagRequest{slab_id, 0, chunk, epoch}, body);
	return call(proto::Op::SetTag, body, {});
}

template <typename Entry>
int ControlClient::list_page(proto::ListWhat what, uint64_t start, size_t max,
			     std::vector<Entry> &out)
{
	std::lock_guard lock(mu_);
	if (list_buf_.size() < proto::kMaxIo)
		list_buf_.resize(proto::kMaxIo);
	std::array<std::byte, proto::kVolumeListRequestSize> body;
	proto::encode(proto::VolumeListRequest{what, 0, start}, body);
	size_t len = 0;
	if (int r = call(proto::Op::VolumeList, body, list_buf_, &len))
		return r;
	out.resize(max);
	const long n = proto::decode_entries(std::span(list_buf_).first(len), std::span(out));
	if (n < 0) {
		fd_.reset();
		return EPROTO;
	}
	out.resize(size_t(n));
	return 0;
}

int ControlClient::volume_list(proto::ListWhat what, uint64_t start,
			       std::vector<proto::VolumeEntry> &out)
{
	return list_page(what, start, proto::kMaxVolumeEntries, out);
}

int ControlClient::sessions(uint64_t start, std::vector<proto::SessionEntry> &out)
{
	return list_page(proto::ListWhat::Sessions, start, proto::kMaxSessionEntries, out);
}

int ControlClient::capacity_call(proto::Op op, uint64_t bytes, proto::GiveBackReply &out)
{
	std::lock_guard lock(mu_);
	std::array<std::byte, proto::kGiveBackRequestSize> body;
	proto::encode(proto::GiveBackRequest{bytes}, body);
	return call_decode<proto::kGiveBackReplySize>(op, body, out);
}

int ControlClient::give_back(uint64_t bytes, proto::GiveBackReply &out)
{
	return capacity_call(proto::Op::GiveBack, bytes, out);
}

int ControlClient::lend(uint64_t bytes, proto::GiveBackReply &out)
{
	return capacity_call(proto::Op::Lend, bytes, out);
}

int ControlClient::give_back_status(proto::GiveBackReply &out)
{
	std::lock_guard lock(mu_);
	return call_decode<proto::kGiveBackReplySize>(proto::Op::GiveBackStatus, {}, out);
}

} // namespace rdmaswap
