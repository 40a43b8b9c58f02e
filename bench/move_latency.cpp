// SPDX-License-Identifier: MIT
// Bench: what a give-back move costs the I/O of the slab being moved. Drives the real Volume
// over TCP to two running memservers: fills one slab, measures 4 KiB random reads of it
// (QD1) with no move, then asks its donor to give it back (GIVEBACK) and measures the same
// reads while the slab is copied to the other donor. Prints percentiles of both, the move's
// time and throughput, and checks the data afterwards.
// Usage: rdmaswap-bench-move SERVER1 SERVER2 AUTH_KEY_FILE SLAB_BYTES [SECONDS]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/obs/log.h"
#include "common/transport/control_client.h"
#include "common/transport/remote_server.h"
#include "common/util/config.h"
#include "common/volume/volume.h"
#include "common/wire/auth.h"

using namespace rdmaswap;
using Clock = std::chrono::steady_clock;

namespace {

struct Sample {
	Clock::time_point at;
	double us;
};

void report(const char *what, std::vector<double> v)
{
	if (v.empty()) {
		std::printf("%-22s no samples\n", what);
		return;
	}
	std::sort(v.begin(), v.end());
	auto pct = [&](double p) { return v[std::min(v.size() - 1, size_t(p * double(v.size())))]; };
	std::printf("%-22s n=%-7zu p50=%7.1f us  p99=%7.1f us  p99.9=%7.1f us  max=%8.1f us\n", what,
		    v.size(), pct(0.5), pct(0.99), pct(0.999), v.back());
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 5) {
		std::fprintf(stderr, "usage: %s SERVER1 SERVER2 AUTH_KEY_FILE SLAB_BYTES [SECONDS]\n",
			     argv[0]);
		return 2;
	}
	set_log_level("warn");
	const uint64_t slab = std::stoull(argv[4]);
	const double seconds = argc > 5 ? std::stod(argv[5]) : 3.0;
	auto key = load_auth_key(argv[3]);
	std::vector<std::unique_ptr<Server>> servers;
	std::vector<Endpoint> eps;
	for (int i = 1; i <= 2; i++) {
		RemoteServerOptions o;
		o.endpoint = *parse_endpoint(argv[i]);
		o.kind = TransportKind::Tcp;
		o.auth_key = key;
		eps.push_back(o.endpoint);
		servers.push_back(std::make_unique<RemoteServer>(o));
	}
	VolumeOptions vo;
	vo.size = slab;
	vo.channels = 4;
	vo.repair_interval = std::chrono::milliseconds(20);
	Volume vol(std::move(servers), vo);

	// Fill the slab with a pattern.
	std::vector<std::byte> data(slab);
	std::mt19937_64 rng(42);
	for (size_t i = 0; i < slab; i += 8) {
		const uint64_t x = rng();
		std::memcpy(&data[i], &x, 8);
	}
	for (uint64_t at = 0; at < slab; at += 1 << 20)
		if (vol.pwrite(data.data() + at, 1 << 20, at) != 0) {
			std::fprintf(stderr, "fill failed\n");
			return 1;
		}
	// The donor holding it ("donor.N=HOST:PORT state=ok slabs=1 ...").
	const std::string status = vol.status_text();
	const size_t d1 = status.find("donor.1=");
	const int holder = status.find(" slabs=1 ", d1) != std::string::npos ? 1 : 0;

	std::atomic<int> phase{0}; // 0: no move, 1: move asked, 2: stop
	std::vector<Sample> samples;
	samples.reserve(1 << 22);
	std::atomic<int> errors{0};
	std::thread reader([&] {
		std::mt19937_64 r(7);
		std::vector<std::byte> buf(4096);
		while (phase.load() != 2) {
			const uint64_t off = (r() % (slab / 4096)) * 4096;
			const auto t0 = Clock::now();
			if (vol.pread(buf.data(), 4096, off) != 0 ||
			    std::memcmp(buf.data(), data.data() + off, 4096) != 0)
				errors++;
			const auto t1 = Clock::now();
			if (samples.size() < samples.capacity())
				samples.push_back(
					{t0, std::chrono::duration<double, std::micro>(t1 - t0).count()});
		}
	});
	std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
	const auto move_start = Clock::now();
	ControlClient ctl(resolve(eps[size_t(holder)]), std::chrono::milliseconds(10000), key);
	proto::GiveBackReply gr;
	if (int e = ctl.give_back(2 * slab, gr)) { // its whole capacity: the free slab, then ours
		std::fprintf(stderr, "GIVEBACK failed: %s\n", std::strerror(e));
		phase = 2;
		reader.join();
		return 1;
	}
	while (vol.stats().migrated == 0 && Clock::now() - move_start < std::chrono::seconds(30))
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	const auto move_end = Clock::now();
	std::this_thread::sleep_for(std::chrono::milliseconds(200));
	phase = 2;
	reader.join();
	const VolumeStats st = vol.stats();
	// Samples before the request are the baseline; those that started inside the copy
	// (from the request to the switch-over seen here) are "during the move".
	std::vector<double> before, during;
	for (const auto &s : samples)
		if (s.at < move_start)
			before.push_back(s.us);
		else if (s.at < move_end)
			during.push_back(s.us);
	std::printf("slab %llu MiB over TCP loopback, 4 KiB random reads at QD1 of the slab\n",
		    (unsigned long long)(slab >> 20));
	report("no move:", before);
	report("during the move:", during);
	std::printf("move: %s, %.0f ms copying (%.0f MiB/s), %llu MiB copied, switch-over %llu us, "
		    "%llu copies abandoned\n",
		    st.migrated == 1 ? "done" : "NOT DONE", double(st.migrate_ms),
		    st.migrate_ms ? double(st.migrate_bytes) / 1048576.0 / (double(st.migrate_ms) / 1000)
				  : 0.0,
		    (unsigned long long)(st.migrate_bytes >> 20), (unsigned long long)st.switch_us_max,
		    (unsigned long long)st.clone_aborts);
	std::printf("read errors or wrong bytes: %d\n", errors.load());
	return errors.load() == 0 && st.migrated == 1 ? 0 : 1;
}
