// SPDX-License-Identifier: MIT
// Unit tests for common/volume against in-memory fake memservers (fake_transport.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <random>
#include <set>
#include <sys/wait.h>
#include <unistd.h>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/volume.h"
#include "fake_transport.h"
#include "volume_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::test;


TEST_CASE("volume: never-written ranges read zeros without any data path operation",
	  "[volume]")
{
	quiet();
	const uint64_t size = 16 * SS + 1000; // last slab partial
	auto b = backend("m0", 64);
	auto vol = make_volume({b}, opts(size));
	CHECK(vol->size() == size);
	CHECK(vol->slab_size() == SS);
	CHECK(vol->stats().slabs == 17);
	CHECK(vol->stats().slabs_live == 0);

	Bytes buf(size, std::byte{0xee});
	REQUIRE(vol->pread(buf.data(), uint32_t(size), 0) == 0);
	CHECK(is_zero(buf.data(), size));
	const std::pair<uint64_t, uint64_t> ranges[] = {
		{0, 1}, {SS - 1, 2}, {3 * SS + 5, 5 * SS}, {size - 1, 1}, {size - 1000, 1000}, {0, 0},
		{size, 0}};
	for (auto [off, len] : ranges) {
		std::fill(buf.begin(), buf.end(), std::byte{0xee});
		REQUIRE(vol->pread(buf.data(), uint32_t(len), off) == 0);
		CHECK(is_zero(buf.data(), len));
		CHECK(buf[len] == std::byte{0xee}); // nothing beyond count touched
	}
	CHECK(b->posted_reads == 0);
	CHECK(b->completes == 0);
	CHECK(b->allocs == 0);

	// One live slab: reads elsewhere still need no data path, reads of it do.
	const Bytes data = pattern(100, 1);
	REQUIRE(vol->pwrite(data.data(), 100, 5 * SS + 10) == 0);
	const uint64_t reads_before = b->posted_reads;
	REQUIRE(vol->pread(buf.data(), uint32_t(5 * SS), 0) == 0);
	CHECK(is_zero(buf.data(), 5 * SS));
	REQUIRE(vol->pread(buf.data(), uint32_t(10 * SS), 6 * SS) == 0);
	CHECK(is_zero(buf.data(), 10 * SS));
	CHECK(b->posted_reads == reads_before);
	REQUIRE(vol->pread(buf.data(), 200, 5 * SS) == 0);
	CHECK(b->posted_reads > reads_before);
	CHECK(is_zero(buf.data(), 10));
	CHECK(std::memcmp(buf.data() + 10, data.data(), 100) == 0);
	CHECK(is_zero(buf.data() + 110, 90));
	check_no_violations({b});
}

TEST_CASE("volume: random read-after-write matches a shadow copy", "[volume]")
{
	quiet();
	const size_t buffer = GENERATE(size_t(4096), size_t(64 * KiB), size_t(256 * KiB),
				       size_t(1 * MiB));
	INFO("channel buffer " << buffer);
	const uint64_t size = 72 * SS + 4321; // 4.5 MiB + a partial slab
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("m0", 64), backend("m1", 64)};
	auto vol = make_volume(bs, opts(size, 2, buffer));
	Bytes shadow(size, std::byte{0});
	std::mt19937_64 rng(buffer * 31 + 7);

	auto pick_len = [&]() -> uint64_t {
		switch (rng() % 6) {
		case 0: return 1 + rng() % 16;
		case 1: return 1 + rng() % 8192;
		case 2: return 4096 * (1 + rng() % 32);
		case 3: return 1 + rng() % (SS * 3);
		case 4: return 1 + rng() % (3 * MiB);
		default: return 3 * MiB; // bigger than any channel buffer and than 8 slabs
		}
	};
	auto pick_off = [&](uint64_t len) -> uint64_t {
		const uint64_t max = size - len;
		switch (rng() % 4) {
		case 0: { // at or next to a slab boundary
			uint64_t o = (rng() % (size / SS + 1)) * SS + (rng() % 3) - 1;
			return std::min(o > size ? 0 : o, max);
		}
		case 1: return max; // touching the end
		default: return rng() % (max + 1);
		}
	};
	for (int i = 0; i < 250; i++) {
		const uint64_t len = pick_len();
		const uint64_t off = pick_off(len);
		INFO("op " << i << " off " << off << " len " << len);
		if (rng() % 5 < 3) {
			REQUIRE(write_shadow(*vol, shadow, pattern(len, rng()), off) == 0);
		} else {
			CHECK(compare(*vol, shadow, off, len) == -1);
		}
	}
	CHECK(compare_all(*vol, shadow) == -1);
	// Every slab holding a non-zero byte is live, and only slabs that were written are.
	uint64_t nonzero_slabs = 0;
	for (uint64_t s = 0; s * SS < size; s++)
		if (!is_zero(shadow.data() + s * SS, std::min(SS, size - s * SS)))
			nonzero_slabs++;
	CHECK(vol->stats().slabs_live >= nonzero_slabs);
	CHECK(vol->stats().slabs_live == bs[0]->live_slabs() + bs[1]->live_slabs());
	// Both servers got slabs.
	CHECK(bs[0]->live_slabs() > 0);
	CHECK(bs[1]->live_slabs() > 0);
	check_no_violations(bs);
}

TEST_CASE("volume: slabs are allocated lazily, one per touched slab", "[volume]")
{
	quiet();
	const uint64_t size = 32 * SS + 777;
	auto b = backend("m0", 64);
	auto vol = make_volume({b}, opts(size));
	const Bytes one = pattern(1, 3);
	const Bytes straddle = pattern(512, 4);
	const Bytes whole = pattern(SS, 5);
	REQUIRE(vol->pwrite(one.data(), 1, 0) == 0);                    // slab 0
	REQUIRE(vol->pwrite(straddle.data(), 512, 5 * SS - 256) == 0);  // slabs 4, 5
	REQUIRE(vol->pwrite(whole.data(), uint32_t(SS), 9 * SS) == 0);  // slab 9
	REQUIRE(vol->pwrite(one.data(), 1, size - 1) == 0);             // slab 32 (partial)
	CHECK(b->allocs == 5);
	CHECK(b->live_slabs() == 5);
	CHECK(vol->stats().slabs_live == 5);
	CHECK(vol->stats().slabs == 33);

	// Rewrites and reads do not allocate.
	REQUIRE(vol->pwrite(whole.data(), uint32_t(SS), 9 * SS) == 0);
	REQUIRE(vol->pwrite(straddle.data(), 100, 4 * SS) == 0);
	Bytes buf(size);
	REQUIRE(vol->pread(buf.data(), uint32_t(size), 0) == 0);
	CHECK(b->allocs == 5);
	CHECK(vol->stats().slabs_live == 5);
	// A zero-length write allocates nothing.
	REQUIRE(vol->pwrite(one.data(), 0, 20 * SS) == 0);
	CHECK(b->allocs == 5);
	check_no_violations({b});
}

