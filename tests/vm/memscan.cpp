// SPDX-License-Identifier: MIT
// memscan: count swapload pages in plaintext in another process's memory.
//
//   memscan --pid PID --seed S [--min-kib K]
//
// Reads every readable private mapping of PID (at least K KiB, default 1024: the memserver's slab
// pool is one large anonymous mapping) through /proc/PID/mem and counts the 4 KiB-aligned pages
// that look like a page written by `swapload --seed S`: word 1 equals S and word 0 is
// swapload's magic XOR a plausible page index (< 2^32).  The VM tests run it on the memserver
// after swapping: without dm-crypt the memserver holds such pages (the swapped-out bytes, one
// for one); with dm-crypt on the swap device it must hold none.
//
// Output: one line "memscan: pid=P seed=S pages=N scanned_mib=M mappings=K".
// Exit status: 0 scanned (whatever N is), 2 usage or system error (e.g. no permission).
// Needs to be root (or ptrace rights over PID).  No dependencies beyond libc and libstdc++.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::uint64_t kMagic = 0x5357'4150'4c4f'4144ULL;  // swapload's "SWAPLOAD"
constexpr std::size_t kChunk = 1 << 20;

[[noreturn]] void usage(const char* msg) {
    if (msg) std::fprintf(stderr, "memscan: %s\n", msg);
    std::fprintf(stderr, "usage: memscan --pid PID --seed S [--min-kib K]\n");
    std::exit(2);
}

std::uint64_t parse_u64(const char* s, int base_hint = 10) {
    std::string_view v(s);
    int base = base_hint;
    if (v.size() > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) {
        v.remove_prefix(2);
        base = 16;
    }
    std::uint64_t out = 0;
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out, base);
    if (ec != std::errc() || ptr != v.data() + v.size() || v.empty()) usage("bad number");
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::uint64_t pid = 0, seed = 0, min_kib = 1024;
    bool have_seed = false;
    for (int i = 1; i < argc; ++i) {
        std::string_view a(argv[i]);
        auto value = [&]() -> const char* {
            if (i + 1 >= argc) usage("missing value");
            return argv[++i];
        };
        if (a == "--pid") {
            pid = parse_u64(value());
        } else if (a == "--seed") {
            seed = parse_u64(value());
            have_seed = true;
        } else if (a == "--min-kib") {
            min_kib = parse_u64(value());
        } else {
            usage("unknown argument");
        }
    }
    if (pid == 0 || !have_seed) usage("--pid and --seed are required");

    const std::string maps_path = "/proc/" + std::to_string(pid) + "/maps";
    const std::string mem_path = "/proc/" + std::to_string(pid) + "/mem";
    FILE* maps = std::fopen(maps_path.c_str(), "r");
    if (!maps) {
        std::fprintf(stderr, "memscan: %s: %s\n", maps_path.c_str(), std::strerror(errno));
        return 2;
    }
    struct Range {
        std::uint64_t lo, hi;
    };
    std::vector<Range> ranges;
    char line[4096];
    while (std::fgets(line, sizeof line, maps)) {
        unsigned long long lo = 0, hi = 0;
        char perms[8] = {};
        if (std::sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) != 3) continue;
        if (perms[0] != 'r' || perms[3] != 'p') continue;       // readable, private
        if (std::strstr(line, "[vvar]") || std::strstr(line, "[vsyscall]")) continue;
        if (hi - lo < min_kib * 1024) continue;
        ranges.push_back({lo, hi});
    }
    std::fclose(maps);

    int fd = open(mem_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        std::fprintf(stderr, "memscan: %s: %s\n", mem_path.c_str(), std::strerror(errno));
        return 2;
    }
    std::vector<unsigned char> buf(kChunk);
    std::uint64_t hits = 0, scanned = 0;
    for (const Range& r : ranges) {
        for (std::uint64_t off = r.lo; off < r.hi; off += kChunk) {
            const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, r.hi - off));
            const ssize_t n = pread(fd, buf.data(), want, static_cast<off_t>(off));
            if (n <= 0) break;  // unreadable tail of a mapping: skip the rest of it
            scanned += static_cast<std::uint64_t>(n);
            for (std::size_t p = 0; p + kPage <= static_cast<std::size_t>(n); p += kPage) {
                std::uint64_t w0 = 0, w1 = 0;
                std::memcpy(&w0, buf.data() + p, 8);
                std::memcpy(&w1, buf.data() + p + 8, 8);
                if (w1 == seed && (w0 ^ kMagic) < (std::uint64_t{1} << 32)) ++hits;
            }
        }
    }
    close(fd);
    std::printf("memscan: pid=%" PRIu64 " seed=0x%" PRIx64 " pages=%" PRIu64 " scanned_mib=%" PRIu64
                " mappings=%zu\n",
                pid, seed, hits, scanned >> 20, ranges.size());
    return 0;
}
