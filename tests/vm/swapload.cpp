// SPDX-License-Identifier: MIT
// swapload: the VM swap workload.
//
//   swapload --mib N [--seed S] [--passes P | --seconds S] [--rewrite] [--thp]
//
// Maps N MiB of anonymous memory, writes every 4 KiB page with pseudo-random content derived from
// (seed, page index, generation), then reads every page back P times and compares it with content
// re-derived from the same inputs.  Run it in a memory-limited cgroup and the pages go to swap and
// come back; any page that comes back wrong (zeros, another page's bytes, an older generation of the
// same page) is reported and the program exits 1 on the first one.
//
// Page layout (512 little 64-bit words):
//   word 0   kMagic ^ index          (so a misplaced page can be identified in the report)
//   word 1   seed
//   word 2   generation
//   word 3.. splitmix64 stream seeded from mix(seed, index, generation)
// Every word depends on the index, so neither a zero page nor another page's content can pass.
//
// --rewrite: after verifying a page in pass p (p >= 1) write it again with generation p, so every
//            pass dirties the whole working set and it has to be swapped out again (more pswpout),
//            and a stale copy of the previous generation is detected in the next pass.
// --seconds S: run verify passes (alternating direction, as above) until S seconds after the
//            start instead of --passes of them; the run ends at the first page after the deadline,
//            usually in the middle of a pass (the fault soak: a workload that lasts as long as
//            the faults are injected).
// --thp:     allow transparent huge pages (default: MADV_NOHUGEPAGE, plain 4 KiB pages).
// --inject zero|other|flip: self-test of the checker: damage page 1 after writing (zero it, copy
//            page 0 over it, flip one bit) so that the verify pass must report a MISMATCH.
//
// Output: progress lines "swapload: ..." and finally exactly one of
//   swapload: OK pages=N passes=P checks=C
//   swapload: MISMATCH page=I ...
// Every verify access is timed (it includes the page fault that swaps the page in): each one of
// 1 s or more is printed as "swapload: stall MS ms page=I pass=P at=UPTIME" (the first 100), and
// before the OK line
//   swapload: longest page stall MS ms page=I pass=P at=UPTIME; stalls >=100ms: N, >=1s: M
// (UPTIME: CLOCK_BOOTTIME seconds, as in /proc/uptime and dmesg).
// A page that cannot be read back at all (the swap device failed the read: the kernel sends
// SIGBUS) ends the run with
//   swapload: SIGBUS page=I pass=P at=UPTIME (the page could not be read back: swap I/O error)
// and the longest-stall line, exit status 3.
// Exit status: 0 OK, 1 mismatch, 2 usage or system error, 3 SIGBUS.
// No dependencies beyond the C++ standard library and POSIX.

#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kWords = kPage / sizeof(std::uint64_t);
constexpr std::uint64_t kMagic = 0x5357'4150'4c4f'4144ULL;  // "SWAPLOAD"

