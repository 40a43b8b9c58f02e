// SPDX-License-Identifier: MIT
// Unit tests for common/volume/volume against in-memory fake memservers (fake_transport.h).
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

#include "common/obs/log.h"
#include "common/volume/volume.h"
#include "tests/support/fake_transport.h"
#include "tests/support/volume_helpers.h"

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

TEST_CASE("volume: a size beyond 2^20 slabs is refused, saying the maximum", "[volume]")
{
	// (Before: size=1P was a bare std::bad_alloc from the per-slab table, or worse.)
	quiet();
	auto a = backend("m0", 8); // 64 KiB slabs: at most 2^20 x 64 KiB = 64 GiB
	const uint64_t max = (uint64_t(1) << 20) * SS;
	for (const uint64_t size : {uint64_t(1) << 50, max + SS}) {
		std::string msg;
		try {
			make_volume({a}, opts(size));
		} catch (const std::runtime_error &e) {
			msg = e.what();
		}
		INFO("size " << size << ": " << msg);
		CHECK(msg.find("size=" + std::to_string(size) + " is too large") != std::string::npos);
		CHECK(msg.find("the maximum size is 64 GiB (68719476736 bytes") != std::string::npos);
		CHECK(msg.find("64 KiB") != std::string::npos);
	}
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
