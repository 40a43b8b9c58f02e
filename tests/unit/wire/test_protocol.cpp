// SPDX-License-Identifier: MIT
// Unit tests for common/wire/protocol: wire layout, round trips, and rejection of malformed input.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <random>
#include <vector>

#include "common/wire/protocol.h"

using namespace rdmaswap::proto;

namespace {

using HeaderBytes = std::array<std::byte, kHeaderSize>;

HeaderBytes encode_h(const Header &h)
{
	HeaderBytes b{};
	encode_header(h, std::span<std::byte, kHeaderSize>(b));
	return b;
}

Status decode_h(const HeaderBytes &b, Header &out)
{
	return decode_header(std::span<const std::byte, kHeaderSize>(b), out);
}

Status decode_h(const HeaderBytes &b)
{
	Header h;
	return decode_h(b, h);
}

Header make(Op op, uint16_t flags, uint32_t status, uint32_t body_len, uint64_t id = 7)
{
	Header h;
	h.op = op;
	h.flags = flags;
	h.status = status;
	h.body_len = body_len;
	h.request_id = id;
	return h;
}

void put_le(HeaderBytes &b, size_t at, uint64_t v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		b[at + i] = std::byte((v >> (8 * i)) & 0xff);
}

// A valid request header, in bytes, that tests then corrupt.
HeaderBytes valid_request_bytes()
{
	return encode_h(make(Op::Read, 0, 0, uint32_t(kIoRequestSize), 0x1122334455667788ull));
}

template <typename Msg, size_t N> std::array<std::byte, N> enc(const Msg &m)
{
	std::array<std::byte, N> b{};
	encode(m, std::span<std::byte>(b));
	return b;
}

// Run a body decoder over spans of size 0, N-1 and N+1 (taken from a buffer whose first N bytes
// are a valid body) and check each is rejected without touching `m`.
template <typename Msg> void check_wrong_sizes(const std::vector<std::byte> &valid, size_t n)
{
	REQUIRE(valid.size() == n);
	std::vector<std::byte> big(valid);
	big.push_back(std::byte{0});
	Msg m;
	// Sanity: the exact size decodes.
	REQUIRE(decode(std::span<const std::byte>(big.data(), n), m).ok);
	for (size_t sz : {size_t(0), n - 1, n + 1}) {
		INFO("span size " << sz << " for body of " << n);
		Msg out;
		std::vector<std::byte> before(sizeof(Msg));
		std::memcpy(before.data(), &out, sizeof(Msg));
		const Status st = decode(std::span<const std::byte>(big.data(), sz), out);
		CHECK_FALSE(st.ok);
		CHECK(st.error != nullptr);
		CHECK(std::memcmp(before.data(), &out, sizeof(Msg)) == 0);
	}
	// An empty span with a null pointer, too.
	Msg out;
	CHECK_FALSE(decode(std::span<const std::byte>(), out).ok);
}

template <size_t N> std::vector<std::byte> vec(const std::array<std::byte, N> &a)
{
	return std::vector<std::byte>(a.begin(), a.end());
}

} // namespace

TEST_CASE("protocol: constants", "[protocol]")
{
	CHECK(kHeaderSize == 32);
	CHECK(kMaxIo == 1048576);
	const std::array<Op, 6> ops{Op::Hello, Op::Alloc, Op::Free, Op::Read, Op::Write, Op::Stats};
	for (Op op : ops) {
		CHECK(request_body_size(op) >= 0);
		CHECK(reply_body_size(op) >= 0);
	}
	size_t largest = 0; // over every op: BIND's request (168 bytes) is the largest body
	for (unsigned op = 0; op < 256; op++)
		if (request_body_size(Op(op)) >= 0)
			largest = std::max({largest, size_t(request_body_size(Op(op))),
					    size_t(reply_body_size(Op(op)))});
	CHECK(largest == kMaxFixedBody);
	CHECK(kMaxFixedBody == 168);
	CHECK(kVersion == 2);
	CHECK(request_body_size(Op::Hello) == 32);
	CHECK(request_body_size(Op::Alloc) == 0);
	CHECK(request_body_size(Op::Free) == 8);
	CHECK(request_body_size(Op::Read) == 16);
	CHECK(request_body_size(Op::Write) == 16);
	CHECK(request_body_size(Op::Stats) == 0);
	CHECK(reply_body_size(Op::Hello) == 80);
	CHECK(reply_body_size(Op::Alloc) == 32);
	CHECK(reply_body_size(Op::Free) == 0);
	CHECK(reply_body_size(Op::Read) == 0);
	CHECK(reply_body_size(Op::Write) == 0);
	CHECK(reply_body_size(Op::Stats) == 80);
	CHECK(request_body_size(Op(0)) == -1);
	CHECK(reply_body_size(Op(99)) == -1);
	CHECK(std::string(op_name(Op::Hello)) == "HELLO");
	CHECK(std::string(op_name(Op::Write)) == "WRITE");
	CHECK(std::string(op_name(Op::Stats)) == "STATS");
	CHECK(std::string(op_name(Op(42))) == "UNKNOWN");
}

