// SPDX-License-Identifier: MIT
// Bench: the CPU one 4 KiB request costs in the plugin's logic (the real Volume), with no
// network: the volume's one server is the unit tests' FakeServer, whose data paths are
// replaced by a lean in-memory one (below) so that the fake's checks and its lock do not
// count. Runs 4 KiB random reads, then writes, with 1, 2, 4, 8 and 16 threads, and prints
// per thread count: wall ns per request (1 / throughput), process CPU ns per request, and the
// throughput relative to one thread. bench/cpu-per-request.sh also counts instructions.
// Usage: rdmaswap-bench-cpu [--threads 1,2,4,8,16] [--ops N] [--op read|write|both]
//                           [--size MiB] [--slab MiB] [--no-copy]
// --ops: requests per thread count and direction (default 400000), split over the threads.
// --no-copy: the in-memory data path moves no bytes (Volume's own bounce copy remains).
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/obs/log.h"
#include "common/volume/volume.h"
#include "tests/support/fake_transport.h"

using namespace rdmaswap;
using Clock = std::chrono::steady_clock;

namespace {

// The data path of a memserver in this process: a post records the operation, complete()
// copies the bytes. It resolves a grant to the backend's slab bytes once (under the backend's
// lock) and caches the pointer, so the data path shares nothing between channels afterwards.
// The bench never frees a slab, so a cached pointer stays valid.
class MemDataPath final : public DataPath {
public:
	MemDataPath(std::shared_ptr<test::FakeBackend> b, bool copy)
		: b_(std::move(b)), copy_(copy), slab_(b_->max_slabs, nullptr)
	{
	}
	int post_read(const SlabGrant &g, uint64_t off, uint32_t len, std::byte *local) override
	{
		return post(false, g, off, len, local);
	}
	int post_write(const SlabGrant &g, uint64_t off, uint32_t len,
		       const std::byte *local) override
	{
		return post(true, g, off, len, const_cast<std::byte *>(local));
	}
	int complete() override
	{
		for (unsigned i = 0; i < n_ && copy_; i++) {
			const Op &op = ops_[i];
			if (op.write)
				std::memcpy(op.remote, op.local, op.len);
			else
				std::memcpy(op.local, op.remote, op.len);
		}
		n_ = 0;
		return 0;
	}

private:
	struct Op {
		bool write;
		std::byte *remote;
		std::byte *local;
		uint32_t len;
	};
	int post(bool write, const SlabGrant &g, uint64_t off, uint32_t len, std::byte *local)
	{
		const uint32_t idx = g.id - kFirstId;
		if (n_ == kMaxBatch || idx >= slab_.size() || off > g.length || g.length - off < len)
			return EINVAL;
		if (!slab_[idx]) {
			std::lock_guard lock(b_->mu);
			auto it = b_->slabs.find(g.id);
			if (it == b_->slabs.end())
				return EINVAL;
			slab_[idx] = it->second.data();
		}
		ops_[n_++] = Op{write, slab_[idx] + off, local, len};
		return 0;
	}
	static constexpr uint32_t kFirstId = 1000; // FakeBackend's first slab id

