// SPDX-License-Identifier: MIT
// Unit tests for reattach: the protocol messages of ops 8-11, the memserver's volume bindings
// and leases (SessionTable, SlabPool tags), and the choice of trusted replicas after a restart
// (plan_reattach), which must never pick a replica that may be stale.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/volume/reattach.h"
#include "common/wire/protocol.h"
#include "memserver/sessions.h"
#include "memserver/slab_pool.h"

using namespace rdmaswap;

namespace {

proto::Header make_header(proto::Op op, bool response, uint32_t body_len)
{
	proto::Header h;
	h.op = op;
	h.flags = response ? proto::kFlagResponse : 0;
	h.body_len = body_len;
	h.request_id = 1;
	return h;
}

bool header_ok(const proto::Header &h)
{
	std::array<std::byte, proto::kHeaderSize> b;
	proto::encode_header(h, b);
	proto::Header out;
	return proto::decode_header(b, out).ok;
}

ReattachPlan plan(std::vector<FoundSlab> slabs, std::vector<FoundFloor> floors = {},
		  uint64_t nchunks = 16, unsigned replicas = 2, unsigned missing = 0)
{
	ReattachInput in;
	in.nchunks = nchunks;
	in.replicas = replicas;
	in.missing = missing;
	in.slabs = slabs;
	in.floors = floors;
	return plan_reattach(in);
}

FoundSlab slab(uint16_t server, uint32_t id, uint64_t chunk, uint64_t epoch)
{
	return FoundSlab{server, id, 0, 0, chunk, epoch};
}

} // namespace

TEST_CASE("reattach: op numbers, body sizes and header checks of ops 8-11", "[reattach][protocol]")
{
	using proto::Op;
	CHECK(uint8_t(Op::Bind) == 8);
	CHECK(uint8_t(Op::AllocTagged) == 9);
	CHECK(uint8_t(Op::SetTag) == 10);
	CHECK(uint8_t(Op::VolumeList) == 11);
	CHECK(proto::request_body_size(Op::Bind) == 168); // name, lease, reserved, pubkey, proof
	CHECK(proto::request_body_size(Op::AllocTagged) == 16);
	CHECK(proto::request_body_size(Op::SetTag) == 24);
	CHECK(proto::request_body_size(Op::VolumeList) == 16);
	CHECK(proto::reply_body_size(Op::Bind) == 16);
	CHECK(proto::reply_body_size(Op::AllocTagged) == 32);
	CHECK(size_t(proto::request_body_size(Op::Bind)) <= proto::kMaxFixedBody);
	CHECK(std::string(proto::op_name(Op::VolumeList)) == "VOLUME_LIST");
	CHECK(header_ok(make_header(Op::Bind, false, 168)));
	CHECK_FALSE(header_ok(make_header(Op::Bind, false, 167)));
	CHECK_FALSE(header_ok(make_header(Op::Bind, false, 72))); // the BIND before volume keys
	CHECK(header_ok(make_header(Op::VolumeList, true, 4 + 32)));
	CHECK(header_ok(make_header(Op::VolumeList, true, 4 + 160)));
	CHECK_FALSE(header_ok(make_header(Op::VolumeList, true, 3)));
	CHECK_FALSE(header_ok(make_header(Op::VolumeList, true, proto::kMaxIo + 4)));
	CHECK_FALSE(header_ok(make_header(Op::SetTag, true, 4)));
}

TEST_CASE("reattach: volume names", "[reattach][protocol]")
{
	CHECK(proto::valid_volume_name("a"));
	CHECK(proto::valid_volume_name(std::string(64, 'x')));
	CHECK(proto::valid_volume_name("host-1/68719476736-0badf00d"));
	CHECK_FALSE(proto::valid_volume_name(""));
	CHECK_FALSE(proto::valid_volume_name(std::string(65, 'x')));
	CHECK_FALSE(proto::valid_volume_name("has space"));
	CHECK_FALSE(proto::valid_volume_name("tab\there"));
	CHECK_FALSE(proto::valid_volume_name("\x7f"));
	CHECK_FALSE(proto::valid_volume_name("caf\xc3\xa9"));

	const std::vector<Endpoint> a{{"10.0.0.2", 7471}, {"10.0.0.1", 7471}};
	const std::vector<Endpoint> b{{"10.0.0.1", 7471}, {"10.0.0.2", 7471}};
	const std::vector<Endpoint> c{{"10.0.0.1", 7471}, {"10.0.0.3", 7471}};
	const std::string n = default_volume_name("node1", 1 << 30, a);
	CHECK(proto::valid_volume_name(n));
	CHECK(n.rfind("node1-1073741824-", 0) == 0);
	CHECK(n == default_volume_name("node1", 1 << 30, b)); // order of server= does not matter
	CHECK(n != default_volume_name("node1", 1 << 30, c));
	CHECK(n != default_volume_name("node1", 2 << 20, a));
	CHECK(n != default_volume_name("node2", 1 << 30, a));
	const std::string longhost = default_volume_name(std::string(200, 'h') + " x", ~0ull, c);
	CHECK(proto::valid_volume_name(longhost));
	CHECK(proto::valid_volume_name(default_volume_name("", 4096, c)));
}

