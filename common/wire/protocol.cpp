// SPDX-License-Identifier: MIT
// Encoding and validating decoding of rdmaswap protocol messages.
#include "common/wire/protocol.h"

#include <algorithm>
#include <cstring>

namespace rdmaswap::proto {
namespace {

// Little-endian cursor over a fixed span, for the header and the count of a list (the fixed
// bodies use protocol.h's codec). Callers check sizes before use.
class Out {
public:
	explicit Out(std::span<std::byte> s) : s_(s) {}
	template <typename T> void put(T v)
	{
		for (size_t i = 0; i < sizeof(T); i++)
			s_[pos_ + i] = std::byte((uint64_t(v) >> (8 * i)) & 0xff);
		pos_ += sizeof(T);
	}
private:
	std::span<std::byte> s_;
	size_t pos_ = 0;
};

class In {
public:
	explicit In(std::span<const std::byte> s) : s_(s) {}
	template <typename T> T get()
	{
		uint64_t v = 0;
		for (size_t i = 0; i < sizeof(T); i++)
			v |= uint64_t(s_[pos_ + i]) << (8 * i);
		pos_ += sizeof(T);
		return T(v);
	}
private:
	std::span<const std::byte> s_;
	size_t pos_ = 0;
};

} // namespace

const char *op_name(Op op)
{
	switch (op) {
	case Op::Hello: return "HELLO";
	case Op::Alloc: return "ALLOC";
	case Op::Free: return "FREE";
	case Op::Read: return "READ";
	case Op::Write: return "WRITE";
	case Op::Stats: return "STATS";
	case Op::List: return "LIST";
	case Op::GiveBack: return "GIVEBACK";
	case Op::Wanted: return "WANTED";
	case Op::GiveBackStatus: return "GIVEBACK_STATUS";
	case Op::Lend: return "LEND";
	case Op::Bind: return "BIND";
	case Op::AllocTagged: return "ALLOC_TAGGED";
	case Op::SetTag: return "SET_TAG";
	case Op::VolumeList: return "VOLUME_LIST";
	case Op::Auth: return "AUTH";
	case Op::AuthProof: return "AUTH_PROOF";
	case Op::DonorProof: return "DONOR_PROOF";
	}
	return "UNKNOWN";
}

long request_body_size(Op op)
{
	switch (op) {
	case Op::Hello: return kHelloRequestSize;
	case Op::Alloc: return 0;
	case Op::Free: return kFreeRequestSize;
	case Op::Read: return kIoRequestSize;
	case Op::Write: return kIoRequestSize;
	case Op::Stats: return 0;
	case Op::List: return 0;
	case Op::GiveBack: return kGiveBackRequestSize;
	case Op::Wanted: return 0;
	case Op::GiveBackStatus: return 0;
	case Op::Lend: return kGiveBackRequestSize;
	case Op::Bind: return kBindRequestSize;
	case Op::AllocTagged: return kAllocTaggedRequestSize;
	case Op::SetTag: return kSetTagRequestSize;
	case Op::VolumeList: return kVolumeListRequestSize;
	case Op::Auth: return kAuthRequestSize;
	case Op::AuthProof: return kAuthProofRequestSize;
	case Op::DonorProof: return kDonorProofRequestSize;
	}
	return -1;
}

long reply_body_size(Op op)
{
	switch (op) {
	case Op::Hello: return kHelloReplySize;
	case Op::Alloc: return kAllocReplySize;
	case Op::Free: return 0;
	case Op::Read: return 0;
	case Op::Write: return 0;
	case Op::Stats: return kStatsReplySize;
	case Op::List: return 4; // plus 4 bytes per id
	case Op::GiveBack: return kGiveBackReplySize;
	case Op::Wanted: return 4; // as LIST
	case Op::GiveBackStatus: return kGiveBackReplySize;
	case Op::Lend: return kGiveBackReplySize;
	case Op::Bind: return kBindReplySize;
	case Op::AllocTagged: return kAllocReplySize;
	case Op::SetTag: return 0;
	case Op::VolumeList: return 4; // plus the entries
	case Op::Auth: return kAuthReplySize;
	case Op::AuthProof: return 0;
	case Op::DonorProof: return kDonorProofSigSize + 1; // at least; plus the certificate
	}
	return -1;
}

void encode_header(const Header &h, std::span<std::byte, kHeaderSize> out)
{
	Out o(out);
	o.put<uint32_t>(kMagic);
	o.put<uint8_t>(kVersion);
	o.put<uint8_t>(uint8_t(h.op));
	o.put<uint16_t>(h.flags);
	o.put<uint32_t>(h.status);
	o.put<uint32_t>(h.body_len);
	o.put<uint64_t>(h.request_id);
	o.put<uint64_t>(0);
}

Status decode_header(std::span<const std::byte, kHeaderSize> in, Header &out)
{
	In i(in);
	if (i.get<uint32_t>() != kMagic)
		return Status::fail("bad magic");
	if (i.get<uint8_t>() != kVersion)
		return Status::fail("unsupported protocol version");
	const uint8_t op = i.get<uint8_t>();
	if (request_body_size(Op(op)) < 0)
		return Status::fail("unknown op");
	Header h;
	h.op = Op(op);
	h.flags = i.get<uint16_t>();
	h.status = i.get<uint32_t>();
	h.body_len = i.get<uint32_t>();
	h.request_id = i.get<uint64_t>();
	if (i.get<uint64_t>() != 0)
		return Status::fail("reserved header field not zero");
	if (h.flags & ~kFlagResponse)
		return Status::fail("unknown header flags");

	if (!h.is_response()) {
		if (h.status != 0)
			return Status::fail("request with non-zero status");
		const uint64_t fixed = uint64_t(request_body_size(h.op));
		if (h.op == Op::Write) {
			if (h.body_len < fixed || h.body_len - fixed > kMaxIo)
				return Status::fail("WRITE payload length out of range");
		} else if (h.body_len != fixed) {
			return Status::fail("request body length does not match op");
		}
	} else if (h.status != 0) {
		if (h.status > 4095)
			return Status::fail("response status is not an errno");
		if (h.body_len != 0)
			return Status::fail("error response with a body");
	} else {
		const uint64_t fixed = uint64_t(reply_body_size(h.op));
		if (h.op == Op::Read) {
			if (h.body_len > kMaxIo)
				return Status::fail("READ reply payload too large");
		} else if (h.op == Op::List || h.op == Op::Wanted) {
			if (h.body_len < 4 || h.body_len > kMaxIo || h.body_len % 4 != 0)
				return Status::fail("LIST reply length out of range");
		} else if (h.op == Op::VolumeList) {
			if (h.body_len < 4 || h.body_len > kMaxIo)
				return Status::fail("VOLUME_LIST reply length out of range");
		} else if (h.op == Op::DonorProof) {
			if (h.body_len < fixed || h.body_len > kMaxDonorProofReply)
				return Status::fail("DONOR_PROOF reply length out of range");
		} else if (h.body_len != fixed) {
			return Status::fail("reply body length does not match op");
		}
	}
	out = h;
	return {};
}

long decode_list(std::span<const std::byte> in, std::span<uint32_t> ids)
{
	if (in.size() < 4 || in.size() % 4 != 0)
		return -1;
	In i(in);
	const uint32_t count = i.get<uint32_t>();
	if (count > kMaxListIds || in.size() != 4 + uint64_t(count) * 4 || count > ids.size())
		return -1;
	for (uint32_t k = 0; k < count; k++)
		ids[k] = i.get<uint32_t>();
	return long(count);
}

void encode_list(std::span<const uint32_t> ids, std::span<std::byte> out)
{
	Out o(out.first(4 + ids.size() * 4));
	o.put(uint32_t(ids.size()));
	for (uint32_t id : ids)
		o.put(id);
}

// ---- What each message's decoder checks beyond its size (protocol.h: decode) ----

Status AuthRequest::check() const
{
	if (reserved != 0)
		return Status::fail("AUTH reserved field not zero");
	return {};
}

std::string_view dialled_text(const DonorProofRequest &m)
{
	const auto *end = std::find(m.dialled.begin(), m.dialled.end(), '\0');
	return {m.dialled.data(), size_t(end - m.dialled.begin())};
}

Status HelloRequest::check() const
{
	if (client_version != kVersion)
		return Status::fail("HELLO from an unsupported client version");
	if (want_rdma > 1)
		return Status::fail("HELLO want_rdma is not 0 or 1");
	if ((session_id == 0) != (token == 0))
		return Status::fail("HELLO session id and token must both be set or both zero");
	if (replaces && !session_id)
		return Status::fail("HELLO replaces a connection of no session");
	return {};
}

Status HelloReply::check() const
{
	if (session_id == 0 || token == 0 || conn_id == 0)
		return Status::fail("HELLO reply without a session");
	if (challenge == decltype(challenge){})
		return Status::fail("HELLO reply without a challenge");
	if (slab_size < 4096 || (slab_size & (slab_size - 1)) != 0)
		return Status::fail("HELLO reply slab size is not a power of two >= 4096");
	if (slabs_free > slabs_total)
		return Status::fail("HELLO reply has more free slabs than slabs");
	if (max_io == 0 || max_io > kMaxIo || max_io % 4096 != 0)
		return Status::fail("HELLO reply max_io out of range");
	if (server_flags & ~kServerRdma)
		return Status::fail("HELLO reply has unknown server flags");
	return {};
}

Status AllocReply::check() const
{
	if (length == 0)
		return Status::fail("ALLOC reply with an empty slab");
	if (reserved != 0)
		return Status::fail("ALLOC reply reserved field not zero");
	if (addr + length < addr)
		return Status::fail("ALLOC reply address range wraps");
	return {};
}

Status FreeRequest::check() const
{
	if (reserved != 0)
		return Status::fail("FREE reserved field not zero");
	return {};
}

Status IoRequest::check() const
{
	if (length == 0 || length > kMaxIo)
		return Status::fail("I/O length out of range");
	if (offset + length < offset)
		return Status::fail("I/O range wraps");
	return {};
}

Status StatsReply::check() const
{
	if (slabs_free > slabs_total)
		return Status::fail("STATS reply has more free slabs than slabs");
	return {};
}

bool valid_volume_name(std::string_view name)
{
	if (name.empty() || name.size() > kMaxVolumeName)
		return false;
	for (char ch : name)
		if (ch < 0x21 || ch > 0x7e)
			return false;
	return true;
}

namespace {
// A NUL-padded fixed-size name field: the name is what precedes the first NUL; every byte
// after it must be NUL too (one encoding per name).
bool name_field_ok(std::span<const char> f)
{
	size_t n = 0;
	while (n < f.size() && f[n] != '\0')
		n++;
	for (size_t k = n; k < f.size(); k++)
		if (f[k] != '\0')
			return false;
	return true;
}

// A VOLUME_LIST reply body: u32 count, then `count` entries of type E.
template <typename E> void encode_list_of(std::span<const E> in, std::span<std::byte> out)
{
	Out o(out.first(4 + in.size() * wire_size<E>()));
	o.put(uint32_t(in.size()));
	for (size_t k = 0; k < in.size(); k++)
		encode(in[k], out.subspan(4 + k * wire_size<E>()));
}

template <typename E> long decode_list_of(std::span<const std::byte> in, std::span<E> out)
{
	constexpr size_t size = wire_size<E>();
	if (in.size() < 4)
		return -1;
	In i(in);
	const uint32_t count = i.get<uint32_t>();
	if (count > (kMaxIo - 4) / size || in.size() != 4 + uint64_t(count) * size ||
	    count > out.size())
		return -1;
	for (uint32_t k = 0; k < count; k++)
		if (!decode(in.subspan(4 + k * size, size), out[k]).ok)
			return -1;
	return long(count);
}
} // namespace

Status SessionEntry::check() const
{
	if (!name_field_ok(volume) || !name_field_ok(peer) ||
	    (flags & ~(kSessionDetached | kSessionRdma | kSessionBound)))
		return Status::fail("VOLUME_LIST session entry is malformed");
	return {};
}

void encode_entries(std::span<const VolumeEntry> in, std::span<std::byte> out)
{
	encode_list_of(in, out);
}

long decode_entries(std::span<const std::byte> in, std::span<VolumeEntry> out)
{
	return decode_list_of(in, out);
}

void encode_entries(std::span<const SessionEntry> in, std::span<std::byte> out)
{
	encode_list_of(in, out);
}

long decode_entries(std::span<const std::byte> in, std::span<SessionEntry> out)
{
	return decode_list_of(in, out);
}

Status BindRequest::check() const
{
	if (!name_field_ok(name) ||
	    !valid_volume_name(std::string_view(name.data(), strnlen(name.data(), name.size()))))
		return Status::fail("BIND volume name is not 1..64 graphic ASCII characters");
	if (reserved != 0)
		return Status::fail("BIND reserved field not zero");
	return {};
}

Status BindReply::check() const
{
	if (reattached > 1)
		return Status::fail("BIND reply reattached is not 0 or 1");
	return {};
}

Status SetTagRequest::check() const
{
	if (reserved != 0)
		return Status::fail("SET_TAG reserved field not zero");
	return {};
}

Status VolumeListRequest::check() const
{
	if (uint32_t(what) > uint32_t(ListWhat::Sessions))
		return Status::fail("VOLUME_LIST asks for an unknown list");
	if (reserved != 0)
		return Status::fail("VOLUME_LIST reserved field not zero");
	return {};
}

Status GiveBackRequest::check() const
{
	if (bytes == 0)
		return Status::fail("GIVEBACK of 0 bytes");
	return {};
}

Status GiveBackReply::check() const
{
	if (reserved != 0)
		return Status::fail("GIVEBACK reply reserved field not zero");
	// (The "now" counts may exceed the totals in a LEND reply, which lowers them.)
	if (uint64_t(slabs_withdrawn) + slabs_wanted > slabs_total || withdrawn_now > slabs_total ||
	    wanted_now > slabs_total)
		return Status::fail("GIVEBACK reply counts exceed the slab count");
	return {};
}

} // namespace rdmaswap::proto
