// SPDX-License-Identifier: MIT
// Encoding and validating decoding of rdmaswap protocol messages.
#include "common/wire/protocol.h"

#include <algorithm>
#include <cstring>

namespace rdmaswap::proto {
namespace {

// Little-endian cursor over a fixed span. Callers check sizes before use, so the cursor only
// asserts by construction: every encode/decode below checks the span size first.
class Out {
public:
	explicit Out(std::span<std::byte> s) : s_(s) {}
	template <typename T> void put(T v)
	{
		for (size_t i = 0; i < sizeof(T); i++)
			s_[pos_ + i] = std::byte((uint64_t(v) >> (8 * i)) & 0xff);
		pos_ += sizeof(T);
	}
	void put_bytes(std::span<const std::byte> b)
	{
		std::memcpy(s_.data() + pos_, b.data(), b.size());
		pos_ += b.size();
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
	void get_bytes(std::span<std::byte> b)
	{
		std::memcpy(b.data(), s_.data() + pos_, b.size());
		pos_ += b.size();
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

void encode(const AuthRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kAuthRequestSize>());
	o.put_bytes(m.client_nonce);
	o.put(m.key_id);
	o.put(m.reserved);
}

Status decode(std::span<const std::byte> in, AuthRequest &m)
{
	if (in.size() != kAuthRequestSize)
		return Status::fail("AUTH body has the wrong size");
	In i(in);
	AuthRequest r;
	i.get_bytes(r.client_nonce);
	r.key_id = i.get<uint64_t>();
	r.reserved = i.get<uint64_t>();
	if (r.reserved != 0)
		return Status::fail("AUTH reserved field not zero");
	m = r;
	return {};
}

void encode(const AuthReply &m, std::span<std::byte> out)
{
	Out o(out.first<kAuthReplySize>());
	o.put_bytes(m.server_nonce);
	o.put_bytes(m.server_mac);
}

Status decode(std::span<const std::byte> in, AuthReply &m)
{
	if (in.size() != kAuthReplySize)
		return Status::fail("AUTH reply has the wrong size");
	In i(in);
	i.get_bytes(m.server_nonce);
	i.get_bytes(m.server_mac);
	return {};
}

void encode(const AuthProofRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kAuthProofRequestSize>());
	o.put_bytes(m.client_mac);
}

Status decode(std::span<const std::byte> in, AuthProofRequest &m)
{
	if (in.size() != kAuthProofRequestSize)
		return Status::fail("AUTH_PROOF body has the wrong size");
	In i(in);
	i.get_bytes(m.client_mac);
	return {};
}

void encode(const DonorProofRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kDonorProofRequestSize>());
	o.put_bytes(std::as_bytes(std::span(m.dialled)));
}

Status decode(std::span<const std::byte> in, DonorProofRequest &m)
{
	if (in.size() != kDonorProofRequestSize)
		return Status::fail("DONOR_PROOF body has the wrong size");
	In i(in);
	i.get_bytes(std::as_writable_bytes(std::span(m.dialled)));
	return {};
}

std::string_view dialled_text(const DonorProofRequest &m)
{
	const auto *end = std::find(m.dialled.begin(), m.dialled.end(), '\0');
	return {m.dialled.data(), size_t(end - m.dialled.begin())};
}

void encode(const HelloRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kHelloRequestSize>());
	o.put(m.client_version);
	o.put(m.want_rdma);
	o.put(m.session_id);
	o.put(m.token);
	o.put(m.replaces);
}

Status decode(std::span<const std::byte> in, HelloRequest &m)
{
	if (in.size() != kHelloRequestSize)
		return Status::fail("HELLO body has the wrong size");
	In i(in);
	HelloRequest r;
	r.client_version = i.get<uint32_t>();
	r.want_rdma = i.get<uint32_t>();
	r.session_id = i.get<uint64_t>();
	r.token = i.get<uint64_t>();
	r.replaces = i.get<uint64_t>();
	if (r.client_version != kVersion)
		return Status::fail("HELLO from an unsupported client version");
	if (r.want_rdma > 1)
		return Status::fail("HELLO want_rdma is not 0 or 1");
	if ((r.session_id == 0) != (r.token == 0))
		return Status::fail("HELLO session id and token must both be set or both zero");
	if (r.replaces && !r.session_id)
		return Status::fail("HELLO replaces a connection of no session");
	m = r;
	return {};
}

void encode(const HelloReply &m, std::span<std::byte> out)
{
	Out o(out.first<kHelloReplySize>());
	o.put(m.session_id);
	o.put(m.token);
	o.put(m.slab_size);
	o.put(m.slabs_total);
	o.put(m.slabs_free);
	o.put(m.max_io);
	o.put(m.server_flags);
	o.put(m.conn_id);
	o.put_bytes(m.challenge);
}

Status decode(std::span<const std::byte> in, HelloReply &m)
{
	if (in.size() != kHelloReplySize)
		return Status::fail("HELLO reply has the wrong size");
	In i(in);
	HelloReply r;
	r.session_id = i.get<uint64_t>();
	r.token = i.get<uint64_t>();
	r.slab_size = i.get<uint64_t>();
	r.slabs_total = i.get<uint32_t>();
	r.slabs_free = i.get<uint32_t>();
	r.max_io = i.get<uint32_t>();
	r.server_flags = i.get<uint32_t>();
	r.conn_id = i.get<uint64_t>();
	i.get_bytes(r.challenge);
	if (r.session_id == 0 || r.token == 0 || r.conn_id == 0)
		return Status::fail("HELLO reply without a session");
	if (r.challenge == decltype(r.challenge){})
		return Status::fail("HELLO reply without a challenge");
	if (r.slab_size < 4096 || (r.slab_size & (r.slab_size - 1)) != 0)
		return Status::fail("HELLO reply slab size is not a power of two >= 4096");
	if (r.slabs_free > r.slabs_total)
		return Status::fail("HELLO reply has more free slabs than slabs");
	if (r.max_io == 0 || r.max_io > kMaxIo || r.max_io % 4096 != 0)
		return Status::fail("HELLO reply max_io out of range");
	if (r.server_flags & ~kServerRdma)
		return Status::fail("HELLO reply has unknown server flags");
	m = r;
	return {};
}

void encode(const AllocReply &m, std::span<std::byte> out)
{
	Out o(out.first<kAllocReplySize>());
	o.put(m.slab_id);
	o.put(m.rkey);
	o.put(m.addr);
	o.put(m.length);
	o.put(m.slabs_free);
	o.put(m.reserved);
}

Status decode(std::span<const std::byte> in, AllocReply &m)
{
	if (in.size() != kAllocReplySize)
		return Status::fail("ALLOC reply has the wrong size");
	In i(in);
	AllocReply r;
	r.slab_id = i.get<uint32_t>();
	r.rkey = i.get<uint32_t>();
	r.addr = i.get<uint64_t>();
	r.length = i.get<uint64_t>();
	r.slabs_free = i.get<uint32_t>();
	r.reserved = i.get<uint32_t>();
	if (r.length == 0)
		return Status::fail("ALLOC reply with an empty slab");
	if (r.reserved != 0)
		return Status::fail("ALLOC reply reserved field not zero");
	if (r.addr + r.length < r.addr)
		return Status::fail("ALLOC reply address range wraps");
	m = r;
	return {};
}

void encode(const FreeRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kFreeRequestSize>());
	o.put(m.slab_id);
	o.put(m.reserved);
}

