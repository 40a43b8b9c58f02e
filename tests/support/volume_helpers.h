// SPDX-License-Identifier: MIT
// Helpers shared by the Volume unit tests: fake memservers, volumes over them, patterns and
// a shadow copy to compare against.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/obs/log.h"
#include "common/volume/volume.h"
#include "tests/support/fake_transport.h"
#include "tests/support/test_clock.h"

namespace rdmaswap::test {

constexpr uint64_t KiB = 1024, MiB = KiB * 1024;
constexpr uint64_t SS = 64 * KiB; // slab size used by most tests

using Bytes = std::vector<std::byte>;

inline void quiet()
{
	// The volume logs expected failures (ENOSPC, EIO) at error level; keep the output clean.
	set_log_level("off");
}

inline std::shared_ptr<FakeBackend> backend(const std::string &name, uint32_t max_slabs,
				     uint64_t slab_size = SS, uint32_t max_io = proto::kMaxIo)
{
	return std::make_shared<FakeBackend>(name, slab_size, max_slabs, max_io);
}

inline VolumeOptions opts(uint64_t size, unsigned channels = 2, size_t buffer = 256 * KiB)
{
	VolumeOptions o;
	o.size = size;
	o.channels = channels;
	o.buffer_size = buffer;
	o.timeout = std::chrono::milliseconds(2000);
	return o;
}

inline std::unique_ptr<Volume> make_volume(const std::vector<std::shared_ptr<FakeBackend>> &bs,
				    const VolumeOptions &o)
{
	std::vector<std::unique_ptr<Server>> servers;
	for (auto &b : bs)
		servers.push_back(std::make_unique<FakeServer>(b));
	return std::make_unique<Volume>(std::move(servers), o);
}

inline Bytes pattern(size_t n, uint64_t seed)
{
	Bytes v(n);
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x1234567;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		v[i] = std::byte(uint8_t(x) | 1); // never zero, so zeros are always detectable
	}
	return v;
}

inline bool is_zero(const std::byte *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != std::byte{0})
			return false;
	return true;
}

// Read [off, off+len) in pieces and compare with the shadow. Returns the first mismatching
// offset, -1 if equal, or -2 - errno if a read failed.
inline int64_t compare(Volume &v, const Bytes &shadow, uint64_t off, uint64_t len)
{
	Bytes buf;
	const uint64_t step = 4 * MiB;
	for (uint64_t at = off; at < off + len; at += step) {
		const uint64_t n = std::min(step, off + len - at);
		buf.assign(n, std::byte{0xee});
		if (int e = v.pread(buf.data(), uint32_t(n), at))
			return -2 - e;
		if (std::memcmp(buf.data(), shadow.data() + at, n) != 0)
			for (uint64_t i = 0; i < n; i++)
				if (buf[i] != shadow[at + i])
					return int64_t(at + i);
	}
	return -1;
}

inline int64_t compare_all(Volume &v, const Bytes &shadow)
{
	return compare(v, shadow, 0, shadow.size());
}

inline int write_shadow(Volume &v, Bytes &shadow, const Bytes &data, uint64_t off)
{
	const int e = v.pwrite(data.data(), uint32_t(data.size()), off);
	if (e == 0)
		std::copy(data.begin(), data.end(), shadow.begin() + off);
	return e;
}

inline void check_no_violations(const std::vector<std::shared_ptr<FakeBackend>> &bs)
{
	for (auto &b : bs) {
		const auto v = b->take_violations();
		for (size_t i = 0; i < std::min<size_t>(v.size(), 10); i++)
			FAIL_CHECK("DataPath/Server contract violation: " << v[i]);
		CHECK(v.empty());
	}
}

inline uint64_t total(const std::vector<std::shared_ptr<FakeBackend>> &bs,
	       std::atomic<uint64_t> FakeBackend::*counter)
{
	uint64_t n = 0;
	for (auto &b : bs)
		n += (*b.*counter).load();
	return n;
}


// `threads` threads, thread t on its own region [t * region, (t + 1) * region): `iters` writes
// of random ranges (every `every`-th up to the whole region, the others up to `short_len`
// bytes), each followed by a read of a random part of the region compared with the shadow
// (disjoint parts of it: no lock). Returns the failed requests plus the mismatching reads.
inline int hammer_regions(Volume &vol, Bytes &shadow, int threads, uint64_t region, int iters,
			  int every, uint64_t short_len, uint64_t seed)
{
	std::atomic<int> bad{0};
	std::vector<std::thread> ts;
	for (int t = 0; t < threads; t++)
		ts.emplace_back([&, t] {
			std::mt19937_64 rng(seed + t);
			const uint64_t base = uint64_t(t) * region;
			for (int i = 0; i < iters; i++) {
				const uint64_t len = 1 + rng() % (i % every == 0 ? region : short_len);
				const uint64_t off = base + rng() % (region - len + 1);
				const Bytes d = pattern(len, rng());
				if (vol.pwrite(d.data(), uint32_t(len), off) != 0) {
					bad++;
					continue;
				}
				std::copy(d.begin(), d.end(), shadow.begin() + off);
				const uint64_t rlen = 1 + rng() % region;
				const uint64_t roff = base + rng() % (region - rlen + 1);
				Bytes r(rlen);
				if (vol.pread(r.data(), uint32_t(rlen), roff) != 0 ||
				    std::memcmp(r.data(), shadow.data() + roff, rlen) != 0)
					bad++;
			}
		});
	for (auto &t : ts)
		t.join();
	return bad.load();
}

// Polls `cond` every 5 ms until it holds (true) or `limit` passes (false).
template <typename F> inline bool eventually(F cond, std::chrono::milliseconds limit = std::chrono::seconds(20))
{
	const auto end = std::chrono::steady_clock::now() + limit;
	while (!cond()) {
		if (std::chrono::steady_clock::now() > end)
			return false;
		std::this_thread::sleep_for(std::chrono::milliseconds(5));
	}
	return true;
}

} // namespace rdmaswap::test