TEST_CASE("protocol: header wire bytes are little-endian with magic RDSW", "[protocol]")
{
	const Header h = make(Op::Write, kFlagResponse, 0, 0x00010010,
			      0x0102030405060708ull);
	const HeaderBytes b = encode_h(h);
	const std::array<uint8_t, 32> expect{
		'R', 'D', 'S', 'W',        // magic
		0x02,                      // version
		0x05,                      // op WRITE
		0x01, 0x00,                // flags
		0x00, 0x00, 0x00, 0x00,    // status
		0x10, 0x00, 0x01, 0x00,    // body_len 0x00010010
		0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // request id
		0, 0, 0, 0, 0, 0, 0, 0,    // reserved
	};
	for (size_t i = 0; i < 32; i++) {
		INFO("byte " << i);
		CHECK(uint8_t(b[i]) == expect[i]);
	}

	// An error response: status and request id bytes.
	const Header e = make(Op::Alloc, kFlagResponse, 0x00000ffe, 0, 0xfedcba9876543210ull);
	const HeaderBytes eb = encode_h(e);
	CHECK(uint8_t(eb[5]) == 2);
	CHECK(uint8_t(eb[8]) == 0xfe);
	CHECK(uint8_t(eb[9]) == 0x0f);
	CHECK(uint8_t(eb[10]) == 0);
	CHECK(uint8_t(eb[16]) == 0x10);
	CHECK(uint8_t(eb[23]) == 0xfe);
}

TEST_CASE("protocol: header round trip for every op, request and response", "[protocol]")
{
	const std::array<Op, 6> ops{Op::Hello, Op::Alloc, Op::Free, Op::Read, Op::Write, Op::Stats};
	uint64_t id = 0x8000000000000001ull;
	for (Op op : ops) {
		INFO("op " << op_name(op));
		// Request.
		uint32_t req_len = uint32_t(request_body_size(op));
		if (op == Op::Write)
			req_len += 12345;
		Header rq = make(op, 0, 0, req_len, id++);
		Header out;
		REQUIRE(decode_h(encode_h(rq), out).ok);
		CHECK(out.op == op);
		CHECK(out.flags == 0);
		CHECK_FALSE(out.is_response());
		CHECK(out.status == 0);
		CHECK(out.body_len == req_len);
		CHECK(out.request_id == rq.request_id);

		// Successful response.
		uint32_t rep_len = uint32_t(reply_body_size(op));
		if (op == Op::Read)
			rep_len = kMaxIo;
		Header rp = make(op, kFlagResponse, 0, rep_len, ~uint64_t(0) - id);
		Header out2;
		REQUIRE(decode_h(encode_h(rp), out2).ok);
		CHECK(out2.op == op);
		CHECK(out2.is_response());
		CHECK(out2.body_len == rep_len);
		CHECK(out2.request_id == rp.request_id);

		// Error response.
		Header er = make(op, kFlagResponse, 4095, 0, 0);
		Header out3;
		REQUIRE(decode_h(encode_h(er), out3).ok);
		CHECK(out3.status == 4095);
		CHECK(out3.body_len == 0);
	}
}