	std::shared_ptr<test::FakeBackend> b_;
	bool copy_;
	std::vector<std::byte *> slab_; // slab id - kFirstId -> its bytes (set on first use)
	Op ops_[kMaxBatch];
	unsigned n_ = 0;
};

class MemServer final : public test::FakeServer {
public:
	MemServer(std::shared_ptr<test::FakeBackend> b, bool copy)
		: FakeServer(b), b_(std::move(b)), copy_(copy)
	{
	}
	std::unique_ptr<DataPath> open_data_path(std::span<std::byte>) override
	{
		return std::make_unique<MemDataPath>(b_, copy_);
	}

private:
	std::shared_ptr<test::FakeBackend> b_;
	bool copy_;
};

// The measured calls, not inlined so that callgrind can collect exactly them
// (--toggle-collect, see bench/cpu-per-request.sh).
[[gnu::noinline]] int bench_read_one(Volume &v, std::byte *buf, uint64_t off)
{
	return v.pread(buf, 4096, off);
}
[[gnu::noinline]] int bench_write_one(Volume &v, const std::byte *buf, uint64_t off)
{
	return v.pwrite(buf, 4096, off);
}

double cpu_seconds()
{
	rusage ru{};
	getrusage(RUSAGE_SELF, &ru);
	return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

struct Result {
	double wall_ns, cpu_ns, mreq_s;
	int errors;
};

// `threads` threads do `ops` 4 KiB requests in all at random aligned offsets.
Result run(Volume &vol, bool write, unsigned threads, uint64_t ops)
{
	std::atomic<unsigned> ready{0};
	std::atomic<bool> go{false};
	std::atomic<int> errors{0};
	std::vector<std::thread> ts;
	const uint64_t pages = vol.size() / 4096, per = ops / threads;
	for (unsigned t = 0; t < threads; t++)
		ts.emplace_back([&, t] {
			std::vector<std::byte> buf(4096, std::byte(t + 1));
			uint64_t x = 0x9e3779b97f4a7c15ull * (t + 1);
			ready++;
			while (!go.load())
				std::this_thread::yield();
			int err = 0;
			for (uint64_t i = 0; i < per; i++) {
				x ^= x << 13;
				x ^= x >> 7;
				x ^= x << 17;
				const uint64_t off = (x % pages) * 4096;
				err |= write ? bench_write_one(vol, buf.data(), off)
					     : bench_read_one(vol, buf.data(), off);
			}
			if (err)
				errors++;
		});
	while (ready.load() != threads)
		std::this_thread::yield();
	const double c0 = cpu_seconds();
	const auto t0 = Clock::now();
	go = true;
	for (auto &t : ts)
		t.join();
	const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
	const double cpu = cpu_seconds() - c0;
	const double n = double(per * threads);
	return {wall * 1e9 / n, cpu * 1e9 / n, n / wall / 1e6, errors.load()};
}

std::vector<unsigned> parse_list(const std::string &s)
{
	std::vector<unsigned> v;
	size_t at = 0;
	while (at < s.size()) {
		const size_t comma = s.find(',', at);
		v.push_back(unsigned(std::stoul(s.substr(at, comma - at))));
		at = comma == std::string::npos ? s.size() : comma + 1;
	}
	return v;
}

} // namespace

int main(int argc, char **argv)
{
	std::vector<unsigned> threads = {1, 2, 4, 8, 16};
	uint64_t ops = 400000, size_mib = 256, slab_mib = 16;
	bool copy = true;
	std::string op = "both";
	for (int i = 1; i < argc; i++) {
		const std::string a = argv[i];
		const bool has = i + 1 < argc;
		if (a == "--threads" && has)
			threads = parse_list(argv[++i]);
		else if (a == "--ops" && has)
			ops = std::stoull(argv[++i]);
		else if (a == "--size" && has)
			size_mib = std::stoull(argv[++i]);
		else if (a == "--slab" && has)
			slab_mib = std::stoull(argv[++i]);
		else if (a == "--op" && has && (std::string(argv[i + 1]) == "read" ||
						 std::string(argv[i + 1]) == "write" ||
						 std::string(argv[i + 1]) == "both"))
			op = argv[++i];
		else if (a == "--no-copy")
			copy = false;
		else {
			std::fprintf(stderr,
				     "usage: %s [--threads 1,2,4,8,16] [--ops N] [--op read|write|both] "
				     "[--size MiB] [--slab MiB] [--no-copy]\n",
				     argv[0]);
			return 2;
		}
	}
	set_log_level("warn");
	const uint64_t slab = slab_mib << 20, size = size_mib << 20;
	auto backend =
		std::make_shared<test::FakeBackend>("mem", slab, uint32_t(size / slab), proto::kMaxIo);
	std::vector<std::unique_ptr<Server>> servers;
	servers.push_back(std::make_unique<MemServer>(backend, copy));
	VolumeOptions vo;
	vo.size = size;
	vo.channels = 16; // as the plugin's default: one per nbdkit thread up to 16
	Volume vol(std::move(servers), vo);

	// Fill it so that every read goes to the data path (never-written slabs read as zeros
	// without one).
	std::vector<std::byte> mib(1 << 20, std::byte{0x5a});
	for (uint64_t at = 0; at < size; at += mib.size())
		if (vol.pwrite(mib.data(), uint32_t(mib.size()), at) != 0) {
			std::fprintf(stderr, "fill failed\n");
			return 1;
		}

	std::printf("Volume %llu MiB in %llu MiB slabs, 1 in-memory server (%s), 16 channels; "
		    "4 KiB requests at random offsets, %llu per row; %u CPUs.\n",
		    (unsigned long long)size_mib, (unsigned long long)slab_mib,
		    copy ? "copies the bytes" : "no copy in the data path",
		    (unsigned long long)ops, std::thread::hardware_concurrency());
	std::printf("wall ns = elapsed / requests (1 / throughput); CPU ns = process CPU / requests; "
		    "x1 = throughput / 1 thread's.\n\n");
	std::printf("| op | threads | wall ns/req | CPU ns/req | Mreq/s | x1 |\n");
	std::printf("|---|---:|---:|---:|---:|---:|\n");
	int errors = 0;
	for (const bool write : {false, true}) {
		if (op != "both" && (op == "write") != write)
			continue;
		double base = 0;
		for (unsigned t : threads) {
			const Result r = run(vol, write, t, ops);
			if (base == 0)
				base = r.mreq_s;
			errors += r.errors;
			std::printf("| %s | %u | %.0f | %.0f | %.2f | %.2f |\n", write ? "write" : "read",
				    t, r.wall_ns, r.cpu_ns, r.mreq_s, r.mreq_s / base);
			std::fflush(stdout);
		}
	}
	if (errors)
		std::fprintf(stderr, "%d threads saw a failed request\n", errors);
	return errors ? 1 : 0;
}