TEST_CASE("volume: trim gives whole slabs back, leaves partial slabs alone", "[volume]")
{
	quiet();
	const uint64_t size = 16 * SS + 3000;
	auto b = backend("m0", 64);
	auto vol = make_volume({b}, opts(size));
	Bytes shadow(size);
	REQUIRE(write_shadow(*vol, shadow, pattern(size, 9), 0) == 0);
	REQUIRE(b->allocs == 17);
	REQUIRE(vol->stats().slabs_live == 17);

	SECTION("exact whole slabs")
	{
		REQUIRE(vol->trim(uint32_t(4 * SS), 2 * SS) == 0);
		CHECK(b->frees == 4);
		CHECK(b->live_slabs() == 13);
		CHECK(vol->stats().slabs_live == 13);
		std::fill(shadow.begin() + 2 * SS, shadow.begin() + 6 * SS, std::byte{0});
		const uint64_t reads = b->posted_reads;
		Bytes buf(4 * SS, std::byte{0xee});
		REQUIRE(vol->pread(buf.data(), uint32_t(4 * SS), 2 * SS) == 0);
		CHECK(is_zero(buf.data(), buf.size()));
		CHECK(b->posted_reads == reads); // trimmed slabs need no round trip
		CHECK(compare_all(*vol, shadow) == -1);
		// Trimming again frees nothing more and calls no server.
		const uint64_t calls = b->free_calls;
		REQUIRE(vol->trim(uint32_t(4 * SS), 2 * SS) == 0);
		CHECK(b->free_calls == calls);
		CHECK(b->frees == 4);
		// A trimmed slab can be written again (fresh allocation).
		REQUIRE(write_shadow(*vol, shadow, pattern(1000, 10), 3 * SS + 5) == 0);
		CHECK(b->allocs == 18);
		CHECK(compare_all(*vol, shadow) == -1);
	}
	SECTION("unaligned range frees only the slabs wholly inside it")
	{
		REQUIRE(vol->trim(uint32_t(3 * SS - 200), 8 * SS + 100) == 0); // [8.x, 10.y] -> 9
		CHECK(b->frees == 1);
		std::fill(shadow.begin() + 9 * SS, shadow.begin() + 10 * SS, std::byte{0});
		CHECK(compare_all(*vol, shadow) == -1);
		CHECK(vol->stats().slabs_live == 16);
	}
	SECTION("partial slabs only: nothing changes")
	{
		REQUIRE(vol->trim(4900, 100) == 0);
		REQUIRE(vol->trim(uint32_t(SS), 3 * SS + 1) == 0); // straddles 3/4, no whole slab
		REQUIRE(vol->trim(uint32_t(SS - 1), 5 * SS) == 0);
		REQUIRE(vol->trim(0, 0) == 0);
		REQUIRE(vol->trim(0, 7 * SS) == 0);
		CHECK(b->frees == 0);
		CHECK(b->free_calls == 0);
		CHECK(vol->stats().slabs_live == 17);
		CHECK(compare_all(*vol, shadow) == -1);
	}
	SECTION("a range reaching the end frees the partial last slab")
	{
		REQUIRE(vol->trim(3000, 16 * SS) == 0);
		CHECK(b->frees == 1);
		std::fill(shadow.begin() + 16 * SS, shadow.end(), std::byte{0});
		CHECK(compare_all(*vol, shadow) == -1);
		// ... but not when it stops one byte short.
		REQUIRE(write_shadow(*vol, shadow, pattern(3000, 11), 16 * SS) == 0);
		REQUIRE(vol->trim(2999, 16 * SS) == 0);
		CHECK(b->frees == 1);
		CHECK(compare_all(*vol, shadow) == -1);
	}
	SECTION("whole volume")
	{
		REQUIRE(vol->trim(uint32_t(size), 0) == 0);
		CHECK(b->frees == 17);
		CHECK(b->live_slabs() == 0);
		CHECK(vol->stats().slabs_live == 0);
		Bytes zeros(size);
		CHECK(compare_all(*vol, zeros) == -1);
	}
	SECTION("a server that refuses the free still leaves the range reading zeros")
	{
		b->free_error = EIO;
		REQUIRE(vol->trim(uint32_t(SS), 0) == 0);
		std::fill(shadow.begin(), shadow.begin() + SS, std::byte{0});
		CHECK(compare_all(*vol, shadow) == -1);
		CHECK(vol->stats().slabs_live == 16);
	}
	check_no_violations({b});
}

TEST_CASE("volume: zero writes zeros to partial ranges and frees whole slabs", "[volume]")
{
	quiet();
	const uint64_t size = 8 * SS;
	auto b = backend("m0", 64);
	auto vol = make_volume({b}, opts(size));
	Bytes shadow(size);
	REQUIRE(write_shadow(*vol, shadow, pattern(6 * SS, 21), 0) == 0); // slabs 0..5 live
	REQUIRE(b->allocs == 6);

	auto zero_shadow = [&](uint64_t off, uint64_t len) {
		std::fill(shadow.begin() + off, shadow.begin() + off + len, std::byte{0});
	};
	SECTION("inside one slab")
	{
		REQUIRE(vol->zero(100, SS / 2, false) == 0);
		zero_shadow(SS / 2, 100);
		CHECK(compare_all(*vol, shadow) == -1);
		CHECK(b->frees == 0);
	}
	SECTION("across a slab boundary")
	{
		REQUIRE(vol->zero(100, 2 * SS - 50, false) == 0);
		zero_shadow(2 * SS - 50, 100);
		CHECK(compare_all(*vol, shadow) == -1);
		CHECK(b->frees == 0);
		CHECK(vol->stats().slabs_live == 6);
	}
	SECTION("partial head, whole slabs, partial tail")
	{
		REQUIRE(vol->zero(uint32_t(2 * SS + 200), SS + 1, false) == 0); // [1.x, 3.y]
		zero_shadow(SS + 1, 2 * SS + 200);
		CHECK(compare_all(*vol, shadow) == -1);
		CHECK(b->frees == 1); // slab 2
		CHECK(vol->stats().slabs_live == 5);
	}
	SECTION("whole slabs only")
	{
		REQUIRE(vol->zero(uint32_t(3 * SS), 3 * SS, false) == 0);
		zero_shadow(3 * SS, 3 * SS);
		CHECK(b->frees == 3);
		CHECK(compare_all(*vol, shadow) == -1);
	}
	SECTION("a partial range on a never-written slab allocates and writes nothing")
	{
		const uint64_t writes = b->posted_writes;
		REQUIRE(vol->zero(1000, 7 * SS + 5, false) == 0);
		REQUIRE(vol->zero(uint32_t(SS + 10), 5 * SS + 5, false) == 0); // 5 live, 6 empty
		zero_shadow(5 * SS + 5, SS + 10);
		CHECK(b->allocs == 6);
		CHECK(b->posted_writes > writes); // slab 6's part was written
		CHECK(compare_all(*vol, shadow) == -1);
	}
	SECTION("zero with count 0 and the whole volume")
	{
		REQUIRE(vol->zero(0, 3 * SS + 7, false) == 0);
		CHECK(compare_all(*vol, shadow) == -1);
		REQUIRE(vol->zero(uint32_t(size), 0, false) == 0);
		CHECK(b->frees == 6);
		CHECK(vol->stats().slabs_live == 0);
		CHECK(compare_all(*vol, Bytes(size)) == -1);
	}
	check_no_violations({b});
}

TEST_CASE("volume: fast zero refuses to write zeros and changes nothing", "[volume]")
{
	quiet();
	const uint64_t size = 8 * SS;
	auto b = backend("m0", 64);
	auto vol = make_volume({b}, opts(size));
	Bytes shadow(size);
	// Slab 0 partially written, slabs 1-2 fully written, 3.. empty.
	REQUIRE(write_shadow(*vol, shadow, pattern(SS / 2, 31), SS / 4) == 0);
	REQUIRE(write_shadow(*vol, shadow, pattern(2 * SS, 32), SS) == 0);
	REQUIRE(b->allocs == 3);
	const uint64_t writes = b->posted_writes;

	SECTION("partial range of a written slab")
	{
		CHECK(vol->zero(4096, 0, true) == ENOTSUP);
		CHECK(vol->zero(100, SS / 2, true) == ENOTSUP);
		CHECK(vol->zero(100, SS - 100, true) == ENOTSUP); // the unwritten bytes of it, too
	}
	SECTION("partial head on a written slab plus whole slabs: whole slabs are kept too")
	{
		// [SS/2, 3SS): partial head on slab 0 (written), slabs 1-2 whole.
		CHECK(vol->zero(uint32_t(3 * SS - SS / 2), SS / 2, true) == ENOTSUP);
	}
	SECTION("whole slabs plus a partial tail on a written slab")
	{
		// [0, 2SS+100): slabs 0-1 whole, partial tail on slab 2 (written).
		CHECK(vol->zero(uint32_t(2 * SS + 100), 0, true) == ENOTSUP);
	}
	// Nothing changed in any of the sections above.
	CHECK(b->posted_writes == writes);
	CHECK(b->frees == 0);
	CHECK(b->free_calls == 0);
	CHECK(vol->stats().slabs_live == 3);
	CHECK(compare_all(*vol, shadow) == -1);
	check_no_violations({b});
}