TEST_CASE("reattach: message round trips and rejections", "[reattach][protocol]")
{
	proto::BindRequest br;
	std::memcpy(br.name.data(), "vol-1", 5);
	br.lease_s = 60;
	for (size_t i = 0; i < br.pubkey.size(); i++)
		br.pubkey[i] = std::byte(0x40 + i);
	for (size_t i = 0; i < br.proof.size(); i++)
		br.proof[i] = std::byte(0x80 + i);
	std::array<std::byte, proto::kBindRequestSize> bb;
	proto::encode(br, bb);
	CHECK(bb[64] == std::byte{60});     // lease_s after the name
	CHECK(bb[72] == std::byte{0x40});   // the public key after lease and reserved
	CHECK(bb[104] == std::byte{0x80});  // then the proof, to the end
	CHECK(bb[167] == std::byte{0x80 + 63});
	proto::BindRequest br2;
	REQUIRE(proto::decode(bb, br2).ok);
	CHECK(std::string(br2.name.data()) == "vol-1");
	CHECK(br2.lease_s == 60);
	CHECK(br2.pubkey == br.pubkey);
	CHECK(br2.proof == br.proof);
	// Bytes after the NUL must be NUL; an empty name or a space is refused.
	auto bad = bb;
	bad[10] = std::byte('z');
	CHECK_FALSE(proto::decode(bad, br2).ok);
	bad = bb;
	bad[0] = std::byte(0);
	CHECK_FALSE(proto::decode(bad, br2).ok);
	bad = bb;
	bad[2] = std::byte(' ');
	CHECK_FALSE(proto::decode(bad, br2).ok);
	bad = bb;
	bad[70] = std::byte(1); // reserved
	CHECK_FALSE(proto::decode(bad, br2).ok);

	proto::SetTagRequest st{proto::kNoSlab, 0, 1234, 7};
	std::array<std::byte, proto::kSetTagRequestSize> sb;
	proto::encode(st, sb);
	proto::SetTagRequest st2;
	REQUIRE(proto::decode(sb, st2).ok);
	CHECK(st2.slab_id == proto::kNoSlab);
	CHECK(st2.chunk == 1234);
	CHECK(st2.epoch == 7);

	proto::VolumeListRequest vl{proto::ListWhat::Floors, 0, 99};
	std::array<std::byte, proto::kVolumeListRequestSize> vb;
	proto::encode(vl, vb);
	proto::VolumeListRequest vl2;
	REQUIRE(proto::decode(vb, vl2).ok);
	CHECK(vl2.what == proto::ListWhat::Floors);
	CHECK(vl2.start == 99);
	vb[0] = std::byte(3);
	CHECK_FALSE(proto::decode(vb, vl2).ok);

	std::vector<proto::VolumeEntry> ve{{1, 2, 3, 4, 5}, {proto::kNoSlab, 0, 0, 9, 8}};
	std::vector<std::byte> out(4 + ve.size() * proto::kVolumeEntrySize);
	proto::encode_entries(ve, out);
	std::vector<proto::VolumeEntry> back(4);
	REQUIRE(proto::decode_entries(out, back) == 2);
	CHECK(back[0].addr == 3);
	CHECK(back[1].slab_id == proto::kNoSlab);
	CHECK(back[1].epoch == 8);
	std::vector<proto::VolumeEntry> small(1);
	CHECK(proto::decode_entries(out, small) == -1); // more entries than room
	out.pop_back();
	CHECK(proto::decode_entries(out, back) == -1); // truncated

	proto::SessionEntry se;
	se.session = 42;
	se.flags = proto::kSessionDetached | proto::kSessionBound;
	se.lease_left_ms = 1500;
	std::memcpy(se.volume.data(), "v", 1);
	std::vector<std::byte> so(4 + proto::kSessionEntrySize);
	proto::encode_entries(std::span<const proto::SessionEntry>(&se, 1), so);
	std::vector<proto::SessionEntry> sback(2);
	REQUIRE(proto::decode_entries(so, sback) == 1);
	CHECK(sback[0].lease_left_ms == 1500);
	CHECK(std::string(sback[0].volume.data()) == "v");
	so[4 + 12] = std::byte(0x80); // unknown flag
	CHECK(proto::decode_entries(so, sback) == -1);
}