TEST_CASE("protocol: malformed headers are rejected", "[protocol]")
{
	Header untouched = make(Op::Stats, 0, 0, 0, 0xabcdef);
	auto rejected = [&](const HeaderBytes &b) {
		Header out = untouched;
		const Status st = decode_h(b, out);
		CHECK(st.error != nullptr);
		// A rejected header leaves the output alone.
		CHECK(out.request_id == untouched.request_id);
		CHECK(out.op == untouched.op);
		return !st.ok;
	};
	REQUIRE(decode_h(valid_request_bytes()).ok);

	SECTION("bad magic")
	{
		for (size_t i = 0; i < 4; i++) {
			HeaderBytes b = valid_request_bytes();
			b[i] ^= std::byte{0x20};
			CHECK(rejected(b));
		}
		HeaderBytes b = valid_request_bytes();
		put_le(b, 0, 0x52445357, 4); // big-endian magic
		CHECK(rejected(b));
	}
	SECTION("bad version")
	{
		for (uint8_t v : {0, 1, 3, 255}) { // 1: a peer of the protocol before volume keys
			HeaderBytes b = valid_request_bytes();
			b[4] = std::byte{v};
			CHECK(rejected(b));
		}
	}
	SECTION("unknown op")
	{
		for (uint8_t op : {0, 8, 9, 128, 255}) {
			INFO("op " << int(op));
			HeaderBytes b = valid_request_bytes();
			b[5] = std::byte{op};
			put_le(b, 12, 0, 4);
			CHECK(rejected(b));
			b[6] = std::byte{1}; // as a response too
			CHECK(rejected(b));
		}
	}
	SECTION("unknown flags")
	{
		for (uint16_t f : {2, 3, 0x100, 0x8000, 0xffff}) {
			HeaderBytes b = valid_request_bytes();
			put_le(b, 6, f, 2);
			CHECK(rejected(b));
		}
	}
	SECTION("non-zero reserved")
	{
		for (size_t i = 24; i < 32; i++) {
			HeaderBytes b = valid_request_bytes();
			b[i] = std::byte{0x01};
			CHECK(rejected(b));
		}
	}
	SECTION("request with status")
	{
		for (uint32_t s : {1u, 5u, 4095u, 0x80000000u}) {
			HeaderBytes b = valid_request_bytes();
			put_le(b, 8, s, 4);
			CHECK(rejected(b));
		}
	}
	SECTION("request with the wrong body length for its op")
	{
		const std::array<Op, 5> ops{Op::Hello, Op::Alloc, Op::Free, Op::Read, Op::Stats};
		for (Op op : ops) {
			const uint32_t fixed = uint32_t(request_body_size(op));
			for (uint32_t len : {fixed + 1, fixed + 16, fixed + kMaxIo, 0xffffffffu}) {
				INFO(op_name(op) << " body_len " << len);
				CHECK(rejected(encode_h(make(op, 0, 0, len))));
			}
			if (fixed > 0) {
				CHECK(rejected(encode_h(make(op, 0, 0, fixed - 1))));
				CHECK(rejected(encode_h(make(op, 0, 0, 0))));
			}
		}
		// WRITE: less than its fixed body.
		for (uint32_t len = 0; len < kIoRequestSize; len++)
			CHECK(rejected(encode_h(make(Op::Write, 0, 0, len))));
	}
	SECTION("WRITE payload larger than kMaxIo")
	{
		const uint32_t fixed = uint32_t(kIoRequestSize);
		Header ok;
		CHECK(decode_h(encode_h(make(Op::Write, 0, 0, fixed + kMaxIo)), ok).ok);
		CHECK(decode_h(encode_h(make(Op::Write, 0, 0, fixed)), ok).ok);
		CHECK(rejected(encode_h(make(Op::Write, 0, 0, fixed + kMaxIo + 1))));
		CHECK(rejected(encode_h(make(Op::Write, 0, 0, 0xffffffffu))));
		CHECK(rejected(encode_h(make(Op::Write, 0, 0, 0xfffffff0u))));
	}
	SECTION("error response with a body")
	{
		for (Op op : {Op::Hello, Op::Alloc, Op::Read, Op::Stats})
			CHECK(rejected(encode_h(make(op, kFlagResponse, 5, uint32_t(std::max(
				reply_body_size(op), 1L))))));
	}
	SECTION("status above 4095")
	{
		for (uint32_t s : {4096u, 65536u, 0xffffffffu})
			CHECK(rejected(encode_h(make(Op::Free, kFlagResponse, s, 0))));
	}
	SECTION("successful response with the wrong body length")
	{
		for (Op op : {Op::Hello, Op::Alloc, Op::Free, Op::Write, Op::Stats}) {
			const uint32_t fixed = uint32_t(reply_body_size(op));
			CHECK(rejected(encode_h(make(op, kFlagResponse, 0, fixed + 1))));
			if (fixed)
				CHECK(rejected(encode_h(make(op, kFlagResponse, 0, fixed - 1))));
		}
	}
	SECTION("READ reply larger than kMaxIo")
	{
		Header ok;
		CHECK(decode_h(encode_h(make(Op::Read, kFlagResponse, 0, kMaxIo)), ok).ok);
		CHECK(decode_h(encode_h(make(Op::Read, kFlagResponse, 0, 0)), ok).ok);
		CHECK(rejected(encode_h(make(Op::Read, kFlagResponse, 0, kMaxIo + 1))));
		CHECK(rejected(encode_h(make(Op::Read, kFlagResponse, 0, 0xffffffffu))));
	}
}