TEST_CASE("volume: fast zero succeeds when no zeros need writing", "[volume]")
{
	quiet();
	const uint64_t size = 8 * SS;
	auto b = backend("m0", 64);
	auto vol = make_volume({b}, opts(size));
	Bytes shadow(size);
	REQUIRE(write_shadow(*vol, shadow, pattern(2 * SS, 41), SS) == 0); // slabs 1, 2
	const uint64_t writes = b->posted_writes;

	// Never-written slabs: nothing to do.
	CHECK(vol->zero(100, 5 * SS + 7, true) == 0);
	CHECK(vol->zero(uint32_t(3 * SS), 4 * SS + 1, true) == 0);
	CHECK(vol->zero(uint32_t(SS), 5 * SS, true) == 0);
	CHECK(b->allocs == 2);
	CHECK(b->posted_writes == writes);
	CHECK(compare_all(*vol, shadow) == -1);

	// Whole written slabs with partial ends on empty slabs: freed, no writes.
	CHECK(vol->zero(uint32_t(3 * SS), SS / 2, true) == 0); // head slab 0 empty, 1-2 whole, tail slab 3 empty
	std::fill(shadow.begin() + SS, shadow.begin() + 3 * SS, std::byte{0});
	CHECK(b->frees == 2);
	CHECK(b->posted_writes == writes);
	CHECK(vol->stats().slabs_live == 0);
	CHECK(compare_all(*vol, shadow) == -1);
	check_no_violations({b});
}

TEST_CASE("volume: out-of-range requests return EINVAL", "[volume]")
{
	quiet();
	const uint64_t size = 4 * SS + 10;
	auto b = backend("m0", 64);
	auto vol = make_volume({b}, opts(size));
	Bytes buf(8 * SS, std::byte{0x11});
	const std::pair<uint64_t, uint32_t> bad[] = {
		{size, 1}, {size + 1, 0}, {size - 1, 2}, {0, uint32_t(size + 1)},
		{~uint64_t(0), 1}, {~uint64_t(0) - 10, 100}, {~uint64_t(0), 0},
		{uint64_t(1) << 63, 4096}, {3 * SS, uint32_t(2 * SS)},
	};
	for (auto [off, len] : bad) {
		INFO("off " << off << " len " << len);
		CHECK(vol->pread(buf.data(), len, off) == EINVAL);
		CHECK(vol->pwrite(buf.data(), len, off) == EINVAL);
		CHECK(vol->trim(len, off) == EINVAL);
		CHECK(vol->zero(len, off, false) == EINVAL);
		CHECK(vol->zero(len, off, true) == EINVAL);
	}
	CHECK(buf[0] == std::byte{0x11}); // the failed reads wrote nothing
	CHECK(b->allocs == 0);
	CHECK(b->posted_writes == 0);
	// The edges are fine.
	CHECK(vol->pread(buf.data(), 0, size) == 0);
	CHECK(vol->pwrite(buf.data(), 1, size - 1) == 0);
	CHECK(vol->pread(buf.data(), uint32_t(size), 0) == 0);
	CHECK(buf[size - 1] == std::byte{0x11});
	check_no_violations({b});
}

TEST_CASE("volume: failing data transfers are EIO, never zeros", "[volume]")
{
	quiet();
	const uint64_t size = 8 * SS;
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("m0", 64)};
	auto vol = make_volume(bs, opts(size));
	Bytes shadow(size);
	REQUIRE(write_shadow(*vol, shadow, pattern(4 * SS, 51), 0) == 0); // slabs 0..3
	auto &b = bs[0];
	Bytes buf(size);

	SECTION("complete() fails")
	{
		b->complete_error = EIO;
		CHECK(vol->pread(buf.data(), 100, 10) == EIO);
		CHECK(vol->pread(buf.data(), uint32_t(size), 0) == EIO); // live + empty slabs
		CHECK(vol->pread(buf.data(), uint32_t(SS + 8), 4 * SS - 8) == EIO);
		CHECK(vol->pwrite(buf.data(), 100, 10) == EIO);
		CHECK(vol->pwrite(buf.data(), uint32_t(3 * MiB / 8), 0) == EIO);
		// Zeroing a written partial range needs a transfer.
		CHECK(vol->zero(100, 10, false) == EIO);
		// Empty slabs still read zeros: no transfer is involved.
		std::fill(buf.begin(), buf.end(), std::byte{0x22});
		CHECK(vol->pread(buf.data(), uint32_t(4 * SS), 4 * SS) == 0);
		CHECK(is_zero(buf.data(), 4 * SS));
	}
	SECTION("post fails")
	{
		b->post_error = EIO;
		CHECK(vol->pread(buf.data(), 100, 10) == EIO);
		CHECK(vol->pread(buf.data(), uint32_t(size), 0) == EIO);
		CHECK(vol->pwrite(buf.data(), 100, 10) == EIO);
		CHECK(vol->pwrite(buf.data(), uint32_t(SS), 5 * SS) == EIO); // fresh slab
	}
	SECTION("the server refuses the transfer with EINVAL")
	{
		b->complete_error = EINVAL;
		CHECK(vol->pread(buf.data(), 100, 10) == EIO);
		CHECK(vol->pwrite(buf.data(), 100, 10) == EIO);
	}
	SECTION("allocation fails")
	{
		b->alloc_error = EIO;
		const Bytes d = pattern(10, 52);
		CHECK(vol->pwrite(d.data(), 10, 6 * SS) == EIO);
		CHECK(b->allocs == 4);
		CHECK(vol->stats().slabs_live == 4);
		b->alloc_error = 0;
		CHECK(compare_all(*vol, shadow) == -1); // slab 6 still reads zeros
	}
	// Once the failure clears, everything written earlier is intact.
	b->complete_error = 0;
	b->post_error = 0;
	b->alloc_error = 0;
	// (The fake applies nothing of a failed batch, so even the failed writes left no trace.)
	CHECK(compare_all(*vol, shadow) == -1);
	REQUIRE(write_shadow(*vol, shadow, pattern(size, 53), 0) == 0);
	CHECK(compare_all(*vol, shadow) == -1);
	check_no_violations(bs);
}

TEST_CASE("volume: a transfer refused with EACCES or ENOBUFS is reported as EIO", "[volume]")
{
	// volume.h: "a range on a server that lost our session, or any failed transfer, is EIO".
	quiet();
	auto b = backend("m0", 64);
	auto vol = make_volume({b}, opts(4 * SS));
	Bytes buf(SS);
	REQUIRE(vol->pwrite(buf.data(), 100, 0) == 0);
	for (int e : {EACCES, ENOBUFS, ETIMEDOUT}) {
		INFO("injected errno " << e);
		b->complete_error = e;
		CHECK(vol->pread(buf.data(), 100, 0) == EIO);
		CHECK(vol->pwrite(buf.data(), 100, 0) == EIO);
		b->complete_error = 0;
		b->post_error = e;
		CHECK(vol->pread(buf.data(), 100, 0) == EIO);
		CHECK(vol->pwrite(buf.data(), 100, 0) == EIO);
		b->post_error = 0;
	}
}

