// SPDX-License-Identifier: MIT
// nbdprobe: the fault soak's latency probe: reads 4 KiB of a block device with O_DIRECT at a
// fixed interval and reports how long the reads took.
//
//   nbdprobe --device /dev/nbd0 --seconds S [--interval-ms 100] [--slow-ms 500] [--seed N]
//
// A reader thread reads 4 KiB at a random 4 KiB-aligned offset of the device (O_DIRECT: the
// page cache never answers) every --interval-ms, on a fixed schedule (a read that took longer
// than the interval makes the reader skip the ticks it missed, not catch up).  After S seconds
// the main thread prints the summary and exits without joining the reader, so a read that
// never returns is reported as a stall of the time it has waited so far instead of hanging the
// probe.  Each read of --slow-ms or more, and each failed read, is printed as it happens.
//
// Times are CLOCK_BOOTTIME seconds ("at="), as in /proc/uptime and the kernel log.  Output:
//   nbdprobe: slow read MS ms offset=O at=T          (each read >= --slow-ms, first 200)
//   nbdprobe: read error E (strerror) offset=O at=T  (each failed read, first 200)
//   nbdprobe: reads=N errors=E p50_ms=.. p99_ms=.. max_ms=.. max_at=T over_1s=N in_flight_ms=..
// in_flight_ms: how long the read still outstanding at the end has waited (0 if none); max_ms
// includes it.  Exit 0 when every read succeeded, 1 if any failed or one was still outstanding
// at the end for more than 10 intervals, 2 on usage or setup errors.
// The reader holds preallocated storage for every sample: it allocates nothing while it runs.

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <linux/fs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t kBlock = 4096;

double boot_s() {
    timespec ts{};
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

void sleep_until(double t) {
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(t);
    ts.tv_nsec = static_cast<long>((t - static_cast<double>(ts.tv_sec)) * 1e9);
    while (clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
    }
}

[[noreturn]] void usage(const char* msg) {
    if (msg) std::fprintf(stderr, "nbdprobe: %s\n", msg);
    std::fprintf(stderr,
                 "usage: nbdprobe --device DEV --seconds S [--interval-ms 100] [--slow-ms 500]"
                 " [--seed N]\n");
    std::exit(2);
}

std::uint64_t parse_u64(std::string_view opt, const char* s) {
    std::string_view v(s);
    std::uint64_t out = 0;
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out, 10);
    if (ec != std::errc() || ptr != v.data() + v.size() || v.empty()) {
        std::fprintf(stderr, "nbdprobe: bad value for %.*s: '%s'\n",
                     static_cast<int>(opt.size()), opt.data(), s);
        usage(nullptr);
    }
    return out;
}

struct Shared {
    std::vector<double> lat;  // seconds per finished read; reserved up front
    std::atomic<std::size_t> n{0};         // finished reads (entries of lat published)
    std::atomic<std::uint64_t> errors{0};
    std::atomic<double> busy_since{0};     // start of the read in flight, 0 when idle
    std::atomic<double> max_s{0};
    std::atomic<double> max_at{0};
    std::atomic<bool> stop{false};
};