Status decode(std::span<const std::byte> in, FreeRequest &m)
{
	if (in.size() != kFreeRequestSize)
		return Status::fail("FREE body has the wrong size");
	In i(in);
	FreeRequest r;
	r.slab_id = i.get<uint32_t>();
	r.reserved = i.get<uint32_t>();
	if (r.reserved != 0)
		return Status::fail("FREE reserved field not zero");
	m = r;
	return {};
}

void encode(const IoRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kIoRequestSize>());
	o.put(m.slab_id);
	o.put(m.length);
	o.put(m.offset);
}

Status decode(std::span<const std::byte> in, IoRequest &m)
{
	if (in.size() != kIoRequestSize)
		return Status::fail("I/O body has the wrong size");
	In i(in);
	IoRequest r;
	r.slab_id = i.get<uint32_t>();
	r.length = i.get<uint32_t>();
	r.offset = i.get<uint64_t>();
	if (r.length == 0 || r.length > kMaxIo)
		return Status::fail("I/O length out of range");
	if (r.offset + r.length < r.offset)
		return Status::fail("I/O range wraps");
	m = r;
	return {};
}

void encode(const StatsReply &m, std::span<std::byte> out)
{
	Out o(out.first<kStatsReplySize>());
	o.put(m.capacity);
	o.put(m.slab_size);
	o.put(m.slabs_total);
	o.put(m.slabs_free);
	o.put(m.sessions);
	o.put(m.rdma_qps);
	o.put(m.tcp_read_ops);
	o.put(m.tcp_read_bytes);
	o.put(m.tcp_write_ops);
	o.put(m.tcp_write_bytes);
	o.put(m.rdma_sessions);
	o.put(m.connections);
	o.put(m.reserved);
}