TEST_CASE("protocol: random header bytes never crash and accepted ones re-encode identically",
	  "[protocol]")
{
	std::mt19937_64 rng(0x5eed1234);
	size_t accepted = 0;
	auto check_one = [&](const HeaderBytes &b) {
		Header h;
		const Status st = decode_h(b, h);
		if (!st.ok) {
			REQUIRE(st.error != nullptr);
			return;
		}
		accepted++;
		// The header carries no version or reserved field, and encode_header writes the
		// only values decode accepts for them, so an accepted header re-encodes exactly.
		const HeaderBytes again = encode_h(h);
		REQUIRE(again == b);
	};
	// Pure noise: nearly all rejected at the magic.
	for (int i = 0; i < 100000; i++) {
		HeaderBytes b;
		for (size_t j = 0; j < kHeaderSize; j += 8)
			put_le(b, j, rng(), 8);
		check_one(b);
	}
	// Noise that gets past the magic and version, with fields drawn near the interesting
	// boundaries, so the later checks are exercised too.
	const std::array<uint32_t, 12> lens{0, 1, 8, 15, 16, 17, 24, 40, 80,
					    16 + kMaxIo, kMaxIo + 1, 0xffffffff};
	const size_t accepted_noise = accepted;
	for (int i = 0; i < 100000; i++) {
		HeaderBytes b;
		for (size_t j = 0; j < kHeaderSize; j += 8)
			put_le(b, j, rng(), 8);
		put_le(b, 0, kMagic, 4);
		if (rng() % 8)
			b[4] = std::byte{kVersion};
		b[5] = std::byte(uint8_t(rng() % 9));
		if (rng() % 4)
			put_le(b, 6, rng() % 2, 2);
		if (rng() % 2)
			put_le(b, 8, 0, 4);
		else if (rng() % 2)
			put_le(b, 8, rng() % 5000, 4);
		if (rng() % 4)
			put_le(b, 12, lens[rng() % lens.size()], 4);
		if (rng() % 8)
			put_le(b, 24, 0, 8);
		check_one(b);
	}
	INFO("accepted " << accepted << " (" << accepted_noise << " from pure noise)");
	CHECK(accepted > 1000); // the structured half must reach the accept path
}