TEST_CASE("volume: slabs on a server that lost the session read EIO", "[volume]")
{
	quiet();
	const uint64_t nslabs = 12;
	const uint64_t size = nslabs * SS;
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("m0", 64), backend("m1", 64)};
	// Free counts kept live, so that placement spreads the slabs over both (with the
	// HELLO's counts alone, each slab is a coin flip: all 10 on one donor 1 run in 512).
	for (auto &b : bs)
		b->live_free = true;
	auto vol = make_volume(bs, opts(size));
	// Tag the first 8 bytes of slabs 0..9 with their index; 10, 11 stay empty.
	Bytes shadow(size);
	for (uint64_t s = 0; s < 10; s++) {
		Bytes d = pattern(SS, 60 + s);
		std::memcpy(d.data(), &s, 8);
		d[8] = std::byte{0xa5};
		REQUIRE(write_shadow(*vol, shadow, d, s * SS) == 0);
	}
	// Which slabs live on m0?
	std::set<uint64_t> on_m0;
	{
		std::lock_guard lock(bs[0]->mu);
		for (auto &[id, bytes] : bs[0]->slabs) {
			uint64_t s;
			std::memcpy(&s, bytes.data(), 8);
			REQUIRE(s < 10);
			REQUIRE(bytes[8] == std::byte{0xa5});
			CHECK(std::memcmp(bytes.data(), shadow.data() + s * SS, SS) == 0);
			on_m0.insert(s);
		}
	}
	REQUIRE(on_m0.size() > 0);
	REQUIRE(on_m0.size() < 10);
	CHECK(bs[1]->live_slabs() == 10 - on_m0.size());

	bs[0]->lose_session();
	Bytes buf(SS, std::byte{0x33});
	for (uint64_t s = 0; s < nslabs; s++) {
		INFO("slab " << s << (on_m0.count(s) ? " (on m0)" : ""));
		if (on_m0.count(s)) {
			CHECK(vol->pread(buf.data(), 64, s * SS + 100) == EIO);
			CHECK(vol->pwrite(buf.data(), 64, s * SS + 100) == EIO);
		} else {
			CHECK(compare(*vol, shadow, s * SS, SS) == -1);
		}
	}
	// A read spanning a healthy and a lost slab fails as a whole.
	const uint64_t lost = *on_m0.begin();
	for (uint64_t s = 0; s + 1 < 10; s++) {
		if (on_m0.count(s) == on_m0.count(s + 1))
			continue;
		INFO("reading across slabs " << s << " and " << s + 1);
		CHECK(vol->pread(buf.data(), uint32_t(SS), s * SS + SS / 2) == EIO);
	}

	// Trimming a lost slab forgets it: it reads zeros, and a new write lands on m1.
	REQUIRE(vol->trim(uint32_t(SS), lost * SS) == 0);
	std::fill(shadow.begin() + lost * SS, shadow.begin() + (lost + 1) * SS, std::byte{0});
	CHECK(compare(*vol, shadow, lost * SS, SS) == -1);
	const uint64_t m1_before = bs[1]->live_slabs();
	REQUIRE(write_shadow(*vol, shadow, pattern(500, 70), lost * SS + 7) == 0);
	CHECK(bs[1]->live_slabs() == m1_before + 1);
	CHECK(compare(*vol, shadow, lost * SS, SS) == -1);
	// New slabs also go to m1.
	REQUIRE(write_shadow(*vol, shadow, pattern(2 * SS, 71), 10 * SS) == 0);
	CHECK(compare(*vol, shadow, 10 * SS, 2 * SS) == -1);
	check_no_violations(bs);
}

TEST_CASE("volume: ENOSPC when the memservers run out of slabs", "[volume]")
{
	quiet();
	const uint64_t size = 8 * SS;
	SECTION("one server")
	{
		auto b = backend("m0", 4);
		auto vol = make_volume({b}, opts(size));
		Bytes shadow(size);
		for (uint64_t s = 0; s < 4; s++)
			REQUIRE(write_shadow(*vol, shadow, pattern(SS / 2, 80 + s), s * SS + 7) == 0);
		const Bytes d = pattern(100, 90);
		CHECK(vol->pwrite(d.data(), 100, 4 * SS + 1) == ENOSPC);
		CHECK(vol->pwrite(d.data(), 100, 8 * SS - 100) == ENOSPC);
		CHECK(vol->stats().slabs_live == 4);
		// Writes to live slabs still work; the failed slabs read zeros.
		REQUIRE(write_shadow(*vol, shadow, d, 3 * SS + 100) == 0);
		CHECK(compare_all(*vol, shadow) == -1);
		// Freeing a slab makes room.
		REQUIRE(vol->trim(uint32_t(SS), 0) == 0);
		std::fill(shadow.begin(), shadow.begin() + SS, std::byte{0});
		REQUIRE(write_shadow(*vol, shadow, d, 4 * SS + 1) == 0);
		CHECK(compare_all(*vol, shadow) == -1);
		check_no_violations({b});
	}
	SECTION("two servers fill up together")
	{
		std::vector<std::shared_ptr<FakeBackend>> bs{backend("m0", 2), backend("m1", 3)};
		auto vol = make_volume(bs, opts(size));
		Bytes shadow(size);
		for (uint64_t s = 0; s < 5; s++)
			REQUIRE(write_shadow(*vol, shadow, pattern(10, 100 + s), s * SS) == 0);
		CHECK(bs[0]->live_slabs() == 2);
		CHECK(bs[1]->live_slabs() == 3);
		const Bytes d = pattern(10, 110);
		CHECK(vol->pwrite(d.data(), 10, 6 * SS) == ENOSPC);
		CHECK(compare_all(*vol, shadow) == -1);
		check_no_violations(bs);
	}
}

TEST_CASE("volume: constructor validates servers and options", "[volume]")
{
	quiet();
	SECTION("servers with different slab sizes")
	{
		auto a = backend("m0", 8, 64 * KiB);
		auto c = backend("m1", 8, 128 * KiB);
		CHECK_THROWS_AS(make_volume({a, c}, opts(MiB)), std::runtime_error);
		CHECK_THROWS_AS(make_volume({c, a}, opts(MiB)), std::runtime_error);
		CHECK_NOTHROW(make_volume({a, backend("m2", 8, 64 * KiB)}, opts(MiB)));
	}
	SECTION("no servers")
	{
		CHECK_THROWS_AS(make_volume({}, opts(MiB)), std::runtime_error);
	}
	SECTION("bad options")
	{
		auto a = backend("m0", 8);
		CHECK_THROWS_AS(make_volume({a}, opts(0)), std::runtime_error);
		CHECK_THROWS_AS(make_volume({a}, opts(MiB, 0)), std::runtime_error);
		CHECK_THROWS_AS(make_volume({a}, opts(MiB, 2, 0)), std::runtime_error);
		CHECK_THROWS_AS(make_volume({a}, opts(MiB, 2, 5000)), std::runtime_error);
		CHECK_THROWS_AS(make_volume({a}, opts(MiB, 2, 2 * MiB)), std::runtime_error);
		auto small_io = backend("m1", 8, SS, 128 * KiB);
		CHECK_THROWS_AS(make_volume({small_io}, opts(MiB, 2, 256 * KiB)), std::runtime_error);
		CHECK_NOTHROW(make_volume({small_io}, opts(MiB, 2, 128 * KiB)));
	}
	SECTION("a data path that cannot be opened")
	{
		auto a = backend("m0", 8);
		auto c = backend("m1", 8);
		c->fail_open = true;
		CHECK_THROWS_AS(make_volume({a, c}, opts(MiB, 4)), std::runtime_error);
	}
}

