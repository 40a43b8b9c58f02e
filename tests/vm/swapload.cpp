// SPDX-License-Identifier: MIT
// swapload: the VM swap workload.
//
//   swapload --mib N [--seed S] [--passes P] [--rewrite] [--thp]
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
// --thp:     allow transparent huge pages (default: MADV_NOHUGEPAGE, plain 4 KiB pages).
// --inject zero|other|flip: self-test of the checker: damage page 1 after writing (zero it, copy
//            page 0 over it, flip one bit) so that the verify pass must report a MISMATCH.
//
// Output: progress lines "swapload: ..." and finally exactly one of
//   swapload: OK pages=N passes=P
//   swapload: MISMATCH page=I ...
// Exit status: 0 OK, 1 mismatch, 2 usage or system error.
// No dependencies beyond the C++ standard library and POSIX.

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

[[noreturn]] void usage(const char* msg) {
    if (msg) std::fprintf(stderr, "swapload: %s\n", msg);
    std::fprintf(stderr,
                 "usage: swapload --mib N [--seed S] [--passes P] [--rewrite] [--thp]\n"
                 "                [--inject zero|other|flip]\n"
                 "  writes N MiB of per-page pseudo-random content, verifies it P times "
                 "(default 2)\n");
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
    auto page = [&](std::uint64_t i) { return base + i * kWords; };

    std::printf("swapload: mib=%" PRIu64 " pages=%" PRIu64 " seed=%" PRIu64 " passes=%" PRIu64
                "%s\n",
                mib, pages, seed, passes, rewrite ? " rewrite" : "");
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

    std::uint64_t gen = 0;
    for (unsigned pass = 1; pass <= passes; ++pass) {
        double ts = now_s();
        // Alternate direction so that each pass walks the working set differently.
        for (std::uint64_t k = 0; k < pages; ++k) {
            std::uint64_t i = (pass % 2 == 1) ? k : pages - 1 - k;
            std::uint64_t expected = 0;
            std::size_t w = check_page(page(i), seed, i, gen, &expected);
            if (w != kWords) {
                report_mismatch(page(i), i, gen, w, expected, pages, pass);
                return 1;
            }
            if (rewrite) fill_page(page(i), seed, i, gen + 1);
        }
        if (rewrite) ++gen;
        std::printf("swapload: verify pass %u %.2f s\n", pass, now_s() - ts);
        std::fflush(stdout);
    }
    std::printf("swapload: total %.2f s\n", now_s() - t0);
    std::printf("swapload: OK pages=%" PRIu64 " passes=%" PRIu64 "\n", pages, passes);
    std::fflush(stdout);
    munmap(mem, bytes);
    return 0;
}