TEST_CASE("protocol: body round trips", "[protocol]")
{
	SECTION("HelloRequest")
	{
		HelloRequest m;
		m.client_version = kVersion;
		m.want_rdma = 1;
		m.session_id = 0x1122334455667788ull;
		m.token = 0x99aabbccddeeff00ull;
		auto b = enc<HelloRequest, kHelloRequestSize>(m);
		CHECK(uint8_t(b[0]) == kVersion);
		CHECK(uint8_t(b[4]) == 1);
		CHECK(uint8_t(b[8]) == 0x88);
		CHECK(uint8_t(b[15]) == 0x11);
		CHECK(uint8_t(b[16]) == 0x00);
		CHECK(uint8_t(b[23]) == 0x99);
		HelloRequest d;
		REQUIRE(decode(std::span<const std::byte>(b), d).ok);
		CHECK(d.client_version == m.client_version);
		CHECK(d.want_rdma == 1);
		CHECK(d.session_id == m.session_id);
		CHECK(d.token == m.token);

		HelloRequest fresh; // new session: both zero
		auto fb = enc<HelloRequest, kHelloRequestSize>(fresh);
		HelloRequest fd;
		fd.token = 5;
		REQUIRE(decode(std::span<const std::byte>(fb), fd).ok);
		CHECK(fd.session_id == 0);
		CHECK(fd.token == 0);
		CHECK(fd.want_rdma == 0);
	}
	SECTION("HelloReply")
	{
		HelloReply m;
		m.session_id = 0x0102030405060708ull;
		m.token = 0xf0e0d0c0b0a09080ull;
		m.slab_size = uint64_t(1) << 40;
		m.slabs_total = 0xfffffffe;
		m.slabs_free = 0x12345678;
		m.max_io = kMaxIo;
		m.server_flags = kServerRdma;
		m.conn_id = 0x1122334455667788ull;
		for (size_t i = 0; i < m.challenge.size(); i++)
			m.challenge[i] = std::byte(0xa0 + i);
		auto b = enc<HelloReply, kHelloReplySize>(m);
		CHECK(uint8_t(b[0]) == 0x08);
		CHECK(uint8_t(b[40]) == 0x88); // conn_id after server_flags
		CHECK(uint8_t(b[48]) == 0xa0); // the challenge after conn_id, to the end
		CHECK(uint8_t(b[79]) == 0xa0 + 31);
		CHECK(uint8_t(b[16 + 5]) == 0x01); // slab size 1<<40: byte 5
		CHECK(uint8_t(b[28]) == 0x78);
		CHECK(uint8_t(b[32 + 2]) == 0x10); // max_io 0x100000
		CHECK(uint8_t(b[36]) == 1);
		HelloReply d;
		REQUIRE(decode(std::span<const std::byte>(b), d).ok);
		CHECK(d.conn_id == m.conn_id);
		CHECK(d.challenge == m.challenge);
		CHECK(d.session_id == m.session_id);
		CHECK(d.token == m.token);
		CHECK(d.slab_size == m.slab_size);
		CHECK(d.slabs_total == m.slabs_total);
		CHECK(d.slabs_free == m.slabs_free);
		CHECK(d.max_io == m.max_io);
		CHECK(d.server_flags == m.server_flags);
	}
	SECTION("AllocReply")
	{
		AllocReply m;
		m.slab_id = 0xdeadbeef;
		m.rkey = 0x01020304;
		m.addr = 0x00007f0012340000ull;
		m.length = 1u << 26;
		auto b = enc<AllocReply, kAllocReplySize>(m);
		CHECK(uint8_t(b[0]) == 0xef);
		CHECK(uint8_t(b[4]) == 0x04);
		CHECK(uint8_t(b[10]) == 0x34);
		CHECK(uint8_t(b[19]) == 0x04);
		AllocReply d;
		REQUIRE(decode(std::span<const std::byte>(b), d).ok);
		CHECK(d.slab_id == m.slab_id);
		CHECK(d.rkey == m.rkey);
		CHECK(d.addr == m.addr);
		CHECK(d.length == m.length);

		AllocReply tcp; // TCP grant: addr 0, rkey 0
		tcp.slab_id = 3;
		tcp.length = 65536;
		auto tb = enc<AllocReply, kAllocReplySize>(tcp);
		REQUIRE(decode(std::span<const std::byte>(tb), d).ok);
		CHECK(d.slab_id == 3);
		CHECK(d.addr == 0);
		CHECK(d.rkey == 0);
	}
	SECTION("FreeRequest")
	{
		FreeRequest m;
		m.slab_id = 0xa1b2c3d4;
		auto b = enc<FreeRequest, kFreeRequestSize>(m);
		CHECK(uint8_t(b[0]) == 0xd4);
		CHECK(uint8_t(b[3]) == 0xa1);
		CHECK(uint8_t(b[4]) == 0);
		FreeRequest d;
		REQUIRE(decode(std::span<const std::byte>(b), d).ok);
		CHECK(d.slab_id == m.slab_id);
		CHECK(d.reserved == 0);
	}
	SECTION("IoRequest")
	{
		IoRequest m;
		m.slab_id = 77;
		m.length = kMaxIo;
		m.offset = 0x0000123400005000ull;
		auto b = enc<IoRequest, kIoRequestSize>(m);
		CHECK(uint8_t(b[0]) == 77);
		CHECK(uint8_t(b[6]) == 0x10);
		CHECK(uint8_t(b[9]) == 0x50);
		CHECK(uint8_t(b[13]) == 0x12);
		IoRequest d;
		REQUIRE(decode(std::span<const std::byte>(b), d).ok);
		CHECK(d.slab_id == 77);
		CHECK(d.length == kMaxIo);
		CHECK(d.offset == m.offset);

		m.length = 1;
		m.offset = ~uint64_t(0) - 1; // last byte, no wrap
		auto b2 = enc<IoRequest, kIoRequestSize>(m);
		REQUIRE(decode(std::span<const std::byte>(b2), d).ok);
		CHECK(d.offset == m.offset);
		CHECK(d.length == 1);
	}
	SECTION("StatsReply")
	{
		StatsReply m;
		m.capacity = 0x0000010000000000ull;
		m.slab_size = 1u << 26;
		m.slabs_total = 16384;
		m.slabs_free = 1000;
		m.sessions = 3;
		m.rdma_qps = 48;
		m.tcp_read_ops = 0x1111111111111111ull;
		m.tcp_read_bytes = 0x2222222222222222ull;
		m.tcp_write_ops = 0x3333333333333333ull;
		m.tcp_write_bytes = 0x4444444444444444ull;
		m.rdma_sessions = 2;
		m.connections = 17;
		m.reserved = 0x5555555555555555ull;
		auto b = enc<StatsReply, kStatsReplySize>(m);
		CHECK(uint8_t(b[40]) == 0x22);
		CHECK(uint8_t(b[56]) == 0x44);
		CHECK(uint8_t(b[64]) == 2);
		CHECK(uint8_t(b[68]) == 17);
		CHECK(uint8_t(b[79]) == 0x55);
		StatsReply d;
		REQUIRE(decode(std::span<const std::byte>(b), d).ok);
		CHECK(d.capacity == m.capacity);
		CHECK(d.slab_size == m.slab_size);
		CHECK(d.slabs_total == m.slabs_total);
		CHECK(d.slabs_free == m.slabs_free);
		CHECK(d.sessions == m.sessions);
		CHECK(d.rdma_qps == m.rdma_qps);
		CHECK(d.tcp_read_ops == m.tcp_read_ops);
		CHECK(d.tcp_read_bytes == m.tcp_read_bytes);
		CHECK(d.tcp_write_ops == m.tcp_write_ops);
		CHECK(d.tcp_write_bytes == m.tcp_write_bytes);
		CHECK(d.rdma_sessions == m.rdma_sessions);
		CHECK(d.connections == m.connections);
		CHECK(d.reserved == m.reserved);
	}
}