TEST_CASE("volume: concurrent writers on disjoint regions", "[volume][concurrency]")
{
	quiet();
	constexpr int kThreads = 8;
	// Regions are not slab-aligned, so neighbouring threads share (and race to allocate)
	// the boundary slabs.
	const uint64_t region = 5 * SS + 3 * 4096 + 123;
	const uint64_t size = kThreads * region + 999;
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("m0", 64), backend("m1", 64)};
	const unsigned channels = GENERATE(1u, 3u, 8u);
	INFO("channels " << channels);
	auto vol = make_volume(bs, opts(size, channels, 64 * KiB));
	Bytes shadow(size);
	CHECK(hammer_regions(*vol, shadow, kThreads, region, 60, 10, 20000, 1000) == 0);
	CHECK(compare_all(*vol, shadow) == -1);
	// Exactly one allocation per live slab, even for the slabs two threads raced on.
	CHECK(total(bs, &FakeBackend::allocs) == vol->stats().slabs_live);
	CHECK(bs[0]->live_slabs() + bs[1]->live_slabs() == vol->stats().slabs_live);
	check_no_violations(bs);
}

TEST_CASE("volume: first writes from many threads at once spread evenly over two donors",
	  "[volume][concurrency]")
{
	// Placement counts the ALLOCs in flight: threads placing at once must not all choose the
	// donor whose reported free count looked best (two memservers with replicas=1 ended 20/28
	// with 48 slabs, and the give-back test waiting for its donor's share timed out).
	quiet();
	constexpr int kThreads = 8, kSlabs = 48;
	auto a = backend("m0", 64), b = backend("m1", 64);
	for (auto &x : {a, b}) {
		x->live_free = true;
		x->alloc_delay_us = 20000; // every thread decides while the others' ALLOCs are out
	}
	auto vol = make_volume({a, b}, opts(kSlabs * SS, kThreads, 64 * KiB));
	for (int round = 0; round < 4; round++) {
		std::atomic<int> go{0}, errors{0};
		std::vector<std::thread> ts;
		for (int t = 0; t < kThreads; t++)
			ts.emplace_back([&, t] {
				const Bytes d = pattern(4 * KiB, t);
				go++;
				while (go.load() < kThreads)
					std::this_thread::yield();
				for (int s = t; s < kSlabs; s += kThreads)
					if (vol->pwrite(d.data(), uint32_t(d.size()), s * SS))
						errors++;
			});
		for (auto &t : ts)
			t.join();
		REQUIRE(errors == 0);
		const size_t na = a->live_slabs(), nb = b->live_slabs();
		INFO("round " << round << ": m0 " << na << ", m1 " << nb);
		REQUIRE(na + nb == size_t(kSlabs));
		// Only an ALLOC between its reply and its in-flight count taken back is counted
		// twice: within 2 slabs. Without the in-flight count, every round of 8 decisions
		// sees the same loads (spreads of 2 to 6 here).
		CHECK(std::max(na, nb) - std::min(na, nb) <= 2);
		REQUIRE(vol->trim(uint32_t(kSlabs * SS), 0) == 0);
		REQUIRE(a->live_slabs() + b->live_slabs() == 0);
	}
	check_no_violations({a, b});
}

TEST_CASE("volume: racing first writes to one slab allocate it once", "[volume][concurrency]")
{
	quiet();
	constexpr int kThreads = 8;
	const uint64_t size = 4 * SS;
	auto b = backend("m0", 64);
	auto vol = make_volume({b}, opts(size, 4, 64 * KiB));
	Bytes shadow(size);
	for (int round = 0; round < 40; round++) {
		// Every other round, a slow allocation: the losers wait for the winner's grant.
		b->alloc_delay_us = round % 2 ? 2000 : 0;
		std::atomic<int> go{0}, errors{0};
		std::vector<std::thread> ts;
		const uint64_t piece = SS / kThreads;
		for (int t = 0; t < kThreads; t++)
			ts.emplace_back([&, t] {
				const Bytes d = pattern(piece, round * 100 + t);
				go++;
				while (go.load() < kThreads)
					std::this_thread::yield();
				// Every thread writes its own eighth of slab 1 (plus slab 2 for
				// the odd ones, in the other order).
				if (vol->pwrite(d.data(), uint32_t(piece), SS + t * piece))
					errors++;
				if (t % 2 && vol->pwrite(d.data(), uint32_t(piece),
							 3 * SS - (t + 1) * piece))
					errors++;
				std::copy(d.begin(), d.end(), shadow.begin() + SS + t * piece);
				if (t % 2)
					std::copy(d.begin(), d.end(),
						  shadow.begin() + 3 * SS - (t + 1) * piece);
			});
		for (auto &t : ts)
			t.join();
		INFO("round " << round);
		REQUIRE(errors == 0);
		REQUIRE(b->allocs == uint64_t(2 * (round + 1)));
		REQUIRE(compare_all(*vol, shadow) == -1);
		// Give both back for the next round.
		REQUIRE(vol->trim(uint32_t(size), 0) == 0);
		std::fill(shadow.begin(), shadow.end(), std::byte{0});
		REQUIRE(b->live_slabs() == 0);
	}
	check_no_violations({b});
}

TEST_CASE("volume: trim racing reads and writes of the same slabs", "[volume][concurrency]")
{
	quiet();
	// Writers store whole slabs of one repeated byte; readers read whole slabs and must see a
	// single value (a write or zeros), never a mix, never an error; trims run concurrently.
	// The fake data path flags any transfer on a slab that was freed under it.
	const uint64_t nslabs = 4;
	const uint64_t size = nslabs * SS;
	auto b = backend("m0", 64);
	auto vol = make_volume({b}, opts(size, 4, SS));
	std::atomic<bool> stop{false};
	std::atomic<int> errors{0}, torn{0};
	std::atomic<uint64_t> reads{0}, writes{0}, trims{0};
	std::vector<std::thread> ts;
	for (int t = 0; t < 3; t++)
		ts.emplace_back([&, t] {
			std::mt19937_64 rng(t);
			Bytes d(SS);
			while (!stop) {
				const uint64_t s = rng() % nslabs;
				std::fill(d.begin(), d.end(), std::byte(uint8_t(1 + rng() % 255)));
				if (vol->pwrite(d.data(), uint32_t(SS), s * SS))
					errors++;
				writes++;
			}
		});
	for (int t = 0; t < 3; t++)
		ts.emplace_back([&, t] {
			std::mt19937_64 rng(100 + t);
			Bytes d(SS);
			while (!stop) {
				const uint64_t s = rng() % nslabs;
				if (vol->pread(d.data(), uint32_t(SS), s * SS)) {
					errors++;
					continue;
				}
				if (std::count(d.begin(), d.end(), d[0]) != long(SS))
					torn++;
				reads++;
			}
		});
	ts.emplace_back([&] {
		std::mt19937_64 rng(999);
		while (!stop) {
			const uint64_t s = rng() % nslabs;
			if (vol->trim(uint32_t(SS), s * SS))
				errors++;
			trims++;
			std::this_thread::sleep_for(std::chrono::microseconds(100));
		}
	});
	std::this_thread::sleep_for(std::chrono::milliseconds(1500));
	stop = true;
	for (auto &t : ts)
		t.join();
	INFO("reads " << reads << " writes " << writes << " trims " << trims);
	CHECK(errors == 0);
	CHECK(torn == 0);
	CHECK(reads > 100);
	CHECK(writes > 100);
	CHECK(trims > 100);
	CHECK(b->live_slabs() == vol->stats().slabs_live);
	CHECK(b->allocs - b->frees == vol->stats().slabs_live);
	check_no_violations({b});
}