std::uint64_t splitmix64(std::uint64_t& state) {
    std::uint64_t z = (state += 0x9e37'79b9'7f4a'7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58'476d'1ce4'e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d0'49bb'1331'11ebULL;
    return z ^ (z >> 31);
}

std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t index, std::uint64_t gen) {
    std::uint64_t s = seed;
    std::uint64_t a = splitmix64(s);
    s = a ^ (index * 0xd6e8'feb8'6659'fd93ULL);
    std::uint64_t b = splitmix64(s);
    s = b ^ (gen * 0xa076'1d64'78bd'642fULL) ^ index;
    return splitmix64(s);
}

void fill_page(std::uint64_t* p, std::uint64_t seed, std::uint64_t index, std::uint64_t gen) {
    p[0] = kMagic ^ index;
    p[1] = seed;
    p[2] = gen;
    std::uint64_t st = stream_seed(seed, index, gen);
    for (std::size_t w = 3; w < kWords; ++w) p[w] = splitmix64(st);
}

// Returns the index of the first differing word, or kWords if the page matches.
std::size_t check_page(const std::uint64_t* p, std::uint64_t seed, std::uint64_t index,
                       std::uint64_t gen, std::uint64_t* expected_out) {
    std::uint64_t exp[3] = {kMagic ^ index, seed, gen};
    for (std::size_t w = 0; w < 3; ++w) {
        if (p[w] != exp[w]) {
            *expected_out = exp[w];
            return w;
        }
    }
    std::uint64_t st = stream_seed(seed, index, gen);
    for (std::size_t w = 3; w < kWords; ++w) {
        std::uint64_t e = splitmix64(st);
        if (p[w] != e) {
            *expected_out = e;
            return w;
        }
    }
    return kWords;
}

double now_s() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Seconds since boot (what /proc/uptime and the kernel log's timestamps count).
double boot_s() {
    timespec ts{};
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// The longest verify access (page fault included) and how many were slow.
struct Stalls {
    double max_s = 0;
    std::uint64_t max_page = 0;
    unsigned max_pass = 0;
    double max_at = 0;
    std::uint64_t over_100ms = 0;
    std::uint64_t over_1s = 0;

    void add(double start, double secs, std::uint64_t index, unsigned pass) {
        if (secs >= 0.1) ++over_100ms;
        if (secs >= 1.0) {
            if (++over_1s <= 100) {
                std::printf("swapload: stall %.0f ms page=%" PRIu64 " pass=%u at=%.2f\n",
                            secs * 1e3, index, pass, start);
                std::fflush(stdout);
            }
        }
        if (secs > max_s) {
            max_s = secs;
            max_page = index;
            max_pass = pass;
            max_at = start;
        }
    }
};

void print_stalls(const Stalls& st) {
    std::printf("swapload: longest page stall %.1f ms page=%" PRIu64 " pass=%u at=%.2f;"
                " stalls >=100ms: %" PRIu64 ", >=1s: %" PRIu64 "\n",
                st.max_s * 1e3, st.max_page, st.max_pass, st.max_at, st.over_100ms, st.over_1s);
}

// For the SIGBUS handler: where the run is.
Stalls g_stalls;
const char* g_base = nullptr;
volatile unsigned g_pass = 0;

// The kernel could not read a swapped-out page back: report it and the stalls so far, exit 3.
// (stdio in a signal handler: acceptable here, the process ends right after and the main flow
// is stopped at a page access, not inside stdio.)
void on_sigbus(int, siginfo_t* si, void*) {
    const auto addr = reinterpret_cast<const char*>(si->si_addr);
    const long long page = g_base && addr >= g_base ? (addr - g_base) / static_cast<long long>(kPage) : -1;
    std::printf("swapload: SIGBUS page=%lld pass=%u at=%.2f (the page could not be read back:"
                " swap I/O error)\n",
                page, g_pass, boot_s());
    print_stalls(g_stalls);
    std::fflush(stdout);
    _exit(3);
}

[[noreturn]] void usage(const char* msg) {
    if (msg) std::fprintf(stderr, "swapload: %s\n", msg);
    std::fprintf(stderr,
                 "usage: swapload --mib N [--seed S] [--passes P | --seconds S] [--rewrite] "
                 "[--thp]\n"
                 "                [--inject zero|other|flip]\n"
                 "  writes N MiB of per-page pseudo-random content, verifies it P times "
                 "(default 2)\n"
                 "  or until S seconds after the start\n");
    std::exit(2);
}

std::uint64_t parse_u64(std::string_view opt, const char* s) {
    std::string_view v(s);
    std::uint64_t out = 0;
    int base = 10;
    if (v.size() > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) {
        v.remove_prefix(2);
        base = 16;
    }
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out, base);
    if (ec != std::errc() || ptr != v.data() + v.size() || v.empty()) {
        std::fprintf(stderr, "swapload: bad value for %.*s: '%s'\n", static_cast<int>(opt.size()),
                     opt.data(), s);
        usage(nullptr);
    }
    return out;
}

void report_mismatch(const std::uint64_t* p, std::uint64_t index, std::uint64_t gen,
                     std::size_t word, std::uint64_t expected, std::uint64_t pages,
                     unsigned pass) {
    bool all_zero = true;
    for (std::size_t w = 0; w < kWords; ++w) {
        if (p[w] != 0) {
            all_zero = false;
            break;
        }
    }
    char what[160];
    if (all_zero) {
        std::snprintf(what, sizeof what, "page is all zeros");
    } else if ((p[0] ^ kMagic) < pages && (p[0] ^ kMagic) != index) {
        std::snprintf(what, sizeof what, "page holds page %" PRIu64 "'s content (gen %" PRIu64 ")",
                      p[0] ^ kMagic, p[2]);
    } else if ((p[0] ^ kMagic) == index && p[2] != gen) {
        std::snprintf(what, sizeof what, "page holds a stale generation %" PRIu64 " (want %" PRIu64
                      ")", p[2], gen);
    } else {
        std::snprintf(what, sizeof what, "corrupt content");
    }
    std::printf("swapload: MISMATCH page=%" PRIu64 " pass=%u word=%zu got=0x%016" PRIx64
                " want=0x%016" PRIx64 " (%s)\n",
                index, pass, word, p[word], expected, what);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    std::uint64_t mib = 0;
    std::uint64_t seed = 1;
    std::uint64_t passes = 2;
    std::uint64_t seconds = 0;
    bool rewrite = false;
    bool thp = false;
    std::string_view inject;
    for (int i = 1; i < argc; ++i) {
        std::string_view a(argv[i]);
        auto value = [&]() -> const char* {
            if (i + 1 >= argc) usage("missing value");
            return argv[++i];
        };
        if (a == "--mib") {
            mib = parse_u64(a, value());
        } else if (a == "--seed") {
            seed = parse_u64(a, value());
        } else if (a == "--passes") {
            passes = parse_u64(a, value());
        } else if (a == "--seconds") {
            seconds = parse_u64(a, value());
            if (seconds < 1 || seconds > 7 * 86400) usage("--seconds must be 1..604800");
        } else if (a == "--rewrite") {
            rewrite = true;
        } else if (a == "--thp") {
            thp = true;
        } else if (a == "--inject") {
            inject = value();
            if (inject != "zero" && inject != "other" && inject != "flip")
                usage("--inject takes zero, other or flip");
        } else if (a == "-h" || a == "--help") {
            usage(nullptr);
        } else {
            usage("unknown argument");
        }
    }
    if (mib == 0) usage("--mib N (N > 0) is required");
    if (mib > (std::uint64_t{1} << 30)) usage("--mib too large");
    if (passes < 1 || passes > 1000) usage("--passes must be 1..1000");

    const std::uint64_t pages = mib * (1024 * 1024 / kPage);
    const std::size_t bytes = static_cast<std::size_t>(mib) * 1024 * 1024;
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
        std::fprintf(stderr, "swapload: mmap of %" PRIu64 " MiB failed: %s\n", mib,
                     std::strerror(errno));
        return 2;
    }
    if (!thp) (void)madvise(mem, bytes, MADV_NOHUGEPAGE);
    auto* base = static_cast<std::uint64_t*>(mem);
    g_base = static_cast<const char*>(mem);
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGBUS, &sa, nullptr);
    auto page = [&](std::uint64_t i) { return base + i * kWords; };

    if (seconds) {
        std::printf("swapload: mib=%" PRIu64 " pages=%" PRIu64 " seed=%" PRIu64
                    " seconds=%" PRIu64 "%s\n",
                    mib, pages, seed, seconds, rewrite ? " rewrite" : "");
    } else {
        std::printf("swapload: mib=%" PRIu64 " pages=%" PRIu64 " seed=%" PRIu64
                    " passes=%" PRIu64 "%s\n",
                    mib, pages, seed, passes, rewrite ? " rewrite" : "");
    }
    std::fflush(stdout);

    double t0 = now_s();
    for (std::uint64_t i = 0; i < pages; ++i) fill_page(page(i), seed, i, 0);
    double t1 = now_s();
    std::printf("swapload: write %.2f s\n", t1 - t0);
    std::fflush(stdout);
    if (inject == "zero") {
        std::memset(page(1), 0, kPage);
    } else if (inject == "other") {
        std::memcpy(page(1), page(0), kPage);
    } else if (inject == "flip") {
        page(1)[kWords - 1] ^= 1;
    }

    const double deadline = t0 + static_cast<double>(seconds);
    const std::uint64_t max_passes = seconds ? 1000000 : passes;
    Stalls& stalls = g_stalls;
    std::uint64_t gen = 0;
    std::uint64_t checks = 0;
    unsigned done = 0;  // passes started (the last may be cut short by --seconds)
    bool out_of_time = false;
    for (unsigned pass = 1; pass <= max_passes && !out_of_time; ++pass) {
        double ts = now_s();
        done = pass;
        g_pass = pass;
        // Alternate direction so that each pass walks the working set differently.
        std::uint64_t k = 0;
        for (; k < pages; ++k) {
            if (seconds && (k & 63) == 0 && now_s() >= deadline) {
                out_of_time = true;
                break;
            }
            std::uint64_t i = (pass % 2 == 1) ? k : pages - 1 - k;
            std::uint64_t expected = 0;
            const double a = boot_s();
            std::size_t w = check_page(page(i), seed, i, gen, &expected);
            stalls.add(a, boot_s() - a, i, pass);
            if (w != kWords) {
                report_mismatch(page(i), i, gen, w, expected, pages, pass);
                return 1;
            }
            ++checks;
            if (rewrite) fill_page(page(i), seed, i, gen + 1);
        }
        if (out_of_time) {
            std::printf("swapload: verify pass %u stopped at the deadline after %" PRIu64
                        " pages, %.2f s\n", pass, k, now_s() - ts);
            break;
        }
        if (rewrite) ++gen;
        std::printf("swapload: verify pass %u %.2f s\n", pass, now_s() - ts);
        std::fflush(stdout);
    }
    std::printf("swapload: total %.2f s\n", now_s() - t0);
    print_stalls(stalls);
    std::printf("swapload: OK pages=%" PRIu64 " passes=%u checks=%" PRIu64 "\n", pages, done,
                checks);
    std::fflush(stdout);
    munmap(mem, bytes);
    return 0;
}