TEST_CASE("protocol: body decoders reject spans of the wrong size", "[protocol]")
{
	HelloRequest hq;
	check_wrong_sizes<HelloRequest>(vec(enc<HelloRequest, kHelloRequestSize>(hq)),
					kHelloRequestSize);
	HelloReply hr;
	hr.session_id = 1;
	hr.token = 2;
	hr.slab_size = 65536;
	hr.slabs_total = 4;
	hr.slabs_free = 4;
	hr.max_io = 4096;
	hr.conn_id = 3;
	hr.challenge[7] = std::byte{1};
	check_wrong_sizes<HelloReply>(vec(enc<HelloReply, kHelloReplySize>(hr)), kHelloReplySize);
	AllocReply ar;
	ar.length = 65536;
	check_wrong_sizes<AllocReply>(vec(enc<AllocReply, kAllocReplySize>(ar)), kAllocReplySize);
	FreeRequest fr;
	check_wrong_sizes<FreeRequest>(vec(enc<FreeRequest, kFreeRequestSize>(fr)),
				       kFreeRequestSize);
	IoRequest io;
	io.length = 4096;
	check_wrong_sizes<IoRequest>(vec(enc<IoRequest, kIoRequestSize>(io)), kIoRequestSize);
	StatsReply sr;
	check_wrong_sizes<StatsReply>(vec(enc<StatsReply, kStatsReplySize>(sr)), kStatsReplySize);
}

TEST_CASE("protocol: body decoders reject out-of-range fields", "[protocol]")
{
	SECTION("IoRequest length and wrap")
	{
		auto dec = [](uint32_t length, uint64_t offset) {
			IoRequest m;
			m.slab_id = 1;
			m.length = length;
			m.offset = offset;
			auto b = enc<IoRequest, kIoRequestSize>(m);
			IoRequest d;
			return decode(std::span<const std::byte>(b), d).ok;
		};
		CHECK(dec(1, 0));
		CHECK(dec(kMaxIo, 0));
		CHECK_FALSE(dec(0, 0));
		CHECK_FALSE(dec(kMaxIo + 1, 0));
		CHECK_FALSE(dec(0xffffffffu, 0));
		CHECK_FALSE(dec(4096, ~uint64_t(0) - 100));
		CHECK_FALSE(dec(2, ~uint64_t(0)));
		CHECK(dec(1, ~uint64_t(0) - 1));
		// offset + length == 2^64 exactly wraps to 0.
		CHECK_FALSE(dec(4096, ~uint64_t(0) - 4095));
	}
	SECTION("HelloRequest")
	{
		auto dec = [](uint32_t version, uint32_t want_rdma, uint64_t sid, uint64_t tok) {
			HelloRequest m;
			m.client_version = version;
			m.want_rdma = want_rdma;
			m.session_id = sid;
			m.token = tok;
			auto b = enc<HelloRequest, kHelloRequestSize>(m);
			HelloRequest d;
			return decode(std::span<const std::byte>(b), d).ok;
		};
		CHECK(dec(kVersion, 0, 0, 0));
		CHECK(dec(kVersion, 1, 5, 6));
		CHECK_FALSE(dec(kVersion, 2, 0, 0));
		CHECK_FALSE(dec(kVersion, 0xffffffffu, 0, 0));
		CHECK_FALSE(dec(kVersion, 0, 5, 0)); // session without token
		CHECK_FALSE(dec(kVersion, 0, 0, 6)); // token without session
		CHECK_FALSE(dec(0, 0, 0, 0));
		CHECK_FALSE(dec(1, 0, 0, 0)); // the protocol before volume keys
		CHECK_FALSE(dec(3, 0, 0, 0));
	}
	SECTION("HelloReply")
	{
		auto base = [] {
			HelloReply m;
			m.session_id = 10;
			m.token = 11;
			m.slab_size = 1u << 16;
			m.slabs_total = 8;
			m.slabs_free = 8;
			m.max_io = 256 * 1024;
			m.server_flags = 0;
			m.conn_id = 12;
			m.challenge[31] = std::byte{9};
			return m;
		};
		auto dec = [](const HelloReply &m) {
			auto b = enc<HelloReply, kHelloReplySize>(m);
			HelloReply d;
			return decode(std::span<const std::byte>(b), d).ok;
		};
		CHECK(dec(base()));
		HelloReply m = base();
		m.challenge = {}; // a server must give every connection a challenge
		CHECK_FALSE(dec(m));
		m = base();
		m.slab_size = 4096;
		CHECK(dec(m));
		for (uint64_t bad : {uint64_t(0), uint64_t(2048), uint64_t(65535), uint64_t(65536 + 4096),
				     uint64_t(3) << 20, ~uint64_t(0)}) {
			INFO("slab_size " << bad);
			m = base();
			m.slab_size = bad;
			CHECK_FALSE(dec(m));
		}
		for (uint32_t bad : {0u, 1u, 4095u, 4097u, 6000u, kMaxIo + 4096, 0xfffff000u}) {
			INFO("max_io " << bad);
			m = base();
			m.max_io = bad;
			CHECK_FALSE(dec(m));
		}
		m = base();
		m.max_io = 4096;
		CHECK(dec(m));
		m = base();
		m.session_id = 0;
		CHECK_FALSE(dec(m));
		m = base();
		m.token = 0;
		CHECK_FALSE(dec(m));
		m = base();
		m.slabs_free = 9;
		CHECK_FALSE(dec(m));
		m = base();
		m.server_flags = 2;
		CHECK_FALSE(dec(m));
		m.server_flags = kServerRdma;
		CHECK(dec(m));
	}
	SECTION("AllocReply")
	{
		auto dec = [](uint64_t addr, uint64_t length) {
			AllocReply m;
			m.slab_id = 1;
			m.addr = addr;
			m.length = length;
			auto b = enc<AllocReply, kAllocReplySize>(m);
			AllocReply d;
			return decode(std::span<const std::byte>(b), d).ok;
		};
		CHECK(dec(0, 65536));
		CHECK_FALSE(dec(0, 0));
		CHECK_FALSE(dec(0x1000, 0));
		CHECK_FALSE(dec(~uint64_t(0) - 100, 65536));
	}
	SECTION("FreeRequest reserved")
	{
		for (uint32_t r : {1u, 0x80000000u, 0xffffffffu}) {
			FreeRequest m;
			m.slab_id = 9;
			m.reserved = r;
			auto b = enc<FreeRequest, kFreeRequestSize>(m);
			FreeRequest d;
			d.slab_id = 123;
			CHECK_FALSE(decode(std::span<const std::byte>(b), d).ok);
			CHECK(d.slab_id == 123);
		}
	}
	SECTION("StatsReply free > total")
	{
		StatsReply m;
		m.slabs_total = 4;
		m.slabs_free = 5;
		auto b = enc<StatsReply, kStatsReplySize>(m);
		StatsReply d;
		CHECK_FALSE(decode(std::span<const std::byte>(b), d).ok);
	}
}