TEST_CASE("volume: a server reporting slab size 0 is rejected with an exception",
	  "[volume]")
{
	// A Server reporting slab size 0 must be refused with std::runtime_error (not SIGFPE).
	// (RemoteServer validates the HELLO reply first, so only a Server
	// implementation that skips that check reaches this.) Run in a child so a crash is a
	// test failure, not the end of the test run.
	quiet();
	const pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		// Catch2's fatal-signal handler would report from the child too: die quietly.
		for (int sig : {SIGFPE, SIGSEGV, SIGBUS, SIGILL, SIGABRT})
			std::signal(sig, SIG_DFL);
		int code = 1;
		try {
			auto vol = make_volume({backend("m0", 8, 0)}, opts(MiB));
			code = 2; // accepted: also wrong
		} catch (const std::runtime_error &) {
			code = 0;
		} catch (...) {
			code = 3;
		}
		_exit(code);
	}
	int status = 0;
	REQUIRE(waitpid(pid, &status, 0) == pid);
	INFO("child " << (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
					       : "exited " + std::to_string(WEXITSTATUS(status))));
	CHECK(WIFEXITED(status));
	CHECK(WEXITSTATUS(status) == 0);
}

namespace {
// Three fake donors bound to a volume (tags, epochs, floors), for the reattach tests.
std::vector<std::shared_ptr<FakeBackend>> bound_backends()
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64), backend("c", 64)};
	for (auto &b : bs)
		b->bound = true;
	return bs;
}

// Make every transfer and control call of `b` fail with `err` (0: work again).
void fail_everything(FakeBackend &b, int err)
{
	b.complete_error = err;
	b.post_error = err;
	b.free_error = err;
	b.tag_error = err;
}

VolumeOptions reattach_opts(uint64_t size, std::chrono::milliseconds repair_interval)
{
	auto o = opts(size);
	o.replicas = 2;
	o.repair_interval = repair_interval;
	return o;
}
} // namespace

TEST_CASE("volume: a restart never reads a replica that missed writes (epochs)", "[volume][reattach]")
{
	const auto bs = bound_backends();
	const auto o = reattach_opts(8 * SS, std::chrono::milliseconds(20));
	Bytes shadow(8 * SS);
	{
		auto v = make_volume(bs, o);
		REQUIRE(write_shadow(*v, shadow, pattern(8 * SS, 1), 0) == 0);
		// Donor b fails every transfer: the rewrite goes to the other replicas only, so
		// b's replicas miss it, but b keeps them (it never hears a FREE: like a hung donor).
		fail_everything(*bs[1], EIO);
		REQUIRE(write_shadow(*v, shadow, pattern(8 * SS, 2), 0) == 0);
		CHECK(v->stats().epoch_raises > 0);
		CHECK(compare_all(*v, shadow) == -1);
		// The plugin dies here (the Volume goes; the backends keep every slab and tag).
	}
	fail_everything(*bs[1], 0);
	size_t stale_on_b = 0;
	{
		std::lock_guard lock(bs[1]->mu);
		stale_on_b = bs[1]->slabs.size();
	}
	REQUIRE(stale_on_b > 0); // the hung donor still holds replicas of the first pattern
	for (auto &b : bs)
		b->reattach = true;
	auto v2 = make_volume(bs, o);
	const VolumeStats st = v2->stats();
	CHECK(st.reattached == 8);
	CHECK(st.reattach_stale == stale_on_b);
	CHECK(st.lost == 0);
	CHECK(compare_all(*v2, shadow) == -1); // the second pattern, never the first
	check_no_violations(bs);
}

TEST_CASE("volume: a restart that finds only a replica older than its floor reads EIO",
	  "[volume][reattach]")
{
	std::vector<std::shared_ptr<FakeBackend>> bs;
	// No repair: keep the degraded state.
	const auto o = reattach_opts(4 * SS, std::chrono::hours(1));
	Bytes shadow(4 * SS);
	std::set<uint64_t> on_b;
	// Placement is random and may leave b without a replica (then there is nothing to test):
	// start again until b holds one.
	for (int attempt = 0; attempt < 50 && on_b.empty(); attempt++) {
		bs = bound_backends();
		{
			auto v = make_volume(bs, o);
			REQUIRE(write_shadow(*v, shadow, pattern(4 * SS, 3), 0) == 0);
			fail_everything(*bs[1], EIO);
			REQUIRE(write_shadow(*v, shadow, pattern(4 * SS, 4), 0) == 0);
		}
		fail_everything(*bs[1], 0);
		std::lock_guard lock(bs[1]->mu);
		for (auto &[id, t] : bs[1]->tags)
			on_b.insert(t.first);
	}
	// Double fault: every newest replica of a chunk b also held is lost (its donor's
	// memory went), and b's stale replica survives. The third donor recorded the floor: such
	// chunks must read EIO, never b's stale bytes.
	REQUIRE(!on_b.empty());
	for (size_t k : {size_t(0), size_t(2)}) {
		std::lock_guard lock(bs[k]->mu);
		for (auto it = bs[k]->tags.begin(); it != bs[k]->tags.end();) {
			if (on_b.count(it->second.first)) {
				bs[k]->slabs.erase(it->first);
				it = bs[k]->tags.erase(it);
			} else {
				++it;
			}
		}
	}
	for (auto &b : bs)
		b->reattach = true;
	auto v2 = make_volume(bs, o);
	uint64_t eio = 0, good = 0;
	for (uint64_t c = 0; c < 4; c++) {
		Bytes buf(SS);
		const int e = v2->pread(buf.data(), uint32_t(SS), c * SS);
		if (e == 0) {
			CHECK(std::memcmp(buf.data(), shadow.data() + c * SS, SS) == 0); // never stale
			good++;
		} else {
			CHECK(e == EIO);
			eio++;
		}
	}
	CHECK(eio == on_b.size());
	CHECK(good == 4 - on_b.size());
	CHECK(v2->stats().lost == on_b.size());
}

// Wait (bounded) until `cond` holds; the repair thread runs every few milliseconds.

TEST_CASE("volume: give-back moves wanted slabs to other donors while I/O goes on",
	  "[volume][giveback]")
{
	quiet();
	const unsigned replicas = GENERATE(1u, 2u);
	INFO("replicas=" << replicas);
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64),
						     backend("c", 64)};
	auto o = opts(24 * SS, 2, 64 * KiB);
	o.replicas = replicas;
	o.repair_interval = std::chrono::milliseconds(5);
	auto v = make_volume(bs, o);
	Bytes shadow(24 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(24 * SS, 1), 0) == 0);
	REQUIRE(eventually([&] { return v->stats().degraded == 0; }));
	const size_t on_a = bs[0]->live_slabs();
	REQUIRE(on_a > 0);

	// A writer keeps changing the data while donor a wants all its slabs back.
	std::atomic<bool> stop{false};
	std::atomic<int> write_errors{0};
	std::mutex shadow_mu;
	std::thread writer([&] {
		for (uint64_t i = 0; !stop.load(); i++) {
			const uint64_t off = (i * 7919 * 4096) % (24 * SS - 8192);
			const Bytes d = pattern(8192, 100 + i);
			std::lock_guard lock(shadow_mu);
			if (write_shadow(*v, shadow, d, off) != 0)
				write_errors++;
		}
	});
	bs[0]->want_all();
	// (A move gives the old slab back first and counts itself after: wait for both.)
	const bool moved = eventually(
		[&] { return bs[0]->live_slabs() == 0 && v->stats().migrated >= on_a; });
	stop = true;
	writer.join();
	CHECK(moved);
	CHECK(write_errors == 0);
	CHECK(bs[0]->frees.load() == on_a); // freed by the client, after the move
	const VolumeStats st = v->stats();
	CHECK(st.migrated == on_a);
	// Each slab copied whole once, plus the blocks the writer changed during its copy again.
	CHECK(st.migrate_bytes >= on_a * SS);
	CHECK(st.migrate_bytes <= on_a * SS * 4);
	CHECK(v->status_text().find("migrate_ms=") != std::string::npos);
	CHECK(st.lost == 0);
	CHECK(st.degraded == 0);
	CHECK(st.slabs_live == 24);
	// Every slab still has `replicas` copies, on b and c only, never two on one donor.
	CHECK(bs[1]->live_slabs() + bs[2]->live_slabs() == 24 * replicas);
	if (replicas == 2) {
		CHECK(bs[1]->live_slabs() == 24);
		CHECK(bs[2]->live_slabs() == 24);
	}
	CHECK(compare_all(*v, shadow) == -1);
	CHECK(v->status_text().find("migrated=" + std::to_string(on_a) + "\n") != std::string::npos);
	check_no_violations(bs);
}

