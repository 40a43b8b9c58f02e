// SPDX-License-Identifier: MIT
// libFuzzer target for the wire protocol (common/wire/protocol.h) as a peer's bytes reach it:
// decode_header on the first 32 bytes, then, for a header it accepts, the body decoder(s) of
// that op on the bytes that follow, as the memserver (requests) and the client (replies) call
// them; then what the memserver does with a decoded request that needs no socket: the slab
// range check of READ/WRITE (SlabPool::begin_access), the AUTH handshake (common/wire/auth.h) and
// the check of a BIND's volume key proof (common/wire/volume_key.h).
//
// Properties checked besides "no crash, no UB, no leak":
// - every decoder only accepts exactly its body size, and what it accepts re-encodes to the
//   same bytes (so decode is the inverse of encode on valid input);
// - an accepted header re-encodes to the same 32 bytes and its body_len fits the op;
// - begin_access only returns memory inside the slab it was asked for;
// - no AUTH_PROOF or server MAC made of fuzzed bytes is ever accepted;
// - no BIND proof made of fuzzed bytes verifies under a volume's real public key (one derived
//   from a secret), whatever name, lease and challenge it claims; a HELLO reply without a
//   challenge is refused.
// Every body decoder also runs on the bytes after the header whatever the header says, so the
// decoders' own size checks are fuzzed too, not only the header's.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/wire/auth.h"
#include "common/wire/protocol.h"
#include "common/wire/volume_key.h"
#include "memserver/slab_pool.h"
#include "tests/fuzz/fuzz_check.h"

using namespace rdmaswap;
using namespace rdmaswap::proto;