TEST_CASE("protocol: LIST reply round-trips and rejects malformed bodies", "[protocol]")
{
	const uint32_t ids[] = {3, 0, 0xfffffffe, 17};
	std::vector<std::byte> buf(4 + 4 * 4);
	rdmaswap::proto::encode_list(ids, buf);
	uint32_t out[8] = {};
	REQUIRE(rdmaswap::proto::decode_list(buf, out) == 4);
	CHECK(std::equal(std::begin(ids), std::end(ids), out));
	// Capacity too small, count not matching the size, not a multiple of 4, empty.
	CHECK(rdmaswap::proto::decode_list(buf, std::span(out, 3)) == -1);
	CHECK(rdmaswap::proto::decode_list(std::span(buf).first(buf.size() - 4), out) == -1);
	CHECK(rdmaswap::proto::decode_list(std::span(buf).first(buf.size() - 1), out) == -1);
	CHECK(rdmaswap::proto::decode_list({}, out) == -1);
	std::vector<std::byte> empty(4);
	rdmaswap::proto::encode_list({}, empty);
	CHECK(rdmaswap::proto::decode_list(empty, out) == 0);
	// A header announcing a LIST reply longer than kMaxIo or not a multiple of 4 is refused.
	rdmaswap::proto::Header h;
	h.op = rdmaswap::proto::Op::List;
	h.flags = rdmaswap::proto::kFlagResponse;
	std::array<std::byte, rdmaswap::proto::kHeaderSize> raw;
	rdmaswap::proto::Header back;
	for (uint32_t len : {0u, 6u, rdmaswap::proto::kMaxIo + 4}) {
		h.body_len = len;
		rdmaswap::proto::encode_header(h, raw);
		CHECK_FALSE(rdmaswap::proto::decode_header(raw, back).ok);
	}
	h.body_len = 8;
	rdmaswap::proto::encode_header(h, raw);
	CHECK(rdmaswap::proto::decode_header(raw, back).ok);
}