TEST_CASE("volume: give-back with nowhere to move keeps the slabs and their data",
	  "[volume][giveback]")
{
	quiet();
	// Donor b is full: nothing can move off a.
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64)};
	bs[1]->alloc_error = ENOSPC;
	auto o = opts(8 * SS, 2, 64 * KiB);
	o.repair_interval = std::chrono::milliseconds(5);
	auto v = make_volume(bs, o);
	Bytes shadow(8 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(8 * SS, 3), 0) == 0);
	bs[0]->want_all();
	CHECK(eventually([&] { return v->stats().migrate_pending == 8; }));
	CHECK(bs[0]->live_slabs() == 8);
	CHECK(bs[0]->frees.load() == 0); // never free a slab still in use
	CHECK(v->stats().migrated == 0);
	CHECK(compare_all(*v, shadow) == -1);
	// Room appears: the slabs move.
	bs[1]->alloc_error = 0;
	CHECK(eventually([&] { return bs[0]->live_slabs() == 0; }));
	CHECK(eventually([&] { return v->stats().migrate_pending == 0; }));
	CHECK(eventually([&] { return v->stats().migrated >= 8; }));
	CHECK(v->stats().migrated == 8);
	CHECK(compare_all(*v, shadow) == -1);
	check_no_violations(bs);
}

TEST_CASE("volume: a donor that fails the give-back poll is not asked again during its cooldown",
	  "[volume][giveback]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64)};
	auto o = opts(8 * SS, 2, 64 * KiB);
	o.repair_interval = std::chrono::milliseconds(5);
	o.down_cooldown = std::chrono::seconds(60);
	o.replicas = 2; // both donors hold slabs of ours: both are polled every pass
	auto v = make_volume(bs, o);
	Bytes shadow(8 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(8 * SS, 9), 0) == 0);
	REQUIRE(eventually([&] { return bs[0]->wanted_polls.load() > 3; }));
	bs[0]->wanted_error = EAGAIN;
	const uint64_t before = bs[0]->wanted_polls.load();
	REQUIRE(eventually([&] { return bs[1]->wanted_polls.load() > before + 20; }));
	CHECK(bs[0]->wanted_polls.load() <= before + 2); // one failed poll, then cooldown
	// I/O goes on.
	CHECK(compare_all(*v, shadow) == -1);
	check_no_violations(bs);
}

TEST_CASE("volume: only donors holding our slabs are asked which they want back; every donor's "
	  "hint is refreshed",
	  "[volume][giveback]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64)};
	auto o = opts(8 * SS, 2, 64 * KiB);
	o.repair_interval = std::chrono::milliseconds(5);
	o.replicas = 1;
	auto v = make_volume(bs, o);
	Bytes shadow(8 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(SS, 4), 0) == 0); // one slab, on one donor
	const size_t h = bs[0]->live_slabs() ? 0 : 1;
	// Its first poll (a WANTED, then the hint) is done: no WANTED after it.
	REQUIRE(eventually([&] { return bs[1 - h]->hint_refreshes.load() > 0; }));
	const uint64_t before = bs[1 - h]->wanted_polls.load();
	REQUIRE(eventually([&] { return bs[h]->wanted_polls.load() > 40; }));
	CHECK(bs[1 - h]->wanted_polls.load() == before);
	CHECK(before == 1);
	CHECK(bs[1 - h]->hint_refreshes.load() > 40);
	CHECK(bs[h]->hint_refreshes.load() > 40);
	// A non-holder that does not answer is given up on for its cooldown, like a holder.
	bs[1 - h]->wanted_error = EAGAIN;
	CHECK(eventually([&] { return v->status_text().find(bs[1 - h]->name + " state=failed") !=
				      std::string::npos; }));
	check_no_violations(bs);
}

TEST_CASE("volume: give-back passes over a donor that turns out full", "[volume][giveback]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64),
						     backend("c", 64)};
	bs[1]->alloc_error = ENOSPC; // reports free slabs, but has none
	bs[2]->alloc_error = ENOSPC;
	auto o = opts(16 * SS, 2, 64 * KiB);
	o.repair_interval = std::chrono::milliseconds(100);
	auto v = make_volume(bs, o);
	Bytes shadow(16 * SS);
	REQUIRE(write_shadow(*v, shadow, pattern(16 * SS, 21), 0) == 0);
	REQUIRE(bs[0]->live_slabs() == 16);
	bs[2]->alloc_error = 0;
	bs[0]->want_all();
	// b's refusal sends each slab on to c: no move is ever left pending (a pass's count stays
	// visible until the next pass, 100 ms later).
	uint64_t max_pending = 0;
	CHECK(eventually([&] {
		max_pending = std::max(max_pending, v->stats().migrate_pending);
		return bs[0]->live_slabs() == 0;
	}));
	CHECK(max_pending == 0);
	CHECK(bs[2]->live_slabs() == 16);
	// (A move gives the old slab back first and counts itself after.)
	CHECK(eventually([&] { return v->stats().migrated >= 16; }));
	CHECK(v->stats().migrated == 16);
	CHECK(compare_all(*v, shadow) == -1);
	check_no_violations(bs);
}

TEST_CASE("volume: slabs moved by a give-back carry their epoch: a restart reattaches them",
	  "[volume][giveback][reattach]")
{
	const auto bs = bound_backends();
	const auto o = reattach_opts(8 * SS, std::chrono::milliseconds(5));
	Bytes shadow(8 * SS);
	size_t moved = 0;
	{
		auto v = make_volume(bs, o);
		REQUIRE(write_shadow(*v, shadow, pattern(8 * SS, 31), 0) == 0);
		moved = bs[0]->live_slabs();
		REQUIRE(moved > 0);
		bs[0]->want_all();
		REQUIRE(eventually([&] { return bs[0]->live_slabs() == 0; }));
		CHECK(eventually([&] { return v->stats().migrated >= moved; }));
		CHECK(v->stats().migrated == moved);
		// No copy is left tagged with epoch 0 (incomplete) on the new donors.
		for (size_t k : {size_t(1), size_t(2)}) {
			std::lock_guard lock(bs[k]->mu);
			for (auto &[id, t] : bs[k]->tags)
				CHECK(t.second != 0);
		}
		CHECK(compare_all(*v, shadow) == -1);
	}
	for (auto &b : bs)
		b->reattach = true;
	auto v2 = make_volume(bs, o);
	const VolumeStats st = v2->stats();
	CHECK(st.reattached == 8);
	CHECK(st.reattach_stale == 0);
	CHECK(st.lost == 0);
	CHECK(st.degraded == 0);
	CHECK(compare_all(*v2, shadow) == -1);
	check_no_violations(bs);
}