TEST_CASE("reattach: a detached session is taken over by a new one of the same volume",
	  "[reattach][sessions]")
{
	SessionTable t;
	const Mac key{};
	const auto a = t.create(false, key);
	t.set_peer(a.id, "peer-a");
	REQUIRE(t.bind(a.id, "k1/vol", "vol", 30).err == 0);
	REQUIRE(t.set_floor(a.id, 5, 3) == 0);

	// A second live session of the same volume and key: refused, never two owners.
	const auto b = t.create(false, key);
	const auto busy = t.bind(b.id, "k1/vol", "vol", 30);
	CHECK(busy.err == EBUSY);
	CHECK(busy.other_peer == "peer-a");
	// Another key's scope is another volume.
	const auto other = t.create(false, key);
	CHECK(t.bind(other.id, "k2/vol", "vol", 30).err == 0);
	CHECK(t.bind(other.id, "k2/other", "other", 30).err == EINVAL); // bound already

	// The last connection of `a` goes: detached, kept.
	CHECK(t.leave(a.id) == SessionTable::Left::Detached);
	CHECK(t.detached(a.id));
	CHECK(t.count() == 3);
	CHECK(t.expire(SessionTable::Clock::now()).empty()); // lease not over

	const auto r = t.bind(b.id, "k1/vol", "vol", 30);
	CHECK(r.err == 0);
	CHECK(r.took_over == a.id);
	CHECK_FALSE(t.detached(a.id)); // gone: its slabs are b's now
	CHECK_FALSE(t.join(a.id, a.token));
	const auto f = t.floors(b.id, 0, 10);
	REQUIRE(f.size() == 1);
	CHECK(f[0] == std::pair<uint64_t, uint64_t>(5, 3));
}

TEST_CASE("reattach: leases expire; lease 0 and unbound sessions end at once; a client can "
	  "rejoin its detached session", "[reattach][sessions]")
{
	SessionTable t;
	const Mac key{};
	const auto a = t.create(false, key);
	REQUIRE(t.bind(a.id, "k/a", "a", 2).err == 0);
	const auto z = t.create(false, key);
	REQUIRE(t.bind(z.id, "k/z", "z", 0).err == 0);
	const auto u = t.create(false, key);
	CHECK(t.leave(a.id) == SessionTable::Left::Detached);
	CHECK(t.leave(z.id) == SessionTable::Left::Ended);
	CHECK(t.leave(u.id) == SessionTable::Left::Ended);
	CHECK(t.detached(a.id));
	CHECK_FALSE(t.detached(z.id));
	CHECK(t.count() == 1);
	const auto rep = t.report(SessionTable::Clock::now());
	REQUIRE(rep.size() == 1);
	CHECK(rep[0].detached);
	CHECK(rep[0].lease_left.count() > 1000);
	CHECK(rep[0].lease_left.count() <= 2000);

	// Its client comes back with the token before the lease ends: live again.
	CHECK(t.join(a.id, a.token));
	CHECK_FALSE(t.detached(a.id));
	CHECK(t.expire(SessionTable::Clock::now() + std::chrono::seconds(10)).empty());
	CHECK(t.leave(a.id) == SessionTable::Left::Detached);
	CHECK(t.expire(SessionTable::Clock::now() + std::chrono::milliseconds(1900)).empty());
	const auto gone = t.expire(SessionTable::Clock::now() + std::chrono::seconds(3));
	REQUIRE(gone.size() == 1);
	CHECK(gone[0].id == a.id);
	CHECK(gone[0].name == "a");
	CHECK(t.count() == 0);
}