Status decode(std::span<const std::byte> in, StatsReply &m)
{
	if (in.size() != kStatsReplySize)
		return Status::fail("STATS reply has the wrong size");
	In i(in);
	StatsReply r;
	r.capacity = i.get<uint64_t>();
	r.slab_size = i.get<uint64_t>();
	r.slabs_total = i.get<uint32_t>();
	r.slabs_free = i.get<uint32_t>();
	r.sessions = i.get<uint32_t>();
	r.rdma_qps = i.get<uint32_t>();
	r.tcp_read_ops = i.get<uint64_t>();
	r.tcp_read_bytes = i.get<uint64_t>();
	r.tcp_write_ops = i.get<uint64_t>();
	r.tcp_write_bytes = i.get<uint64_t>();
	r.rdma_sessions = i.get<uint32_t>();
	r.connections = i.get<uint32_t>();
	r.reserved = i.get<uint64_t>();
	if (r.slabs_free > r.slabs_total)
		return Status::fail("STATS reply has more free slabs than slabs");
	m = r;
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
void put_name(Out &o, std::span<const char> f)
{
	o.put_bytes(std::as_bytes(f));
}
void get_name(In &i, std::span<char> f)
{
	i.get_bytes(std::as_writable_bytes(f));
}

template <typename E, size_t Size, typename Put>
void encode_list_of(std::span<const E> in, std::span<std::byte> out, Put put)
{
	Out o(out.first(4 + in.size() * Size));
	o.put(uint32_t(in.size()));
	for (const E &e : in)
		put(o, e);
}

template <typename E, size_t Size, typename Get>
long decode_list_of(std::span<const std::byte> in, std::span<E> out, Get get)
{
	if (in.size() < 4)
		return -1;
	In i(in);
	const uint32_t count = i.get<uint32_t>();
	if (count > (kMaxIo - 4) / Size || in.size() != 4 + uint64_t(count) * Size ||
	    count > out.size())
		return -1;
	for (uint32_t k = 0; k < count; k++)
		if (!get(i, out[k]))
			return -1;
	return long(count);
}
} // namespace

void encode_entries(std::span<const VolumeEntry> in, std::span<std::byte> out)
{
	encode_list_of<VolumeEntry, kVolumeEntrySize>(in, out, [](Out &o, const VolumeEntry &e) {
		o.put(e.slab_id);
		o.put(e.rkey);
		o.put(e.addr);
		o.put(e.chunk);
		o.put(e.epoch);
	});
}

long decode_entries(std::span<const std::byte> in, std::span<VolumeEntry> out)
{
	return decode_list_of<VolumeEntry, kVolumeEntrySize>(in, out, [](In &i, VolumeEntry &e) {
		e.slab_id = i.get<uint32_t>();
		e.rkey = i.get<uint32_t>();
		e.addr = i.get<uint64_t>();
		e.chunk = i.get<uint64_t>();
		e.epoch = i.get<uint64_t>();
		return true;
	});
}

void encode_entries(std::span<const SessionEntry> in, std::span<std::byte> out)
{
	encode_list_of<SessionEntry, kSessionEntrySize>(in, out, [](Out &o, const SessionEntry &e) {
		o.put(e.session);
		o.put(e.slabs);
		o.put(e.flags);
		o.put(e.lease_left_ms);
		o.put(e.lease_s);
		o.put(e.connections);
		put_name(o, e.volume);
		put_name(o, e.peer);
	});
}

long decode_entries(std::span<const std::byte> in, std::span<SessionEntry> out)
{
	return decode_list_of<SessionEntry, kSessionEntrySize>(in, out, [](In &i, SessionEntry &e) {
		e.session = i.get<uint64_t>();
		e.slabs = i.get<uint32_t>();
		e.flags = i.get<uint32_t>();
		e.lease_left_ms = i.get<uint64_t>();
		e.lease_s = i.get<uint32_t>();
		e.connections = i.get<uint32_t>();
		get_name(i, e.volume);
		get_name(i, e.peer);
		return name_field_ok(e.volume) && name_field_ok(e.peer) &&
		       !(e.flags & ~(kSessionDetached | kSessionRdma | kSessionBound));
	});
}

void encode(const BindRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kBindRequestSize>());
	put_name(o, m.name);
	o.put(m.lease_s);
	o.put(m.reserved);
	o.put_bytes(m.pubkey);
	o.put_bytes(m.proof);
}

Status decode(std::span<const std::byte> in, BindRequest &m)
{
	if (in.size() != kBindRequestSize)
		return Status::fail("BIND body has the wrong size");
	In i(in);
	BindRequest r;
	get_name(i, r.name);
	r.lease_s = i.get<uint32_t>();
	r.reserved = i.get<uint32_t>();
	i.get_bytes(r.pubkey);
	i.get_bytes(r.proof);
	if (!name_field_ok(r.name) ||
	    !valid_volume_name(std::string_view(r.name.data(), strnlen(r.name.data(), r.name.size()))))
		return Status::fail("BIND volume name is not 1..64 graphic ASCII characters");
	if (r.reserved != 0)
		return Status::fail("BIND reserved field not zero");
	m = r;
	return {};
}