namespace {
// The value of `key=` in a status report (UINT64_MAX if the line is missing).
uint64_t status_value(const std::string &text, const std::string &key)
{
	const std::string k = key + "=";
	for (size_t at = 0; at < text.size();) {
		const size_t end = std::min(text.find('\n', at), text.size());
		if (text.compare(at, k.size(), k) == 0)
			return std::stoull(text.substr(at + k.size(), end - at - k.size()));
		at = end + 1;
	}
	return UINT64_MAX;
}
} // namespace

TEST_CASE("volume: the status report counts requests and sums every channel's data path counters",
	  "[volume][status]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("m0", 64), backend("m1", 64)};
	auto o = opts(32 * SS, 2);
	o.replicas = 2;
	auto v = make_volume(bs, o);
	std::string st = v->status_text();
	CHECK(status_value(st, "io_requests") == 0);
	CHECK(status_value(st, "rdma_posts") == 0);
	constexpr unsigned kFill = 32; // every slab written first: every read goes to a donor
	const Bytes fill = pattern(SS, 99);
	for (unsigned i = 0; i < kFill; i++)
		REQUIRE(v->pwrite(fill.data(), uint32_t(SS), i * SS) == 0);
	const uint64_t posts0 = status_value(v->status_text(), "rdma_posts");

	// 4 threads over 2 channels: channels change hands, and no count may be lost.
	constexpr unsigned kThreads = 4, kEach = 150;
	std::atomic<bool> stop{false};
	std::atomic<unsigned> errors{0};
	std::thread reader([&] { // the status thread reads while requests run
		while (!stop)
			(void)v->status_text();
	});
	std::vector<std::thread> ts;
	for (unsigned t = 0; t < kThreads; t++)
		ts.emplace_back([&, t] {
			const Bytes data = pattern(8 * KiB, t);
			Bytes back(8 * KiB);
			for (unsigned i = 0; i < kEach; i++) {
				// 8 KiB across a slab boundary: two operations per data path, one batch
				const uint64_t off = ((t * kEach + i) % 31 + 1) * SS - 4 * KiB;
				if (i % 3 == 0)
					errors += v->pwrite(data.data(), 8 * KiB, off) != 0;
				else
					errors += v->pread(back.data(), 8 * KiB, off) != 0;
			}
		});
	for (auto &t : ts)
		t.join();
	stop = true;
	reader.join();
	REQUIRE(errors == 0);
	// Neither zero() nor trim() is a READ or WRITE request.
	REQUIRE(v->zero(100, 5 * SS + 7, false) == 0);
	REQUIRE(v->trim(uint32_t(2 * SS), 20 * SS) == 0);

	st = v->status_text();
	INFO(st);
	const uint64_t writes = kFill + kThreads * ((kEach + 2) / 3);
	CHECK(status_value(st, "io_writes") == writes);
	CHECK(status_value(st, "io_reads") == kFill + kThreads * kEach - writes);
	CHECK(status_value(st, "io_requests") == kFill + kThreads * kEach);
	uint64_t posts = 0, completes = 0;
	for (auto &b : bs) {
		posts += b->posted_reads + b->posted_writes;
		completes += b->completes;
	}
	// The repair thread did nothing here, so every operation went through an I/O channel.
	CHECK(status_value(st, "rdma_posts") == posts);
	CHECK(status_value(st, "data_batches") == completes);
	CHECK(status_value(st, "rdma_posts") - posts0 >= 2 * kThreads * kEach); // two slabs each
	CHECK(status_value(st, "rdma_doorbells") == 0); // the fake does not count these
	CHECK(status_value(st, "rdma_sleeps") == 0);
	check_no_violations(bs);
}

TEST_CASE("volume: donors added while writers run get new slabs; retired ones get none",
	  "[volume][membership]")
{
	quiet();
	std::vector<std::shared_ptr<FakeBackend>> bs{backend("a", 64), backend("b", 64)};
	for (auto &b : bs)
		b->live_free = true;
	auto o = opts(48 * SS, 2, 64 * KiB);
	o.replicas = 2;
	o.max_servers = 4;
	o.repair_interval = std::chrono::milliseconds(5);
	auto v = make_volume(bs, o);
	Bytes shadow(48 * SS);
	std::mutex shadow_mu;
	REQUIRE(write_shadow(*v, shadow, pattern(16 * SS, 1), 0) == 0);
	// Writers to the first 16 slabs while c is added (its data paths opened, then published).
	std::atomic<bool> stop{false};
	std::atomic<int> write_errors{0};
	std::thread writer([&] {
		for (uint64_t i = 0; !stop.load(); i++) {
			const uint64_t off = (i * 7919 * 4096) % (16 * SS - 8192);
			const Bytes d = pattern(8192, 100 + i);
			std::lock_guard lock(shadow_mu);
			if (write_shadow(*v, shadow, d, off) != 0)
				write_errors++;
		}
	});
	auto c = backend("c", 64);
	c->live_free = true;
	bs.push_back(c);
	CHECK(v->add_server(std::make_unique<FakeServer>(c)) == 2);
	CHECK(v->servers() == 3);
	{
		// New slabs: c is the emptiest, so each of the 16 gets a copy there.
		std::lock_guard lock(shadow_mu);
		REQUIRE(write_shadow(*v, shadow, pattern(16 * SS, 2), 16 * SS) == 0);
	}
	CHECK(c->live_slabs() == 16);
	// Retired: no new slab goes to c, though it is the emptiest.
	v->set_retired(2, true);
	CHECK(v->retired(2));
	{
		std::lock_guard lock(shadow_mu);
		REQUIRE(write_shadow(*v, shadow, pattern(16 * SS, 3), 32 * SS) == 0);
	}
	CHECK(c->live_slabs() == 16);
	CHECK(v->status_text().find("=c state=retired") != std::string::npos);
	// Its replicas still serve: reads go on while it is retired.
	{
		std::lock_guard lock(shadow_mu);
		CHECK(compare_all(*v, shadow) == -1);
	}
	// A restart of c (a new boot id): its replicas are invalid at once and repaired on a, b
	// and the next added donor d.
	auto d = backend("d", 64);
	d->live_free = true;
	bs.push_back(d);
	CHECK(v->add_server(std::make_unique<FakeServer>(d)) == 3);
	// A fifth donor does not fit max_servers=4.
	CHECK_THROWS_AS(v->add_server(std::make_unique<FakeServer>(backend("e", 64))),
			std::runtime_error);
	v->donor_restarted(2);
	// (A repair's copy is counted after it switched over: wait for the count too.)
	CHECK(eventually([&] { return v->stats().degraded == 0 && v->stats().repaired >= 16; }));
	stop = true;
	writer.join();
	CHECK(write_errors == 0);
	const VolumeStats st = v->stats();
	CHECK(st.lost == 0);
	CHECK(st.repaired >= 16);
	CHECK(d->live_slabs() >= 1);
	CHECK(compare_all(*v, shadow) == -1);
	check_no_violations(bs);
}

TEST_CASE("volume: add_server refuses a donor that does not fit", "[volume][membership]")
{
	quiet();
	auto v = make_volume({backend("a", 8)}, opts(4 * SS));
	// Another slab size.
	CHECK_THROWS_AS(v->add_server(std::make_unique<FakeServer>(backend("b", 8, 2 * SS))),
			std::runtime_error);
	// Its data paths cannot be opened: nothing is published.
	auto c = backend("c", 8);
	c->fail_open = true;
	CHECK_THROWS_AS(v->add_server(std::make_unique<FakeServer>(c)), std::runtime_error);
	CHECK(v->servers() == 1);
	c->fail_open = false;
	CHECK(v->add_server(std::make_unique<FakeServer>(c)) == 1);
}
