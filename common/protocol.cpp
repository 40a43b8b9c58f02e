// SPDX-License-Identifier: MIT
// Encoding and validating decoding of rdmaswap protocol messages.
#include "common/protocol.h"

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
	case Op::Auth: return "AUTH";
	case Op::AuthProof: return "AUTH_PROOF";
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
	case Op::Auth: return kAuthRequestSize;
	case Op::AuthProof: return kAuthProofRequestSize;
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
	case Op::Auth: return kAuthReplySize;
	case Op::AuthProof: return 0;
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
	if (r.session_id == 0 || r.token == 0 || r.conn_id == 0)
		return Status::fail("HELLO reply without a session");
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
	if (uint64_t(r.slabs_withdrawn) + r.slabs_wanted > r.slabs_total ||
	    r.withdrawn_now > r.slabs_withdrawn || r.wanted_now > r.slabs_wanted)
		return Status::fail("GIVEBACK reply counts exceed the slab count");
	m = r;
	return {};
}

} // namespace rdmaswap::proto