void encode(const BindReply &m, std::span<std::byte> out)
{
	Out o(out.first<kBindReplySize>());
	o.put(m.reattached);
	o.put(m.slabs);
	o.put(m.detached_ms);
}

Status decode(std::span<const std::byte> in, BindReply &m)
{
	if (in.size() != kBindReplySize)
		return Status::fail("BIND reply has the wrong size");
	In i(in);
	BindReply r;
	r.reattached = i.get<uint32_t>();
	r.slabs = i.get<uint32_t>();
	r.detached_ms = i.get<uint64_t>();
	if (r.reattached > 1)
		return Status::fail("BIND reply reattached is not 0 or 1");
	m = r;
	return {};
}

void encode(const AllocTaggedRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kAllocTaggedRequestSize>());
	o.put(m.chunk);
	o.put(m.epoch);
}

Status decode(std::span<const std::byte> in, AllocTaggedRequest &m)
{
	if (in.size() != kAllocTaggedRequestSize)
		return Status::fail("ALLOC_TAGGED body has the wrong size");
	In i(in);
	m.chunk = i.get<uint64_t>();
	m.epoch = i.get<uint64_t>();
	return {};
}

void encode(const SetTagRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kSetTagRequestSize>());
	o.put(m.slab_id);
	o.put(m.reserved);
	o.put(m.chunk);
	o.put(m.epoch);
}

Status decode(std::span<const std::byte> in, SetTagRequest &m)
{
	if (in.size() != kSetTagRequestSize)
		return Status::fail("SET_TAG body has the wrong size");
	In i(in);
	SetTagRequest r;
	r.slab_id = i.get<uint32_t>();
	r.reserved = i.get<uint32_t>();
	r.chunk = i.get<uint64_t>();
	r.epoch = i.get<uint64_t>();
	if (r.reserved != 0)
		return Status::fail("SET_TAG reserved field not zero");
	m = r;
	return {};
}

void encode(const VolumeListRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kVolumeListRequestSize>());
	o.put(uint32_t(m.what));
	o.put(m.reserved);
	o.put(m.start);
}

Status decode(std::span<const std::byte> in, VolumeListRequest &m)
{
	if (in.size() != kVolumeListRequestSize)
		return Status::fail("VOLUME_LIST body has the wrong size");
	In i(in);
	VolumeListRequest r;
	const uint32_t what = i.get<uint32_t>();
	r.reserved = i.get<uint32_t>();
	r.start = i.get<uint64_t>();
	if (what > uint32_t(ListWhat::Sessions))
		return Status::fail("VOLUME_LIST asks for an unknown list");
	if (r.reserved != 0)
		return Status::fail("VOLUME_LIST reserved field not zero");
	r.what = ListWhat(what);
	m = r;
	return {};
}

void encode(const GiveBackRequest &m, std::span<std::byte> out)
{
	Out o(out.first<kGiveBackRequestSize>());
	o.put(m.bytes);
}

Status decode(std::span<const std::byte> in, GiveBackRequest &m)
{
	if (in.size() != kGiveBackRequestSize)
		return Status::fail("GIVEBACK body has the wrong size");
	In i(in);
	GiveBackRequest r;
	r.bytes = i.get<uint64_t>();
	if (r.bytes == 0)
		return Status::fail("GIVEBACK of 0 bytes");
	m = r;
	return {};
}

void encode(const GiveBackReply &m, std::span<std::byte> out)
{
	Out o(out.first<kGiveBackReplySize>());
	o.put(m.withdrawn_now);
	o.put(m.wanted_now);
	o.put(m.slabs_withdrawn);
	o.put(m.slabs_wanted);
	o.put(m.slabs_total);
	o.put(m.reserved);
}

Status decode(std::span<const std::byte> in, GiveBackReply &m)
{
	if (in.size() != kGiveBackReplySize)
		return Status::fail("GIVEBACK reply has the wrong size");
	In i(in);
	GiveBackReply r;
	r.withdrawn_now = i.get<uint32_t>();
	r.wanted_now = i.get<uint32_t>();
	r.slabs_withdrawn = i.get<uint32_t>();
	r.slabs_wanted = i.get<uint32_t>();
	r.slabs_total = i.get<uint32_t>();
	r.reserved = i.get<uint32_t>();
	if (r.reserved != 0)
		return Status::fail("GIVEBACK reply reserved field not zero");
	// (The "now" counts may exceed the totals in a LEND reply, which lowers them.)
	if (uint64_t(r.slabs_withdrawn) + r.slabs_wanted > r.slabs_total ||
	    r.withdrawn_now > r.slabs_total || r.wanted_now > r.slabs_total)
		return Status::fail("GIVEBACK reply counts exceed the slab count");
	m = r;
	return {};
}

} // namespace rdmaswap::proto