TEST_CASE("reattach: slab tags survive a reassign and are cleared by release", "[reattach][slab_pool]")
{
	SlabPool pool(8 * 65536, 65536, false);
	const auto s1 = pool.allocate(1);
	const auto s2 = pool.allocate(1);
	const auto s3 = pool.allocate(2);
	REQUIRE((s1 && s2 && s3));
	std::memset(pool.slab_base(*s1), 0xab, 65536);
	CHECK(pool.set_tag(*s1, 1, {7, 3}));
	CHECK_FALSE(pool.set_tag(*s3, 1, {7, 3})); // not ours
	CHECK(pool.reassign(1, 9) == 2);
	CHECK(pool.owns(*s1, 9));
	CHECK(pool.owns(*s3, 2));
	CHECK(pool.tag(*s1).chunk == 7);
	CHECK(pool.tag(*s1).epoch == 3);
	CHECK(pool.slab_base(*s1)[100] == std::byte(0xab)); // content kept
	CHECK(pool.release(*s1, 9));
	CHECK(pool.tag(*s1).epoch == 0);
	REQUIRE(pool.settle(std::chrono::steady_clock::now() + std::chrono::seconds(10))); // the scrubber zeroes it
	CHECK(pool.slab_base(*s1)[100] == std::byte(0));
}

TEST_CASE("reattach: only the newest replicas of a chunk are trusted", "[reattach][plan]")
{
	// Chunk 0: replicas on servers 0 and 2 at epoch 3, a stale one (missed writes) on 1.
	// Chunk 1: two current replicas. Chunk 2: a half-done repair copy (epoch 0) and one good.
	const auto p = plan({slab(0, 10, 0, 3), slab(1, 11, 0, 2), slab(2, 12, 0, 3),
			     slab(0, 20, 1, 1), slab(1, 21, 1, 1), slab(2, 30, 2, 0), slab(1, 31, 2, 5)});
	REQUIRE(p.chunks.size() == 3);
	CHECK(p.chunks[0].chunk == 0);
	CHECK(p.chunks[0].epoch == 3);
	CHECK(p.chunks[0].use == std::vector<size_t>{0, 2});
	CHECK(p.chunks[1].use == std::vector<size_t>{3, 4});
	CHECK(p.chunks[2].use == std::vector<size_t>{6});
	CHECK(p.discard == std::vector<size_t>{1, 5});
	CHECK(p.stale == 1);
	CHECK(p.incomplete == 1);
	CHECK(p.lost.empty());
	CHECK_FALSE(p.all_empty_lost);
}

TEST_CASE("reattach: a chunk whose newest replica is gone is lost, not stale", "[reattach][plan]")
{
	// Chunk 4's newest replica (epoch 6) was on a donor that is gone; only the stale one
	// (epoch 5) is left, but a third donor recorded the floor 6: EIO, never the stale bytes.
	// Chunk 5 has a floor and nothing at all: lost too. Chunk 6's floor is satisfied.
	const auto p = plan({slab(1, 40, 4, 5), slab(0, 60, 6, 2), slab(1, 61, 6, 2)},
			    {{4, 6}, {5, 1}, {6, 2}, {6, 1}});
	CHECK(p.lost == std::vector<uint64_t>{4, 5});
	REQUIRE(p.chunks.size() == 1);
	CHECK(p.chunks[0].chunk == 6);
	CHECK(p.discard == std::vector<size_t>{0});
}

TEST_CASE("reattach: duplicates, extra replicas and chunks beyond the size are given back",
	  "[reattach][plan]")
{
	ReattachInput in;
	std::vector<FoundSlab> s{slab(0, 1, 3, 2), slab(0, 2, 3, 2), slab(1, 3, 3, 2), slab(2, 4, 3, 2),
				 slab(3, 5, 3, 2), slab(0, 6, 99, 1)};
	in.nchunks = 8;
	in.replicas = 2;
	in.max_replicas = 3;
	in.slabs = s;
	const auto p = plan_reattach(in);
	REQUIRE(p.chunks.size() == 1);
	CHECK(p.chunks[0].use == std::vector<size_t>{0, 2, 3}); // one per server, at most 3
	CHECK(p.discard == std::vector<size_t>{1, 4, 5});
	CHECK(p.out_of_range == 1);
}

TEST_CASE("reattach: missing donors make empty chunks lost", "[reattach][plan]")
{
	// replicas=1 and one donor did not hand the volume back: any chunk without a replica
	// may have lived there.
	CHECK(plan({slab(0, 1, 0, 1)}, {}, 4, 1, 1).all_empty_lost);
	// replicas=2: one missing donor cannot have held every copy of a chunk...
	CHECK_FALSE(plan({slab(0, 1, 0, 1)}, {}, 4, 2, 1).all_empty_lost);
	// ...two can.
	CHECK(plan({slab(0, 1, 0, 1)}, {}, 4, 2, 2).all_empty_lost);
	CHECK_FALSE(plan({}, {}, 4, 1, 0).all_empty_lost);
}