TEST_CASE("protocol: HELLO replaces round-trips; a replacement outside a session is refused",
	  "[protocol]")
{
	using namespace rdmaswap::proto;
	HelloRequest m;
	m.session_id = 5;
	m.token = 6;
	m.replaces = 0xabcdef0123456789ull;
	std::array<std::byte, kHelloRequestSize> b;
	encode(m, b);
	HelloRequest d;
	REQUIRE(decode(std::span<const std::byte>(b), d).ok);
	CHECK(d.replaces == m.replaces);
	m.session_id = 0;
	m.token = 0;
	encode(m, b);
	CHECK_FALSE(decode(std::span<const std::byte>(b), d).ok);
	HelloReply r;
	r.session_id = 1;
	r.token = 2;
	r.slab_size = 65536;
	r.max_io = 4096;
	r.challenge[0] = std::byte{1};
	r.conn_id = 0; // a server must name the connection
	std::array<std::byte, kHelloReplySize> rb;
	encode(r, rb);
	HelloReply rd;
	CHECK_FALSE(decode(std::span<const std::byte>(rb), rd).ok);
}

TEST_CASE("protocol: give-back messages round-trip and reject bad fields", "[protocol][giveback]")
{
	using namespace rdmaswap::proto;
	CHECK(std::string(op_name(Op::GiveBack)) == "GIVEBACK");
	CHECK(std::string(op_name(Op::Wanted)) == "WANTED");
	CHECK(std::string(op_name(Op::GiveBackStatus)) == "GIVEBACK_STATUS");
	CHECK(uint8_t(Op::GiveBack) == 12);
	CHECK(uint8_t(Op::Wanted) == 13);
	CHECK(uint8_t(Op::GiveBackStatus) == 14);
	CHECK(std::string(op_name(Op::Lend)) == "LEND");
	CHECK(uint8_t(Op::Lend) == 15);
	CHECK(request_body_size(Op::Lend) == long(kGiveBackRequestSize));
	CHECK(reply_body_size(Op::Lend) == long(kGiveBackReplySize));

	std::array<std::byte, kGiveBackRequestSize> rq;
	encode(GiveBackRequest{0x0102030405060708ull}, rq);
	CHECK(uint8_t(rq[0]) == 0x08);
	GiveBackRequest req;
	REQUIRE(decode(rq, req).ok);
	CHECK(req.bytes == 0x0102030405060708ull);
	encode(GiveBackRequest{0}, rq);
	CHECK_FALSE(decode(rq, req).ok); // nothing to give back
	CHECK_FALSE(decode(std::span(rq).first(7), req).ok);

	GiveBackReply r{3, 2, 10, 4, 16, 0};
	std::array<std::byte, kGiveBackReplySize> rp;
	encode(r, rp);
	GiveBackReply back;
	REQUIRE(decode(rp, back).ok);
	CHECK(back.withdrawn_now == 3);
	CHECK(back.wanted_now == 2);
	CHECK(back.slabs_withdrawn == 10);
	CHECK(back.slabs_wanted == 4);
	CHECK(back.slabs_total == 16);
	// A LEND reply: more re-offered now than is still withdrawn.
	encode(GiveBackReply{12, 3, 2, 0, 16, 0}, rp);
	CHECK(decode(rp, back).ok);
	for (GiveBackReply bad : {GiveBackReply{0, 0, 10, 7, 16, 0}, GiveBackReply{17, 0, 10, 0, 16, 0},
				  GiveBackReply{0, 17, 10, 4, 16, 0}, GiveBackReply{0, 0, 0, 0, 16, 1}}) {
		encode(bad, rp);
		CHECK_FALSE(decode(rp, back).ok);
	}
	CHECK_FALSE(decode(std::span(rp).first(20), back).ok);

	// Request headers carry exactly their fixed body; WANTED replies are LIST-shaped.
	Header h;
	std::array<std::byte, kHeaderSize> raw;
	Header out;
	h.op = Op::GiveBack;
	h.body_len = 8;
	encode_header(h, raw);
	CHECK(decode_header(raw, out).ok);
	h.body_len = 0;
	encode_header(h, raw);
	CHECK_FALSE(decode_header(raw, out).ok);
	h.op = Op::Wanted;
	h.flags = kFlagResponse;
	for (uint32_t len : {4u, 12u}) {
		h.body_len = len;
		encode_header(h, raw);
		CHECK(decode_header(raw, out).ok);
	}
	for (uint32_t len : {0u, 6u, kMaxIo + 4}) {
		h.body_len = len;
		encode_header(h, raw);
		CHECK_FALSE(decode_header(raw, out).ok);
	}
	h.op = Op::GiveBackStatus;
	h.body_len = kGiveBackReplySize;
	encode_header(h, raw);
	CHECK(decode_header(raw, out).ok);
}