namespace {

using Bytes = std::span<const std::byte>;

// Decode `in` as an M; if accepted, check the size and that re-encoding gives `in` back.
template <typename M> bool decode_roundtrip(Bytes in, size_t body_size, M &m)
{
	const Status st = decode(in, m);
	if (!st.ok) {
		FUZZ_CHECK(st.error != nullptr);
		return false;
	}
	FUZZ_CHECK(in.size() == body_size);
	std::array<std::byte, kMaxFixedBody> out{};
	encode(m, std::span(out).first(body_size));
	FUZZ_CHECK(std::memcmp(out.data(), in.data(), body_size) == 0);
	return true;
}

// The memserver's slab pool, as small as it can be: 4 slabs of 64 KiB, the first two held by
// session 1. Made once: a pool maps and zeroes its memory.
constexpr uint64_t kSlab = 64 << 10;
constexpr uint64_t kOwner = 1;
SlabPool &pool()
{
	static SlabPool *p = [] {
		auto *sp = new SlabPool(4 * kSlab, kSlab, /*lock=*/false);
		sp->allocate(kOwner);
		sp->allocate(kOwner);
		return sp;
	}();
	return *p;
}

// The memserver's check of a READ/WRITE range: only memory inside the named slab, and only
// that of a slab the session holds.
void check_io(const IoRequest &req)
{
	for (const uint64_t owner : {kOwner, kOwner + 1}) {
		std::byte *mem = pool().begin_access(req.slab_id, owner, req.offset, req.length);
		if (!mem)
			continue;
		FUZZ_CHECK(owner == kOwner && pool().owns(req.slab_id, owner));
		const std::byte *slab = pool().slab_base(req.slab_id);
		FUZZ_CHECK(mem >= slab && mem + req.length <= slab + kSlab);
		pool().end_access(req.slab_id);
	}
}

// A cluster key for the handshake (a fixed one: the fuzzer cannot guess a MAC anyway).
const AuthKey &key()
{
	static const AuthKey *k = [] {
		std::array<std::byte, 32> b{};
		for (size_t i = 0; i < b.size(); i++)
			b[i] = std::byte(0xa5 ^ i);
		return new AuthKey(b);
	}();
	return *k;
}

// The server side of AUTH: the client's nonce is the fuzzer's; the key id either the
// fuzzer's (nearly always unknown) or the right one. Then a fuzzed proof must fail.
void check_auth_request(const AuthRequest &req, Bytes proof_bytes)
{
	static const std::shared_ptr<const AuthKey> keys[] = {
		std::shared_ptr<const AuthKey>(&key(), [](const AuthKey *) {})};
	for (const uint64_t id : {req.key_id, key().id()}) {
		AuthServer server(keys);
		Nonce ns;
		Mac mac;
		if (!server.challenge(req.client_nonce, id, ns, mac)) {
			FUZZ_CHECK(id != key().id());
			continue;
		}
		FUZZ_CHECK(!server.challenge(req.client_nonce, id, ns, mac)); // not twice
		AuthProofRequest proof;
		if (decode(proof_bytes, proof) .ok)
			FUZZ_CHECK(!server.verify(proof.client_mac));
		FUZZ_CHECK(!server.authenticated());
	}
}

// The memserver's check of a BIND: the proof against the request's own public key (as the
// memserver does; a public key of small order, which no volume key derives, lets any
// signature through, so nothing is asserted there), then against the public key of a real
// volume key: never valid, whatever challenge and session the fuzzer picked.
void check_bind(const BindRequest &req, Bytes rest)
{
	static const VolumeKey *owner = [] {
		std::array<std::byte, 32> b{};
		for (size_t i = 0; i < b.size(); i++)
			b[i] = std::byte(0x5a ^ i);
		return new VolumeKey(AuthKey(b), "fuzz-volume");
	}();
	Challenge c{};
	std::memcpy(c.data(), rest.data(), std::min(rest.size(), c.size()));
	uint64_t session = 0;
	if (rest.size() >= c.size() + 8)
		std::memcpy(&session, rest.data() + c.size(), 8);
	(void)verify_volume_proof(req.pubkey,
				  bind_proof_message(c, session, req.name, req.lease_s, req.pubkey),
				  req.proof);
	FUZZ_CHECK(!verify_volume_proof(
		owner->public_key(),
		bind_proof_message(c, session, req.name, req.lease_s, owner->public_key()),
		req.proof));
}

// The client side: a server answer made of fuzzed bytes must not pass.
void check_auth_reply(const AuthReply &r)
{
	AuthClient client(key());
	Mac proof;
	FUZZ_CHECK(!client.check(r.server_nonce, r.server_mac, proof));
}

void check_list(Bytes in, size_t cap)
{
	std::vector<uint32_t> ids(cap);
	const long n = decode_list(in, ids);
	if (n < 0)
		return;
	FUZZ_CHECK(size_t(n) <= cap && size_t(n) <= kMaxListIds && in.size() == 4 + 4 * size_t(n));
	std::vector<std::byte> out(in.size());
	encode_list(std::span(ids).first(size_t(n)), out);
	FUZZ_CHECK(std::memcmp(out.data(), in.data(), in.size()) == 0);
}

// VOLUME_LIST reply entries (VolumeEntry or SessionEntry): what decodes re-encodes the same.
template <typename E> void check_entries(Bytes in, size_t entry_size, size_t cap)
{
	std::vector<E> entries(cap);
	const long n = decode_entries(in, std::span(entries));
	if (n < 0)
		return;
	FUZZ_CHECK(size_t(n) <= cap && in.size() == 4 + entry_size * size_t(n));
	std::vector<std::byte> out(in.size());
	encode_entries(std::span<const E>(entries).first(size_t(n)), out);
	FUZZ_CHECK(std::memcmp(out.data(), in.data(), in.size()) == 0);
}

// Every decoder on `body`, whatever op the header named.
void decode_everything(Bytes body)
{
	AuthRequest ar;
	AuthReply arr;
	AuthProofRequest apr;
	HelloRequest hr;
	HelloReply hrr;
	AllocReply alr;
	FreeRequest fr;
	IoRequest io;
	StatsReply sr;
	BindRequest br;
	BindReply brr;
	AllocTaggedRequest atr;
	SetTagRequest str;
	VolumeListRequest vlr;
	GiveBackRequest gbr;
	GiveBackReply gbrr;
	if (decode_roundtrip(body, kBindRequestSize, br))
		FUZZ_CHECK(valid_volume_name(std::string_view(
			br.name.data(), strnlen(br.name.data(), br.name.size()))));
	decode_roundtrip(body, kBindReplySize, brr);
	decode_roundtrip(body, kAllocTaggedRequestSize, atr);
	decode_roundtrip(body, kSetTagRequestSize, str);
	decode_roundtrip(body, kVolumeListRequestSize, vlr);
	decode_roundtrip(body, kGiveBackRequestSize, gbr);
	decode_roundtrip(body, kGiveBackReplySize, gbrr);
	check_entries<VolumeEntry>(body, kVolumeEntrySize, 8);
	check_entries<SessionEntry>(body, kSessionEntrySize, 4);
	if (decode_roundtrip(body, kAuthRequestSize, ar))
		FUZZ_CHECK(ar.reserved == 0);
	decode_roundtrip(body, kAuthReplySize, arr);
	decode_roundtrip(body, kAuthProofRequestSize, apr);
	if (decode_roundtrip(body, kHelloRequestSize, hr))
		FUZZ_CHECK(hr.client_version == kVersion && hr.want_rdma <= 1 &&
			   (hr.session_id == 0) == (hr.token == 0));
	if (decode_roundtrip(body, kHelloReplySize, hrr))
		FUZZ_CHECK(hrr.slabs_free <= hrr.slabs_total && hrr.max_io <= kMaxIo &&
			   hrr.max_io > 0 && hrr.slab_size >= 4096 &&
			   hrr.challenge != decltype(hrr.challenge){});
	if (decode_roundtrip(body, kAllocReplySize, alr))
		FUZZ_CHECK(alr.length > 0 && alr.addr + alr.length >= alr.addr);
	decode_roundtrip(body, kFreeRequestSize, fr);
	if (decode_roundtrip(body, kIoRequestSize, io)) {
		FUZZ_CHECK(io.length > 0 && io.length <= kMaxIo && io.offset + io.length > io.offset);
		check_io(io);
	}
	if (decode_roundtrip(body, kStatsReplySize, sr))
		FUZZ_CHECK(sr.slabs_free <= sr.slabs_total);
	check_list(body, 16);
	check_list(body, body.size() / 4);
}

// The body decoder(s) the memserver (request) or the client (reply) runs for header `h`.
void decode_as(const Header &h, Bytes body)
{
	if (!h.is_response()) {
		const size_t fixed = size_t(request_body_size(h.op));
		FUZZ_CHECK(h.status == 0);
		FUZZ_CHECK(h.op == Op::Write ? h.body_len >= fixed && h.body_len - fixed <= kMaxIo
					     : h.body_len == fixed);
		if (body.size() < fixed)
			return; // the peer hung up early: the server sees a truncated request
		const Bytes b = body.first(fixed);
		switch (h.op) {
		case Op::Auth: {
			AuthRequest req;
			if (decode_roundtrip(b, fixed, req))
				check_auth_request(req, body.subspan(fixed));
			break;
		}
		case Op::AuthProof: {
			AuthProofRequest req;
			decode_roundtrip(b, fixed, req);
			break;
		}
		case Op::DonorProof: {
			DonorProofRequest req;
			decode_roundtrip(b, fixed, req);
			break;
		}
		case Op::Hello: {
			HelloRequest req;
			decode_roundtrip(b, fixed, req);
			break;
		}
		case Op::Free: {
			FreeRequest req;
			decode_roundtrip(b, fixed, req);
			break;
		}
		case Op::Read:
		case Op::Write: {
			IoRequest req;
			if (decode_roundtrip(b, fixed, req) &&
			    (h.op == Op::Read || h.body_len - fixed == req.length))
				check_io(req);
			break;
		}
		case Op::Bind: {
			BindRequest req;
			if (decode_roundtrip(b, fixed, req))
				check_bind(req, body.subspan(fixed));
			break;
		}
		case Op::AllocTagged: {
			AllocTaggedRequest req;
			decode_roundtrip(b, fixed, req);
			break;
		}
		case Op::SetTag: {
			SetTagRequest req;
			decode_roundtrip(b, fixed, req);
			break;
		}
		case Op::VolumeList: {
			VolumeListRequest req;
			decode_roundtrip(b, fixed, req);
			break;
		}
		case Op::GiveBack:
		case Op::Lend: {
			GiveBackRequest req;
			decode_roundtrip(b, fixed, req);
			break;
		}
		case Op::Alloc:
		case Op::Stats:
		case Op::List:
		case Op::Wanted:
		case Op::GiveBackStatus:
			FUZZ_CHECK(fixed == 0);
			break;
		}
		return;
	}
	if (h.status != 0) {
		FUZZ_CHECK(h.status <= 4095 && h.body_len == 0);
		return;
	}
	if (h.op == Op::Read) {
		FUZZ_CHECK(h.body_len <= kMaxIo);
		return;
	}
	if (h.op == Op::DonorProof) { // a certificate and a signature: variable length, bounded
		FUZZ_CHECK(h.body_len >= size_t(reply_body_size(h.op)) &&
			   h.body_len <= kMaxDonorProofReply);
		return;
	}
	if (h.op != Op::List && h.op != Op::Wanted && h.op != Op::VolumeList)
		FUZZ_CHECK(h.body_len == size_t(reply_body_size(h.op)));
	if (body.size() < h.body_len)
		return;
	const Bytes b = body.first(h.body_len);
	switch (h.op) {
	case Op::Auth: {
		AuthReply r;
		if (decode_roundtrip(b, kAuthReplySize, r))
			check_auth_reply(r);
		break;
	}
	case Op::Hello: {
		HelloReply r;
		decode_roundtrip(b, kHelloReplySize, r);
		break;
	}
	case Op::Alloc:
	case Op::AllocTagged: {
		AllocReply r;
		decode_roundtrip(b, kAllocReplySize, r);
		break;
	}
	case Op::Bind: {
		BindReply r;
		decode_roundtrip(b, kBindReplySize, r);
		break;
	}
	case Op::GiveBack:
	case Op::GiveBackStatus:
	case Op::Lend: {
		GiveBackReply r;
		decode_roundtrip(b, kGiveBackReplySize, r);
		break;
	}
	case Op::VolumeList:
		FUZZ_CHECK(h.body_len >= 4 && h.body_len <= kMaxIo);
		check_entries<VolumeEntry>(b, kVolumeEntrySize, (h.body_len - 4) / kVolumeEntrySize);
		check_entries<SessionEntry>(b, kSessionEntrySize, (h.body_len - 4) / kSessionEntrySize);
		break;
	case Op::Stats: {
		StatsReply r;
		decode_roundtrip(b, kStatsReplySize, r);
		break;
	}
	case Op::List:
	case Op::Wanted: {
		// The client's buffer: as many ids as it could hold (capacity <= what it sent).
		FUZZ_CHECK(h.body_len >= 4 && h.body_len % 4 == 0 && h.body_len <= kMaxIo);
		check_list(b, (h.body_len - 4) / 4);
		break;
	}
	default:
		FUZZ_CHECK(h.body_len == 0);
		break;
	}
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const Bytes in(reinterpret_cast<const std::byte *>(data), size);
	if (in.size() < kHeaderSize) {
		decode_everything(in);
		return 0;
	}
	const std::span<const std::byte, kHeaderSize> hdr = in.first<kHeaderSize>();
	const Bytes body = in.subspan(kHeaderSize);
	decode_everything(body);
	Header h;
	const Status st = decode_header(hdr, h);
	if (!st.ok) {
		FUZZ_CHECK(st.error != nullptr);
		return 0;
	}
	std::array<std::byte, kHeaderSize> again;
	encode_header(h, again);
	FUZZ_CHECK(std::memcmp(again.data(), hdr.data(), kHeaderSize) == 0);
	FUZZ_CHECK(std::strcmp(op_name(h.op), "UNKNOWN") != 0);
	decode_as(h, body);
	return 0;
}
