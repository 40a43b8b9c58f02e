// SPDX-License-Identifier: MIT
// conn-flood SRC_ADDR DST_ADDR PORT SECONDS [RATE] [THREADS] [HOLD]: a reconnect flood for the
// memserver's per-address limits (test-connect-flood.sh): connect from SRC_ADDR (loopback
// only) to DST_ADDR:PORT, as fast as it can up to RATE connects per second (default 10000)
// over THREADS threads (default 2), for SECONDS. Each thread keeps its last HOLD connections
// open (default 0: each is closed at once), closing the oldest when it opens a new one, as a
// client that reconnects in a loop does. Prints what it reached:
// "flood: N connects in S s (R/s), F failed".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

sockaddr_in addr(const char *ip, unsigned port)
{
	sockaddr_in a{};
	a.sin_family = AF_INET;
	a.sin_port = htons(uint16_t(port));
	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
		std::fprintf(stderr, "conn-flood: not an IPv4 address: %s\n", ip);
		std::exit(2);
	}
	if ((ntohl(a.sin_addr.s_addr) >> 24) != 127) {
		std::fprintf(stderr, "conn-flood: loopback addresses only, not %s\n", ip);
		std::exit(2);
	}
	return a;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 5) {
		std::fprintf(stderr, "usage: conn-flood SRC_ADDR DST_ADDR PORT SECONDS [RATE] "
				     "[THREADS]\n");
		return 2;
	}
	const sockaddr_in src = addr(argv[1], 0);
	const sockaddr_in dst = addr(argv[2], unsigned(std::atoi(argv[3])));
	const double seconds = std::atof(argv[4]);
	const double rate = argc > 5 ? std::atof(argv[5]) : 10000;
	const int nthreads = argc > 6 ? std::max(1, std::atoi(argv[6])) : 2;
	const size_t hold = argc > 7 ? size_t(std::atoi(argv[7])) : 0;
	std::atomic<uint64_t> ok{0}, failed{0};
	const auto start = Clock::now();
	const auto end = start + std::chrono::duration<double>(seconds);
	std::vector<std::thread> threads;
	for (int t = 0; t < nthreads; t++)
		threads.emplace_back([&] {
			const double per_thread = rate / nthreads;
			uint64_t n = 0;
			std::deque<int> open;
			for (auto now = Clock::now(); now < end; now = Clock::now()) {
				// Paced: connect number n is due at start + n / per_thread.
				const auto due = start + std::chrono::duration<double>(n / per_thread);
				if (due > now)
					std::this_thread::sleep_until(due);
				n++;
				const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
				if (fd < 0) {
					failed++;
					continue;
				}
				const int one = 1;
				// The port is picked at connect, so ports in TIME_WAIT can be reused.
				setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
				// A refused SYN (full backlog) fails after 200 ms, not a retransmit later.
				const timeval tv{0, 200000};
				setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
				if (::bind(fd, reinterpret_cast<const sockaddr *>(&src), sizeof src) == 0 &&
				    ::connect(fd, reinterpret_cast<const sockaddr *>(&dst), sizeof dst) == 0)
					ok++;
				else
					failed++;
				open.push_back(fd);
				while (open.size() > hold) {
					::close(open.front());
					open.pop_front();
				}
			}
			for (int fd : open)
				::close(fd);
		});
	for (auto &t : threads)
		t.join();
	const double took = std::chrono::duration<double>(Clock::now() - start).count();
	std::printf("flood: %llu connects in %.1f s (%.0f/s), %llu failed\n",
		    static_cast<unsigned long long>(ok.load()), took, double(ok.load()) / took,
		    static_cast<unsigned long long>(failed.load()));
	return 0;
}
