// SPDX-License-Identifier: MIT
// The RDMA fence's parts that need no RDMA device (issue 25; docs/architecture.md "A failed
// write's outcome"): the connect request's versions and MAC, the accept's QP number, and the
// session's list of unfenced QPs. The fence itself: tests/rdma (in the VM) and the VM's
// fence-rdma run (tests/vm/rdmafence.cpp).
#include <catch2/catch.hpp>

#include <array>
#include <cerrno>
#include <cstring>

#include "common/net/verbs.h"
#include "common/transport/rdma/client.h"
#include "common/wire/rdma_connect.h"

using namespace rdmaswap;
using namespace rdmaswap::rdma;

namespace {
Mac key_of(uint8_t b)
{
	Mac k;
	k.fill(std::byte{b});
	return k;
}
} // namespace

TEST_CASE("Connect data: version 2 and 3 are taken, anything else refused", "[rdma-fence]")
{
	ConnectData v3;
	v3.session_id = 7;
	v3.token = 8;
	v3.cm_nonce = 9;
	v3.replaces[0] = 0x1234;
	v3.replaces[1] = 0x56;
	ConnectData out;
	REQUIRE(parse_connect_data(&v3, sizeof v3, out) == 0);
	CHECK(out.version == 3);
	CHECK(out.session_id == 7);
	CHECK(out.replaces[0] == 0x1234);
	CHECK(out.replaces[1] == 0x56);
	// Version 3 cut short: refused (it would name fewer QPs than it says).
	CHECK(parse_connect_data(&v3, kConnectDataV2Size, out) == EPROTO);

	// Version 2, exact (iWARP) or padded by IB's 56 bytes with whatever: names nothing.
	ConnectData v2 = v3;
	v2.version = 2;
	REQUIRE(parse_connect_data(&v2, kConnectDataV2Size, out) == 0);
	CHECK(out.version == 2);
	CHECK(out.replaces[0] == 0);
	REQUIRE(parse_connect_data(&v2, sizeof v2, out) == 0);
	CHECK(out.replaces[0] == 0);
	CHECK(out.replaces[1] == 0);
	CHECK(out.token == 8);

	CHECK(parse_connect_data(&v2, kConnectDataV2Size - 1, out) == EPROTO);
	CHECK(parse_connect_data(nullptr, 0, out) == EPROTO);
	ConnectData bad = v3;
	bad.magic ^= 1;
	CHECK(parse_connect_data(&bad, sizeof bad, out) == EPROTO);
	bad = v3;
	bad.version = 1;
	CHECK(parse_connect_data(&bad, sizeof bad, out) == EPROTO);
	bad.version = 4;
	CHECK(parse_connect_data(&bad, sizeof bad, out) == EPROTO);
}

TEST_CASE("Connect MAC: version 2 is attach_mac, version 3 covers the QPs named", "[rdma-fence]")
{
	const Mac key = key_of(0x42);
	ConnectData cd;
	cd.session_id = 1;
	cd.token = 2;
	cd.cm_nonce = 3;
	cd.version = 2;
	CHECK(connect_mac(key, cd) == attach_mac(key, 1, 2, 3));
	cd.version = 3;
	const auto m3 = connect_mac(key, cd);
	CHECK(m3 != attach_mac(key, 1, 2, 3));
	cd.replaces[1] = 77;
	const auto named = connect_mac(key, cd);
	CHECK(named != m3); // a QP named by someone without the key is refused
	CHECK(connect_mac(key, cd) == named);
	CHECK(connect_mac(key_of(0x43), cd) != named);
	cd.cm_nonce = 4;
	CHECK(connect_mac(key, cd) != named);
}

TEST_CASE("Accept data: the memserver's QP number, or nothing from an older one", "[rdma-fence]")
{
	AcceptData a;
	a.qp_num = 0x123456;
	AcceptData out;
	REQUIRE(parse_accept_data(&a, sizeof a, out));
	CHECK(out.qp_num == 0x123456);
	AcceptData none;
	CHECK_FALSE(parse_accept_data(nullptr, 0, none));
	CHECK_FALSE(parse_accept_data(&a, sizeof a - 1, none));
	std::array<std::byte, 196> zeros{}; // what IB delivers when the accept carried nothing
	CHECK_FALSE(parse_accept_data(zeros.data(), zeros.size(), none));
	CHECK(none.qp_num == 0);
	AcceptData old = a;
	old.version = 2;
	CHECK_FALSE(parse_accept_data(&old, sizeof old, none));
}

TEST_CASE("RdmaSession: unfenced QPs are named own first, at most kMaxReplaces, until fenced",
	  "[rdma-fence]")
{
	RdmaSession s;
	for (int i = 0; i < 3; i++)
		s.add_path();
	CHECK(s.unfenced_count() == 0);
	std::array<uint32_t, kMaxReplaces> names{};
	CHECK(s.to_name(0, names) == 0);
	CHECK(s.to_name(99, names) == 0); // not unfenced: not named (its number may be reused)

	s.unfenced(10);
	s.unfenced(20);
	s.unfenced(20); // once
	s.unfenced(30);
	CHECK(s.unfenced_count() == 3);
	REQUIRE(s.to_name(30, names) == 2);
	CHECK(names[0] == 30); // the path's own first
	CHECK(names[1] == 10);
	REQUIRE(s.to_name(0, names) == 2);
	CHECK(names[0] == 10);
	CHECK(names[1] == 20);

	const uint32_t done[] = {30, 10};
	s.fenced(done);
	CHECK(s.unfenced_count() == 1);
	REQUIRE(s.to_name(30, names) == 1);
	CHECK(names[0] == 20);
	s.fenced(done); // again (another path named them too): nothing changes
	CHECK(s.unfenced_count() == 1);
	const uint32_t last[] = {20};
	s.fenced(last);
	CHECK(s.unfenced_count() == 0);
	CHECK_FALSE(s.poisoned());
}

TEST_CASE("RdmaSession: more unfenced QPs than paths poisons it (no write goes out again)",
	  "[rdma-fence]")
{
	RdmaSession s;
	s.add_path();
	s.unfenced(1);
	CHECK_FALSE(s.poisoned());
	s.unfenced(2); // cannot happen (one per path): but if it did, nothing is forgotten
	CHECK(s.poisoned());
	const uint32_t both[] = {1, 2};
	s.fenced(both);
	CHECK(s.unfenced_count() > 0);
}