void reader(int fd, std::uint64_t blocks, double interval, double slow, std::uint64_t seed,
            void* buf, Shared& sh) {
    std::mt19937_64 rng(seed);
    unsigned printed = 0;
    double next = boot_s();
    while (!sh.stop.load()) {
        const std::uint64_t off = (rng() % blocks) * kBlock;
        const double a = boot_s();
        sh.busy_since.store(a);
        const ssize_t r = pread(fd, buf, kBlock, static_cast<off_t>(off));
        const int err = errno;
        const double b = boot_s();
        sh.busy_since.store(0);
        const double d = b - a;
        if (r != static_cast<ssize_t>(kBlock)) {
            sh.errors.fetch_add(1);
            if (++printed <= 200) {
                std::printf("nbdprobe: read error %d (%s) offset=%" PRIu64 " at=%.2f\n",
                            r < 0 ? err : 0, r < 0 ? std::strerror(err) : "short read", off, a);
                std::fflush(stdout);
            }
        } else if (d >= slow && ++printed <= 200) {
            std::printf("nbdprobe: slow read %.0f ms offset=%" PRIu64 " at=%.2f\n", d * 1e3, off,
                        a);
            std::fflush(stdout);
        }
        const std::size_t i = sh.n.load();
        if (i < sh.lat.size()) {
            sh.lat[i] = d;
            sh.n.store(i + 1);
        }
        if (d > sh.max_s.load()) {
            sh.max_s.store(d);
            sh.max_at.store(a);
        }
        next += interval;
        const double now = boot_s();
        if (next < now) next += interval * std::ceil((now - next) / interval);
        sleep_until(next);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const char* device = nullptr;
    std::uint64_t seconds = 0;
    std::uint64_t interval_ms = 100;
    std::uint64_t slow_ms = 500;
    std::uint64_t seed = 1;
    for (int i = 1; i < argc; ++i) {
        std::string_view a(argv[i]);
        auto value = [&]() -> const char* {
            if (i + 1 >= argc) usage("missing value");
            return argv[++i];
        };
        if (a == "--device") {
            device = value();
        } else if (a == "--seconds") {
            seconds = parse_u64(a, value());
        } else if (a == "--interval-ms") {
            interval_ms = parse_u64(a, value());
        } else if (a == "--slow-ms") {
            slow_ms = parse_u64(a, value());
        } else if (a == "--seed") {
            seed = parse_u64(a, value());
        } else if (a == "-h" || a == "--help") {
            usage(nullptr);
        } else {
            usage("unknown argument");
        }
    }
    if (!device) usage("--device is required");
    if (seconds < 1 || seconds > 7 * 86400) usage("--seconds must be 1..604800");
    if (interval_ms < 1 || interval_ms > 60000) usage("--interval-ms must be 1..60000");

    const int fd = open(device, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
        std::fprintf(stderr, "nbdprobe: open %s: %s\n", device, std::strerror(errno));
        return 2;
    }
    std::uint64_t bytes = 0;
    struct stat st{};
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        bytes = static_cast<std::uint64_t>(st.st_size);  // a file: for trying the probe out
    } else if (ioctl(fd, BLKGETSIZE64, &bytes) != 0) {
        bytes = 0;
    }
    if (bytes < kBlock) {
        std::fprintf(stderr, "nbdprobe: %s: no size (%s)\n", device, std::strerror(errno));
        return 2;
    }
    void* buf = nullptr;
    if (posix_memalign(&buf, kBlock, kBlock) != 0) {
        std::fprintf(stderr, "nbdprobe: out of memory\n");
        return 2;
    }
    const double interval = static_cast<double>(interval_ms) / 1e3;
    const double slow = static_cast<double>(slow_ms) / 1e3;
    Shared sh;
    sh.lat.assign(static_cast<std::size_t>(seconds * 1000 / interval_ms) + 16, 0.0);
    std::printf("nbdprobe: %s %" PRIu64 " MiB, 4 KiB O_DIRECT read every %" PRIu64
                " ms for %" PRIu64 " s, from at=%.2f\n",
                device, bytes >> 20, interval_ms, seconds, boot_s());
    std::fflush(stdout);

    const double end = boot_s() + static_cast<double>(seconds);
    std::thread t(reader, fd, bytes / kBlock, interval, slow, seed, buf, std::ref(sh));
    sleep_until(end);
    sh.stop.store(true);
    // Let a read that is about to finish finish; a stuck one is reported as in flight.
    const double grace = boot_s() + std::min(2.0, 2 * interval + 0.5);
    while (sh.busy_since.load() != 0 && boot_s() < grace) sleep_until(boot_s() + 0.01);
    const double since = sh.busy_since.load();
    const double in_flight = since != 0 ? boot_s() - since : 0.0;

    const std::size_t n = std::min(sh.n.load(), sh.lat.size());
    std::vector<double> v(sh.lat.begin(), sh.lat.begin() + static_cast<std::ptrdiff_t>(n));
    std::sort(v.begin(), v.end());
    auto pct = [&](double p) {
        if (v.empty()) return 0.0;
        std::size_t i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
        return v[std::min(i, v.size() - 1)];
    };
    double max_s = sh.max_s.load();
    double max_at = sh.max_at.load();
    if (in_flight > max_s) {
        max_s = in_flight;
        max_at = since;
    }
    const auto over_1s = static_cast<std::size_t>(
        std::count_if(v.begin(), v.end(), [](double d) { return d >= 1.0; }));
    const std::uint64_t errors = sh.errors.load();
    std::printf("nbdprobe: reads=%zu errors=%" PRIu64 " p50_ms=%.2f p99_ms=%.2f max_ms=%.1f"
                " max_at=%.2f over_1s=%zu in_flight_ms=%.0f\n",
                n, errors, pct(0.5) * 1e3, pct(0.99) * 1e3, max_s * 1e3, max_at, over_1s,
                in_flight * 1e3);
    std::fflush(stdout);
    const bool stuck = in_flight > 10 * interval;
    // The reader is not joined: it may be blocked in the kernel.  _Exit ends the process without
    // running the destructor of the still joinable thread.
    std::_Exit(errors != 0 || stuck ? 1 : 0);
}
