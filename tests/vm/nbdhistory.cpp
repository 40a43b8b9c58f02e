// SPDX-License-Identifier: MIT
// nbdhistory: the history checker of "never wrong bytes" (docs/architecture.md, "The
// guarantee") for the VM, which has no python: tests/integration/helpers/history-check.py's workload and
// check in C++, speaking NBD to a server's Unix socket itself (nbd_wire.h).
//
//   nbdhistory --socket PATH [--seconds S] [--seed N] [--threads T] [--hot H]
//              [--hot-fraction F] [--slab-size BYTES] [--max-blocks N] [--mix K=W,...]
//              [--rate OPS] [--settle S] [--recovery-seconds S] [--require-recovery]
//              [--strict-atomic] [--max-print N] [--op-timeout S] [--bound S]
//              [--fault-log FILE] [--inject stale|zeros|torn]
//   nbdhistory --self-test
//
// The guarantee, per 4 KiB block:
//   - once a write has succeeded and no other write to the block is in flight, every later read
//     returns exactly its bytes;
//   - a failed write leaves the block unspecified only until the next successful write to it:
//     its effect is confined to its own interval [start, end];
//   - no read ever returns bytes never written to that block: zeros only while the block has
//     never been written successfully, or after a trim (or a zero); never torn or mixed
//     contents, never the bytes of another block.
// Formally: a successful write takes effect at one point within its interval; a failed write
// (EIO or any other error) and a trim (advisory: it may or may not zero) maybe take effect at
// one point within theirs; a successful zero is a write of zeros. A read R of a block returning
// v is legal iff v is the bytes of a write W of that block (zeros: the initial contents, a
// "successful write" at time -inf, a zero or a trim) with W.start < R.end, and there is no
// successful write W2 of that block with W.end < W2.start and W2.end < R.start.
// A read overlapping a write (or a trim, or following a failed write not yet overwritten) may
// return a byte-wise mix of the values it may return by that rule, each byte from one of them
// (a block device promises no atomicity to overlapping requests; the kernel never reads a page
// while writing it): counted as "mixed-in-flux"; --strict-atomic makes them violations. Mixed
// bytes with only one legal value, or with a byte that none of them has, are violations.
// Not checked: that two reads agree with each other.
//
// Every block written names its write: magic, run tag, block number, a unique write id, filler
// derived from those (splitmix64), and a 64-bit checksum of the rest; a read's bytes are
// compared whole with the bytes that write had. The workload, from --threads threads each with
// its own NBD connection and one request in flight: a hot set of --hot blocks takes
// --hot-fraction of the operations, so rewrites after failures are frequent; a failed write is
// written again later with new contents (as the kernel writes a re-dirtied page again); a block
// written successfully is read back a little later; trims of whole --slab-size slabs make the
// plugin give slabs back and allocate new ones (trims and zeroes only if the export offers
// them). Each operation's [start, end] (CLOCK_BOOTTIME, the clock of /proc/uptime) and result
// are recorded. After --seconds (the faulty phase) and --settle, every block whose last write
// failed is written until it succeeds, and every block of the export is read back (both within
// --recovery-seconds), all of it checked the same way.
//
// --rate caps each thread's operations per second (0: no cap). --bound S: the request bound
// the longest request is reported against (not judged). --fault-log FILE: the fault soak's
// /run/soak-faults ("N KIND DONOR PARAM T0 T1 ..." per line, uptime seconds): faults are
// counted by kind and interleaved with a violating block's history. --inject stale|zeros|torn
// (testing the checker): the export's last block is left out of the workload; a thread writes
// it twice, then, unrecorded, the first write's bytes (stale), zeros, or half of each (torn),
// and reads it: the check must report that read. --self-test checks the check on made-up
// histories (legal ones pass, each kind of wrong bytes is caught) and exits.
//
// Output: a start line, "VIOLATION: ..." lines each with the block's history, and one summary
//   nbdhistory: seed=S ops=N writes=N reads=N trims=N zeros=N failed=N eio=N (ERRNO=n,...)
//     reads-checked=N data=N zero-reads=N mixed-in-flux=N blocks=N read-back=N/M unwritten=N
//     faults=N (KIND=n,...) violations=N [first-violation-at=Ts] longest=Xs [bound=Bs
//     [OVER-BOUND]] cpu=Cs (longest: what)
// (cpu: the checker's own user + system CPU time)
// Exit status: 0 pass, 1 a violation, a request that hung for --op-timeout, no data read
// checked, or (--require-recovery) blocks not written or read back after the faults; 2 usage.

#include <sys/resource.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "nbd_wire.h"

namespace {

constexpr std::size_t kBlock = 4096;
constexpr std::size_t kSumAt = kBlock - 8;  // the checksum: the last 8 bytes
constexpr unsigned char kMagic[8] = {'R', 'S', 'W', 'H', 'I', 'S', 'T', 'C'};
constexpr std::uint64_t kZero = 0;  // the "write id" of zeros
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr unsigned kReadBackChunk = 64;  // blocks per read of the final read-back

double boot_s() {
    timespec ts{};
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

void sleep_s(double s) {
    if (s <= 0)
        return;
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(s);
    ts.tv_nsec = static_cast<long>((s - static_cast<double>(ts.tv_sec)) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

std::uint64_t mix64(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

std::uint64_t load64(const unsigned char *p) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

void store64(unsigned char *p, std::uint64_t v) { std::memcpy(p, &v, 8); }

// checksum: of the first kSumAt bytes of a block.
std::uint64_t checksum(const unsigned char *p) {
    std::uint64_t h = 0x6a09e667f3bcc908ULL;
    for (std::size_t i = 0; i < kSumAt; i += 8) {
        h ^= load64(p + i);
        h = ((h << 29) | (h >> 35)) * 0x9e3779b97f4a7c15ULL;
    }
    return mix64(h);
}

std::uint64_t g_run_tag = 0;

// make_block: the exact 4096 bytes write `wid` puts in `block`.
void make_block(std::uint64_t block, std::uint64_t wid, unsigned char *out) {
    std::memcpy(out, kMagic, 8);
    store64(out + 8, g_run_tag);
    store64(out + 16, block);
    store64(out + 24, wid);
    std::uint64_t x = mix64(g_run_tag ^ mix64(block ^ mix64(wid + 0x9e3779b97f4a7c15ULL)));
    for (std::size_t i = 32; i < kSumAt; i += 8) {
        x += 0x9e3779b97f4a7c15ULL;
        store64(out + i, mix64(x));
    }
    store64(out + kSumAt, checksum(out));
}

std::vector<unsigned char> block_bytes(std::uint64_t block, std::uint64_t wid) {
    std::vector<unsigned char> b(kBlock, 0);
    if (wid != kZero)
        make_block(block, wid, b.data());
    return b;
}

bool all_zero(const unsigned char *p) {
    for (std::size_t i = 0; i < kBlock; i += 8)
        if (load64(p + i) != 0)
            return false;
    return true;
}

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    std::vsnprintf(buf, sizeof(buf), f, ap);
    va_end(ap);
    return buf;
}

// decode_bad: nullopt if `data` is a write's bytes of `block`, "zeros", or what is wrong.
std::optional<std::string> decode_bad(std::uint64_t block, const unsigned char *data) {
    if (all_zero(data))
        return std::string("zeros");
    const std::uint64_t tag = load64(data + 8), blk = load64(data + 16), wid = load64(data + 24);
    if (std::memcmp(data, kMagic, 8) != 0) {
        int nz = 0;
        for (std::size_t i = 0; i < kBlock; i++)
            nz += data[i] != 0;
        std::string hex;
        for (int i = 0; i < 16; i++)
            hex += fmt("%02x", data[i]);
        return fmt("unknown bytes (%d of 4096 non-zero, first 16: %s)", nz, hex.c_str());
    }
    if (checksum(data) != load64(data + kSumAt))
        return fmt("torn or mixed contents (header: block %" PRIu64 " write %" PRIu64
                   "%s; checksum wrong)",
                   blk, wid, tag == g_run_tag ? "" : ", another run's tag");
    if (tag != g_run_tag)
        return fmt("bytes of another run (tag %" PRIx64 ", block %" PRIu64 " write %" PRIu64 ")",
                   tag, blk, wid);
    if (blk != block)
        return fmt("bytes of block %" PRIu64 " (write %" PRIu64 "), not of this block", blk, wid);
    unsigned char want[kBlock];
    make_block(block, wid, want);
    if (std::memcmp(data, want, kBlock) != 0)
        return fmt("write %" PRIu64 "'s header with other contents", wid);
    return std::nullopt;
}

enum class Kind : std::uint8_t { Write, Zero, Trim, Read };
enum class RKind : std::uint8_t { None, Zero, Data, Bad };

const char *kind_name(Kind k) {
    switch (k) {
    case Kind::Write: return "write";
    case Kind::Zero: return "zero";
    case Kind::Trim: return "trim";
    case Kind::Read: return "read";
    }
    return "?";
}

// One operation's event in one block's history.
struct Ev {
    double start = 0, end = 0;
    std::uint64_t value = 0;  // write: its id; zero, trim: kZero; read: the write id it returned
                              // (Data), kZero (Zero), an index into the bad reads (Bad)
    std::uint64_t op = 0;
    int result = 0;  // 0, or the errno of a failed request
    Kind kind = Kind::Read;
    RKind rkind = RKind::None;
};

struct BadRead {
    std::string why;
    std::vector<unsigned char> data;
};

// The bad reads' bytes (rare: kept whole, for the mixture check and the report).
std::mutex g_bad_mu;
std::vector<BadRead> g_bad;

std::string errno_name(int e) {
    switch (e) {
    case EIO: return "EIO";
    case ENOSPC: return "ENOSPC";
    case EPERM: return "EPERM";
    case ENOMEM: return "ENOMEM";
    case EINVAL: return "EINVAL";
    case EOVERFLOW: return "EOVERFLOW";
    case ENOTSUP: return "ENOTSUP";
    case ESHUTDOWN: return "ESHUTDOWN";
    default: return fmt("E%d", e);
    }
}

// ----- the check ----------------------------------------------------------------------------

struct Checked {
    std::uint64_t reads = 0, data = 0, zeros = 0, mixed = 0;
};

struct Finding {
    const Ev *ev;
    std::string why;
};

// mixture_of: nullopt if every byte of `data` is the byte at that place of one of `values`
// (write ids, or kZero) of `block`; else the first offset none of them explains.
std::optional<std::size_t> mixture_of(std::uint64_t block, const unsigned char *data,
                                      const std::set<std::uint64_t> &values) {
    std::vector<std::vector<unsigned char>> cands;
    for (const std::uint64_t v : values)
        cands.push_back(block_bytes(block, v));
    for (std::size_t i = 0; i < kBlock; i += 64) {
        bool whole = false;
        for (const auto &c : cands)
            whole = whole || std::memcmp(c.data() + i, data + i, 64) == 0;
        if (whole)
            continue;
        for (std::size_t j = i; j < i + 64; j++) {
            bool any = false;
            for (const auto &c : cands)
                any = any || c[j] == data[j];
            if (!any)
                return j;
        }
    }
    return std::nullopt;
}

// check_block: the reads of one block's history that break the guarantee.
std::vector<Finding> check_block(std::uint64_t block, const std::vector<Ev> &evs,
                                 const std::vector<BadRead> &bad, bool strict, Checked &checked) {
    std::vector<Finding> out;
    std::vector<const Ev *> writes;
    for (const Ev &e : evs)
        if (e.kind != Kind::Read)
            writes.push_back(&e);
    // The successful writes (and zeroes) by start; suffix_min[i]: the earliest end from the
    // i-th start on.
    std::vector<std::pair<double, double>> succ;
    for (const Ev *e : writes)
        if (e->kind != Kind::Trim && e->result == 0)
            succ.emplace_back(e->start, e->end);
    std::sort(succ.begin(), succ.end());
    std::vector<double> succ_starts;
    for (const auto &[s, e] : succ)
        succ_starts.push_back(s);
    std::vector<double> suffix_min(succ.size() + 1, kInf);
    for (std::size_t i = succ.size(); i-- > 0;)
        suffix_min[i] = std::min(succ[i].second, suffix_min[i + 1]);
    std::unordered_map<std::uint64_t, const Ev *> by_wid;
    for (const Ev *e : writes)
        if (e->kind == Kind::Write)
            by_wid[e->value] = e;
    // Zeros: the initial contents (a successful write at -inf), zeroes and trims (failed too).
    std::vector<std::pair<double, double>> zeros{{-kInf, -kInf}};
    for (const Ev *e : writes)
        if (e->value == kZero)
            zeros.emplace_back(e->start, e->end);
    std::sort(zeros.begin(), zeros.end());
    std::vector<double> zero_starts, zero_prefix_max;
    double m = -kInf;
    for (const auto &[s, e] : zeros) {
        zero_starts.push_back(s);
        m = std::max(m, e);
        zero_prefix_max.push_back(m);
    }

    // overwritten: a successful write of this block started after `after` and ended before
    // `before`.
    auto overwritten = [&](double after, double before) {
        const auto i = static_cast<std::size_t>(
            std::upper_bound(succ_starts.begin(), succ_starts.end(), after) -
            succ_starts.begin());
        return suffix_min[i] < before;
    };
    // legal_values: what a read over [start, end] may return: write ids, and kZero.
    auto legal_values = [&](double start, double end) {
        std::set<std::uint64_t> vals;
        for (const Ev *e : writes)
            if (e->start < end && !overwritten(e->end, start))
                vals.insert(e->value);
        if (!overwritten(-kInf, start))
            vals.insert(kZero);
        return vals;
    };

    for (const Ev &ev : evs) {
        if (ev.kind != Kind::Read || ev.result != 0)
            continue;
        checked.reads++;
        std::string why;
        if (ev.rkind == RKind::Bad) {
            // Mixed bytes are legal only while the block is in flux, each byte from one of the
            // values the read may return.
            const BadRead &b = bad.at(ev.value);
            const auto legal = legal_values(ev.start, ev.end);
            std::optional<std::size_t> off = 0;
            if (legal.size() > 1)
                off = mixture_of(block, b.data.data(), legal);
            if (!off && !strict) {
                checked.mixed++;
            } else {
                std::vector<std::string> names;
                for (const std::uint64_t v : legal)
                    names.push_back(v == kZero ? "zeros" : fmt("w%" PRIu64, v));
                std::sort(names.begin(), names.end());
                std::string list;
                for (std::size_t i = 0; i < names.size() && i < 8; i++)
                    list += (i ? " or " : "") + names[i];
                if (names.size() > 8)
                    list += " ...";
                why = b.why + "; it may return only " + list +
                      (off && legal.size() > 1 ? fmt(" (byte %zu is none of them)", *off)
                                               : std::string());
            }
        } else if (ev.rkind == RKind::Zero) {
            checked.zeros++;
            // The candidate that ended last among those that started before the read ended.
            const auto i = static_cast<std::size_t>(
                std::lower_bound(zero_starts.begin(), zero_starts.end(), ev.end) -
                zero_starts.begin());
            if (overwritten(zero_prefix_max[i - 1], ev.start))
                why = "zeros after a successful write, with no trim or zero since";
        } else {
            checked.data++;
            const auto it = by_wid.find(ev.value);
            if (it == by_wid.end())
                why = fmt("write %" PRIu64 "'s bytes, never written to this block", ev.value);
            else if (it->second->start >= ev.end)
                why = fmt("write %" PRIu64 "'s bytes before that write started", ev.value);
            else if (overwritten(it->second->end, ev.start))
                why = fmt("write %" PRIu64 "'s bytes (%s) after a newer successful write had "
                          "ended",
                          ev.value, it->second->result ? "it failed" : "it succeeded");
        }
        if (!why.empty())
            out.push_back({&ev, why});
    }
    return out;
}

// ----- the self-test ------------------------------------------------------------------------

int self_test() {
    g_run_tag = 0x5e1f7e57ULL;
    std::vector<BadRead> bad;
    auto W = [](double s, double e, std::uint64_t wid, int r = 0) {
        return Ev{s, e, wid, 0, r, Kind::Write, RKind::None};
    };
    auto T = [](double s, double e) { return Ev{s, e, kZero, 0, 0, Kind::Trim, RKind::None}; };
    auto Z = [](double s, double e, int r = 0) {
        return Ev{s, e, kZero, 0, r, Kind::Zero, RKind::None};
    };
    auto Rd = [](double s, double e, std::uint64_t wid) {
        return Ev{s, e, wid, 0, 0, Kind::Read, RKind::Data};
    };
    auto Rz = [](double s, double e) { return Ev{s, e, kZero, 0, 0, Kind::Read, RKind::Zero}; };
    auto Rb = [&bad](double s, double e, std::vector<unsigned char> data) {
        bad.push_back({"torn", std::move(data)});
        return Ev{s, e, bad.size() - 1, 0, 0, Kind::Read, RKind::Bad};
    };
    auto splice = [](std::uint64_t w1, std::uint64_t w2, std::size_t at) {
        auto a = block_bytes(0, w1);
        const auto b = block_bytes(0, w2);
        std::copy(b.begin() + static_cast<std::ptrdiff_t>(at), b.end(),
                  a.begin() + static_cast<std::ptrdiff_t>(at));
        return a;
    };
    const auto torn = splice(1, 2, 1000), foreign = splice(1, 5, 1000), half0 = splice(1, 0, 1000);
    struct Case {
        const char *name;
        std::vector<Ev> evs;
        std::size_t want;
    };
    const std::vector<Case> cases = {
        {"never written reads zeros", {Rz(0, 1)}, 0},
        {"last write wins", {W(0, 1, 1), W(2, 3, 2), Rd(4, 5, 2)}, 0},
        {"older write after a newer one ended", {W(0, 1, 1), W(2, 3, 2), Rd(4, 5, 1)}, 1},
        {"concurrent writes: either", {W(0, 3, 1), W(1, 2, 2), Rd(4, 5, 1), Rd(4, 5, 2)}, 0},
        {"read overlapping a write: old or new",
         {W(0, 1, 1), W(2, 5, 2), Rd(3, 4, 1), Rd(3, 4, 2)}, 0},
        {"write's bytes before it started", {W(5, 6, 1), Rd(0, 1, 1)}, 1},
        {"zeros after a write", {W(0, 1, 1), Rz(2, 3)}, 1},
        {"zeros after a trim", {W(0, 1, 1), T(2, 3), Rz(4, 5)}, 0},
        {"data after a trim (advisory)", {W(0, 1, 1), T(2, 3), Rd(4, 5, 1)}, 0},
        {"zeros after a zero", {W(0, 1, 1), Z(2, 3), Rz(4, 5)}, 0},
        {"zeros after trim then write", {T(0, 1), W(2, 3, 1), Rz(4, 5)}, 1},
        {"zeros after a failed zero (maybe)", {W(0, 1, 1), Z(2, 3, EIO), Rz(4, 5)}, 0},
        {"zeros after a failed zero's retry", {W(0, 1, 1), Z(2, 3, EIO), W(4, 5, 2), Rz(6, 7)},
         1},
        {"failed write maybe", {W(0, 1, 1), W(2, 3, 2, EIO), Rd(4, 5, 1), Rd(4, 5, 2)}, 0},
        {"failed write lands after the retry (the known defect)",
         {W(0, 1, 1), W(2, 3, 2, EIO), W(4, 5, 3), Rd(6, 7, 2)}, 1},
        {"failed write overlapping the next write",
         {W(2, 4.5, 2, EIO), W(4, 5, 3), Rd(6, 7, 2)}, 0},
        {"never written id", {W(0, 1, 1), Rd(2, 3, 7)}, 1},
        {"torn, nothing in flight", {W(0, 1, 1), Rb(2, 3, torn)}, 1},
        {"torn, overlapping the write", {W(0, 1, 1), W(2, 4, 2), Rb(3, 5, torn)}, 0},
        {"torn after a failed write", {W(0, 1, 1), W(2, 3, 2, EIO), Rb(4, 5, torn)}, 0},
        {"torn after the failed write's retry",
         {W(0, 1, 1), W(2, 3, 2, EIO), W(4, 5, 3), Rb(6, 7, torn)}, 1},
        {"torn with foreign bytes", {W(0, 1, 1), W(2, 4, 2), Rb(3, 5, foreign)}, 1},
        {"torn with zeros", {W(0, 1, 1), W(2, 4, 2), Rb(3, 5, half0)}, 1},
        {"torn with zeros while trimmed", {W(0, 1, 1), T(2, 4), Rb(3, 5, half0)}, 0},
    };
    int failed = 0, n = 0;
    for (const Case &c : cases) {
        n++;
        Checked ck;
        const std::size_t got = check_block(0, c.evs, bad, false, ck).size();
        if (got != c.want) {
            std::printf("nbdhistory: self-test FAILED: %s: %zu violations, expected %zu\n",
                        c.name, got, c.want);
            failed++;
        }
    }
    // --strict-atomic: a torn read overlapping a write is a violation too.
    {
        n++;
        Checked ck;
        const std::vector<Ev> evs = {W(0, 1, 1), W(2, 4, 2), Rb(3, 5, torn)};
        if (check_block(0, evs, bad, true, ck).size() != 1) {
            std::printf("nbdhistory: self-test FAILED: strict atomic: torn read passed\n");
            failed++;
        }
    }
    // decode
    const auto blk = [] {
        std::vector<unsigned char> b(kBlock);
        make_block(3, 9, b.data());
        return b;
    }();
    n += 2;
    if (decode_bad(3, blk.data())) {
        std::printf("nbdhistory: self-test FAILED: decode of write 9's bytes\n");
        failed++;
    }
    const std::vector<unsigned char> zero(kBlock, 0);
    if (decode_bad(3, zero.data()).value_or("") != "zeros") {
        std::printf("nbdhistory: self-test FAILED: decode of zeros\n");
        failed++;
    }
    std::vector<std::pair<const char *, std::vector<unsigned char>>> bads;
    bads.emplace_back("other block", std::vector<unsigned char>(kBlock));
    make_block(4, 9, bads.back().second.data());
    auto torn3 = blk;
    make_block(3, 10, torn3.data());
    std::copy(blk.begin(), blk.begin() + 2048, torn3.begin());
    bads.emplace_back("torn", torn3);
    auto half = blk;
    std::fill(half.begin() + 2048, half.end(), 0);
    bads.emplace_back("half zeros", half);
    std::vector<unsigned char> garbage(kBlock);
    for (std::size_t i = 0; i < kBlock; i++)
        garbage[i] = static_cast<unsigned char>(i);
    bads.emplace_back("garbage", garbage);
    const std::uint64_t tag = g_run_tag;
    g_run_tag = tag + 1;
    std::vector<unsigned char> other_run(kBlock);
    make_block(3, 9, other_run.data());
    g_run_tag = tag;
    bads.emplace_back("another run's block", other_run);
    auto flipped = blk;
    flipped[100] ^= 1;
    bads.emplace_back("one bit flipped", flipped);
    for (const auto &[name, data] : bads) {
        n++;
        const auto why = decode_bad(3, data.data());
        if (!why || *why == "zeros") {
            std::printf("nbdhistory: self-test FAILED: decode of %s passed\n", name);
            failed++;
        }
    }
    std::printf("nbdhistory: self-test: %d cases, %d failed\n", n, failed);
    return failed ? 1 : 0;
}

// ----- options ------------------------------------------------------------------------------

struct Options {
    std::string socket;
    double seconds = 30;
    std::optional<std::uint64_t> seed;
    unsigned threads = 4;
    std::uint64_t hot = 24;
    double hot_fraction = 0.8;
    std::uint64_t slab_size = 1 << 20;
    unsigned max_blocks = 8;
    std::string mix = "write=45,read=40,trim=4,slabtrim=1,zero=2";
    double rate = 0;
    double settle = 2.5;
    std::optional<double> recovery_seconds;
    bool require_recovery = false;
    bool strict_atomic = false;
    unsigned max_print = 5;
    double op_timeout = 60;
    double bound = 0;
    std::string fault_log;
    std::string inject;
    bool self_test = false;
};

[[noreturn]] void usage(const char *msg) {
    if (msg)
        std::fprintf(stderr, "nbdhistory: %s\n", msg);
    std::fprintf(
        stderr,
        "usage: nbdhistory --socket PATH [--seconds S] [--seed N] [--threads T] [--hot H]\n"
        "                  [--hot-fraction F] [--slab-size BYTES] [--max-blocks N]\n"
        "                  [--mix write=45,read=40,trim=4,slabtrim=1,zero=2] [--rate OPS]\n"
        "                  [--settle S] [--recovery-seconds S] [--require-recovery]\n"
        "                  [--strict-atomic] [--max-print N] [--op-timeout S] [--bound S]\n"
        "                  [--fault-log FILE] [--inject stale|zeros|torn]\n"
        "       nbdhistory --self-test\n");
    std::fflush(nullptr);
    std::_Exit(2);
}

std::uint64_t parse_u64(std::string_view opt, std::string_view v) {
    std::uint64_t out = 0;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out, 10);
    if (ec != std::errc() || ptr != v.data() + v.size() || v.empty()) {
        std::fprintf(stderr, "nbdhistory: %.*s needs a whole number, not '%.*s'\n",
                     static_cast<int>(opt.size()), opt.data(), static_cast<int>(v.size()),
                     v.data());
        usage(nullptr);
    }
    return out;
}

double parse_double(std::string_view opt, std::string_view v) {
    double out = 0;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    if (ec != std::errc() || ptr != v.data() + v.size() || v.empty() || !std::isfinite(out) ||
        out < 0) {
        std::fprintf(stderr, "nbdhistory: %.*s needs a number >= 0, not '%.*s'\n",
                     static_cast<int>(opt.size()), opt.data(), static_cast<int>(v.size()),
                     v.data());
        usage(nullptr);
    }
    return out;
}

Options parse(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        const std::string_view a = argv[i];
        auto val = [&]() -> std::string_view {
            if (i + 1 >= argc)
                usage(fmt("%s needs a value", argv[i]).c_str());
            return argv[++i];
        };
        if (a == "--socket") o.socket = val();
        else if (a == "--seconds") o.seconds = parse_double(a, val());
        else if (a == "--seed") o.seed = parse_u64(a, val());
        else if (a == "--threads") o.threads = static_cast<unsigned>(parse_u64(a, val()));
        else if (a == "--hot") o.hot = parse_u64(a, val());
        else if (a == "--hot-fraction") o.hot_fraction = parse_double(a, val());
        else if (a == "--slab-size") o.slab_size = parse_u64(a, val());
        else if (a == "--max-blocks") o.max_blocks = static_cast<unsigned>(parse_u64(a, val()));
        else if (a == "--mix") o.mix = val();
        else if (a == "--rate") o.rate = parse_double(a, val());
        else if (a == "--settle") o.settle = parse_double(a, val());
        else if (a == "--recovery-seconds") o.recovery_seconds = parse_double(a, val());
        else if (a == "--require-recovery") o.require_recovery = true;
        else if (a == "--strict-atomic") o.strict_atomic = true;
        else if (a == "--max-print") o.max_print = static_cast<unsigned>(parse_u64(a, val()));
        else if (a == "--op-timeout") o.op_timeout = parse_double(a, val());
        else if (a == "--bound") o.bound = parse_double(a, val());
        else if (a == "--fault-log") o.fault_log = val();
        else if (a == "--inject") o.inject = val();
        else if (a == "--self-test") o.self_test = true;
        else if (a == "-h" || a == "--help") usage(nullptr);
        else usage(fmt("unknown argument '%s'", argv[i]).c_str());
    }
    if (o.self_test)
        return o;
    if (o.socket.empty())
        usage("--socket is required");
    if (o.seconds <= 0)
        usage("--seconds must be more than 0");
    if (o.threads < 1 || o.threads > 64)
        usage("--threads must be 1..64");
    if (o.hot < 1)
        usage("--hot must be at least 1");
    if (o.hot_fraction > 1)
        usage("--hot-fraction must be 0..1");
    if (o.slab_size < kBlock || o.slab_size % kBlock != 0)
        usage("--slab-size must be a multiple of 4096");
    if (o.max_blocks < 1 || o.max_blocks > 256)
        usage("--max-blocks must be 1..256");
    if (o.op_timeout <= 0)
        usage("--op-timeout must be more than 0");
    if (!o.inject.empty() && o.inject != "stale" && o.inject != "zeros" && o.inject != "torn")
        usage("--inject must be stale, zeros or torn");
    if (!o.recovery_seconds)
        o.recovery_seconds = o.require_recovery ? 20.0 : 3.0;
    return o;
}

// ----- the workload -------------------------------------------------------------------------

const Options *g_opt = nullptr;  // main's, set before anything else runs
std::uint64_t g_seed = 0;
std::atomic<std::uint64_t> g_next_wid{1};
std::atomic<std::uint64_t> g_next_op{1};
std::atomic<bool> g_stop{false};

// pending: blocks whose last write failed -> when to write them again
std::mutex g_pending_mu;
std::map<std::uint64_t, double> g_pending;

void note_result(std::uint64_t first, std::uint64_t n, int err, double when) {
    std::lock_guard lk(g_pending_mu);
    for (std::uint64_t b = first; b < first + n; b++) {
        if (err)
            g_pending[b] = when + 0.05;
        else
            g_pending.erase(b);
    }
}

struct Rec {
    std::uint64_t block;
    Ev ev;
};

struct Stats {
    std::uint64_t count[4] = {}, ok[4] = {}, failed[4] = {};
    std::map<int, std::uint64_t> errnos;
    double longest = 0;
    std::string longest_what;
};

// One NBD connection with one request in flight, recording each operation per block.
class Client {
public:
    Client(unsigned idx, const std::string &path) : idx_(idx) {
        fd_ = nbdwire::connect_nbd(path, &size_, &tflags_);
        buf_.assign(std::max<std::size_t>(g_opt->max_blocks, kReadBackChunk) * kBlock, 0);
    }
    Client(const Client &) = delete;
    Client &operator=(const Client &) = delete;
    ~Client() {
        if (fd_ >= 0)
            ::close(fd_);
    }

    std::uint64_t size() const { return size_; }
    std::uint16_t tflags() const { return tflags_; }
    unsigned idx() const { return idx_; }

    void disconnect() {
        nbdwire::disconnect_nbd(fd_);
        fd_ = -1;
    }

    int write(std::uint64_t first, std::uint64_t n) {
        std::vector<std::uint64_t> wids(n);
        for (std::uint64_t i = 0; i < n; i++) {
            wids[i] = g_next_wid.fetch_add(1);
            make_block(first + i, wids[i], buf_.data() + i * kBlock);
        }
        const double start = boot_s();
        const int err = request(nbdwire::kCmdWrite, first, n, buf_.data());
        const double end = boot_s();
        record(first, n, Kind::Write, start, end, err, wids.data());
        return err;
    }

    // write_raw: an unrecorded write of `data` to one block (--inject: the server "returning"
    // bytes the history does not allow).
    int write_raw(std::uint64_t block, const unsigned char *data) {
        std::memcpy(buf_.data(), data, kBlock);
        return request(nbdwire::kCmdWrite, block, 1, buf_.data());
    }

    int zero(std::uint64_t first, std::uint64_t n) { return zero_or_trim(Kind::Zero, first, n); }
    int trim(std::uint64_t first, std::uint64_t n) { return zero_or_trim(Kind::Trim, first, n); }

    int read(std::uint64_t first, std::uint64_t n) {
        const double start = boot_s();
        const int err = request(nbdwire::kCmdRead, first, n, buf_.data());
        const double end = boot_s();
        const std::uint64_t op = g_next_op.fetch_add(1);
        for (std::uint64_t i = 0; i < n; i++) {
            Ev ev{start, end, 0, op, err, Kind::Read, RKind::None};
            if (!err) {
                const unsigned char *d = buf_.data() + i * kBlock;
                auto why = decode_bad(first + i, d);
                if (!why) {
                    ev.rkind = RKind::Data;
                    ev.value = load64(d + 24);
                } else if (*why == "zeros") {
                    ev.rkind = RKind::Zero;
                } else {
                    ev.rkind = RKind::Bad;
                    std::lock_guard lk(g_bad_mu);
                    g_bad.push_back({std::move(*why), std::vector<unsigned char>(d, d + kBlock)});
                    ev.value = g_bad.size() - 1;
                }
            }
            log_.push_back({first + i, ev});
        }
        count(Kind::Read, first, n, start, end, err);
        return err;
    }

    // busy_since: the start of the request in flight (0: none), for the hang check
    std::atomic<double> busy_since{0};
    std::atomic<bool> done{false};
    std::vector<Rec> log_;
    Stats stats_;

private:
    int zero_or_trim(Kind k, std::uint64_t first, std::uint64_t n) {
        const double start = boot_s();
        const int err = request(k == Kind::Zero ? nbdwire::kCmdWriteZeroes : nbdwire::kCmdTrim,
                                first, n, nullptr);
        const double end = boot_s();
        const std::vector<std::uint64_t> zeros(n, kZero);
        record(first, n, k, start, end, err, zeros.data());
        return err;
    }

    void record(std::uint64_t first, std::uint64_t n, Kind k, double start, double end, int err,
                const std::uint64_t *values) {
        const std::uint64_t op = g_next_op.fetch_add(1);
        for (std::uint64_t i = 0; i < n; i++)
            log_.push_back({first + i, Ev{start, end, values[i], op, err, k, RKind::None}});
        count(k, first, n, start, end, err);
    }

    void count(Kind k, std::uint64_t first, std::uint64_t n, double start, double end, int err) {
        const auto ki = static_cast<std::size_t>(k);
        stats_.count[ki]++;
        (err ? stats_.failed : stats_.ok)[ki]++;
        if (err)
            stats_.errnos[err]++;
        if (end - start > stats_.longest) {
            stats_.longest = end - start;
            stats_.longest_what =
                fmt("%s of %" PRIu64 " blocks at block %" PRIu64 " at uptime %.2f%s",
                    kind_name(k), n, first, start, err ? " (failed)" : "");
        }
    }

    // request: one NBD request and its reply; the server's error (0: success).
    int request(std::uint16_t type, std::uint64_t first, std::uint64_t n, unsigned char *data) {
        const std::uint64_t handle = next_handle_++;
        const auto len = static_cast<std::uint32_t>(n * kBlock);
        unsigned char req[nbdwire::kRequestLen];
        nbdwire::encode_request(req, type, handle, first * kBlock, len);
        iovec iov[2] = {{req, sizeof(req)}, {data, len}};
        busy_since.store(boot_s());
        nbdwire::write_iov(fd_, iov, type == nbdwire::kCmdWrite ? 2 : 1);
        unsigned char rep[nbdwire::kReplyLen];
        nbdwire::read_full(fd_, rep, sizeof(rep));
        if (nbdwire::get_be(rep, 4) != nbdwire::kReplyMagic)
            nbdwire::die("bad reply magic (structured replies are not negotiated)");
        if (nbdwire::get_be(rep + 8, 8) != handle)
            nbdwire::die("a reply to another request (one request is in flight)");
        const auto err = static_cast<int>(nbdwire::get_be(rep + 4, 4));
        // Simple replies: a failed read has no payload.
        if (err == 0 && type == nbdwire::kCmdRead)
            nbdwire::read_full(fd_, data, len);
        busy_since.store(0);
        return err;
    }

    unsigned idx_;
    int fd_ = -1;
    std::uint64_t size_ = 0;
    std::uint16_t tflags_ = 0;
    std::uint64_t next_handle_ = 1;
    std::vector<unsigned char> buf_;
};

struct Workload {
    std::uint64_t nblocks = 0;  // blocks the workload uses (--inject keeps the last one out)
    std::vector<std::uint64_t> hot;
    std::uint64_t slab_blocks = 1;
    std::vector<std::pair<std::string, double>> mix;  // kinds by name, cumulative weights
};
Workload g_wl;

double unit(std::mt19937_64 &rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }
std::uint64_t below(std::mt19937_64 &rng, std::uint64_t n) { return rng() % n; }
double between(std::mt19937_64 &rng, double a, double b) { return a + (b - a) * unit(rng); }

void work(Client &c) {
    std::mt19937_64 rng(g_seed * 1000003 + c.idx());
    std::vector<std::pair<double, std::uint64_t>> verify;  // (when, block): read back
    const double total = g_wl.mix.back().second;
    double next = boot_s();
    while (!g_stop.load()) {
        if (g_opt->rate > 0) {
            next += 1.0 / g_opt->rate;
            const double now = boot_s();
            if (next < now)
                next = now;
            sleep_s(next - now);
            if (g_stop.load())
                break;
        }
        const double now = boot_s();
        if (!verify.empty() && verify.front().first <= now && unit(rng) < 0.5) {
            const std::uint64_t b = verify.front().second;
            verify.erase(verify.begin());
            c.read(b, 1);
            continue;
        }
        std::optional<std::uint64_t> retry;
        if (unit(rng) < 0.5) {
            std::lock_guard lk(g_pending_mu);
            std::vector<std::uint64_t> due;
            for (const auto &[b, t] : g_pending)
                if (t <= now)
                    due.push_back(b);
            if (!due.empty()) {
                retry = due[below(rng, due.size())];
                g_pending[*retry] = now + 0.5;  // not by two threads at once, unless it is late
            }
        }
        if (retry) {
            const int err = c.write(*retry, 1);
            note_result(*retry, 1, err, boot_s());
            if (!err)
                verify.emplace_back(boot_s() + between(rng, 0.05, 0.4), *retry);
            continue;
        }
        const double pick = unit(rng) * total;
        std::string_view kind = g_wl.mix.back().first;
        for (const auto &[k, w] : g_wl.mix) {
            if (pick < w) {
                kind = k;
                break;
            }
        }
        const std::uint64_t nb = g_wl.nblocks;
        if (kind == "slabtrim") {
            const std::uint64_t nslabs = std::max<std::uint64_t>(1, nb / g_wl.slab_blocks);
            const std::uint64_t s = unit(rng) < 0.7
                                        ? g_wl.hot[below(rng, g_wl.hot.size())] / g_wl.slab_blocks
                                        : below(rng, nslabs);
            const std::uint64_t first = s * g_wl.slab_blocks;
            c.trim(first, std::min(g_wl.slab_blocks, nb - first));
            continue;
        }
        const std::uint64_t first = unit(rng) < g_opt->hot_fraction
                                        ? g_wl.hot[below(rng, g_wl.hot.size())]
                                        : below(rng, nb);
        std::uint64_t n = unit(rng) < 0.6 ? 1 : 1 + below(rng, g_opt->max_blocks);
        n = std::min(n, nb - first);
        if (kind == "write") {
            const int err = c.write(first, n);
            const double t = boot_s();
            note_result(first, n, err, t);
            if (!err && unit(rng) < 0.5)
                verify.emplace_back(t + between(rng, 0.05, 0.4), first + below(rng, n));
        } else if (kind == "read") {
            c.read(first, n);
        } else if (kind == "trim") {
            c.trim(first, n);
        } else if (kind == "zero") {
            const int err = c.zero(first, n);
            note_result(first, n, err, boot_s());
        }
        if (verify.size() > 32)
            verify.erase(verify.begin(), verify.end() - 32);
    }
}

// inject: (--inject) on the block the workload leaves alone, two recorded writes, then bytes the
// history does not allow, written unrecorded, and a recorded read that returns them.
void inject(Client &c, std::uint64_t block, double at) {
    while (!g_stop.load() && boot_s() < at)
        sleep_s(0.01);
    for (int ok = 0; ok < 2 && !g_stop.load();)
        ok += c.write(block, 1) == 0;
    std::vector<std::uint64_t> ids;  // the ids of those two writes
    for (const Rec &r : c.log_)
        if (r.block == block && r.ev.kind == Kind::Write && r.ev.result == 0)
            ids.push_back(r.ev.value);
    if (ids.size() < 2)
        return;
    const auto a = block_bytes(block, ids[ids.size() - 2]);
    auto bad = block_bytes(block, ids.back());
    if (g_opt->inject == "stale")
        bad = a;
    else if (g_opt->inject == "zeros")
        std::fill(bad.begin(), bad.end(), 0);
    else
        std::copy(a.begin(), a.begin() + kBlock / 2, bad.begin());
    while (c.write_raw(block, bad.data()) != 0 && !g_stop.load())
        sleep_s(0.05);
    std::printf("nbdhistory: injected %s bytes into block %" PRIu64 " (after w%" PRIu64
                " and w%" PRIu64 ") at uptime %.3f\n",
                g_opt->inject.c_str(), block, ids[ids.size() - 2], ids.back(), boot_s());
    std::fflush(stdout);
    c.read(block, 1);
}

// ----- the report ---------------------------------------------------------------------------

struct Fault {
    double t0, t1;
    std::string what;
};

std::vector<Fault> read_faults(const std::string &path,
                               std::map<std::string, std::uint64_t> &by_kind) {
    std::vector<Fault> out;
    if (path.empty())
        return out;
    std::FILE *f = std::fopen(path.c_str(), "re");
    if (!f) {
        std::fprintf(stderr, "nbdhistory: cannot read %s: %s\n", path.c_str(),
                     nbdwire::err_text(errno));
        return out;
    }
    char line[512];
    while (std::fgets(line, sizeof(line), f)) {
        unsigned long long n = 0, donor = 0;
        char kind[32], param[64];
        double t0 = 0, t1 = 0;
        if (std::sscanf(line, "%llu %31s %llu %63s %lf %lf", &n, kind, &donor, param, &t0, &t1) !=
            6)
            continue;
        by_kind[kind]++;
        out.push_back({t0, t1, fmt("fault %llu: %s of donor %llu (param %s)", n, kind, donor,
                                   param)});
    }
    std::fclose(f);
    return out;
}

std::string describe(const Ev &e, double t0) {
    std::string what = kind_name(e.kind);
    if (e.kind == Kind::Write)
        what += fmt(" w%" PRIu64, e.value);
    if (e.kind == Kind::Read && e.result == 0) {
        if (e.rkind == RKind::Zero)
            what += " -> zeros";
        else if (e.rkind == RKind::Data)
            what += fmt(" -> w%" PRIu64, e.value);
        else
            what += " -> " + g_bad.at(e.value).why;
    }
    if (e.result)
        what += " FAILED " + errno_name(e.result);
    return fmt("  [%9.4f, %9.4f] op %-7" PRIu64 " ", e.start - t0, e.end - t0, e.op) + what;
}

void print_history(std::uint64_t block, const Ev &bad_read, const std::vector<Ev> &evs,
                   const std::vector<Fault> &faults, double t0) {
    double lo = bad_read.start - 1.0;
    if (bad_read.rkind == RKind::Data)
        for (const Ev &e : evs)
            if (e.kind == Kind::Write && e.value == bad_read.value)
                lo = e.start - 0.05;
    const double hi = bad_read.end + 0.05;
    struct Line {
        double t;
        std::string text;
        bool keep;  // not a read, or the violating one
    };
    std::vector<Line> lines;
    for (const Ev &e : evs)
        if (lo <= e.end && e.start <= hi)
            lines.push_back({e.start, describe(e, t0),
                             e.kind != Kind::Read || e.op == bad_read.op});
    for (const Fault &f : faults) {
        if (f.t1 < lo || f.t0 > hi)
            continue;
        if (f.t0 >= lo)
            lines.push_back({f.t0, fmt("  [%9.4f]            ", f.t0 - t0) + f.what + " begins",
                             true});
        else
            lines.push_back({lo, fmt("  [%9.4f]            ", lo - t0) + f.what +
                                     fmt(" in progress (since %.4f)", f.t0 - t0),
                             true});
        if (f.t1 <= hi)
            lines.push_back({f.t1, fmt("  [%9.4f]            ", f.t1 - t0) + f.what + " ends",
                             true});
    }
    std::stable_sort(lines.begin(), lines.end(),
                     [](const Line &a, const Line &b) { return a.t < b.t; });
    if (lines.size() > 60) {  // the reads in between only where they are the last ones
        std::vector<Line> keep;
        for (std::size_t i = 0; i + 20 < lines.size(); i++)
            if (lines[i].keep)
                keep.push_back(lines[i]);
        keep.insert(keep.end(), lines.end() - 20, lines.end());
        if (keep.size() > 60) {
            std::vector<Line> k2{keep.front()};
            k2.insert(k2.end(), keep.end() - 59, keep.end());
            keep.swap(k2);
        }
        lines.swap(keep);
    }
    std::printf("  history of block %" PRIu64 " (times in s since the start at uptime %.3f; "
                "faults interleaved):\n",
                block, t0);
    for (const Line &l : lines)
        std::printf("%s\n", l.text.c_str());
}

int run() {
    g_seed = g_opt->seed.value_or(std::random_device{}());
    g_run_tag = mix64(g_seed ^ mix64(static_cast<std::uint64_t>(getpid()) ^
                                     mix64(static_cast<std::uint64_t>(boot_s() * 1e9))));

    std::vector<std::unique_ptr<Client>> clients;
    for (unsigned i = 0; i < g_opt->threads + (g_opt->inject.empty() ? 0 : 1); i++)
        clients.push_back(std::make_unique<Client>(i, g_opt->socket));
    const std::uint64_t nblocks = clients[0]->size() / kBlock;
    const bool can_trim = clients[0]->tflags() & nbdwire::kSendTrim;
    const bool can_zero = clients[0]->tflags() & nbdwire::kSendWriteZeroes;
    g_wl.nblocks = nblocks - (g_opt->inject.empty() ? 0 : 1);
    if (g_wl.nblocks < 2)
        nbdwire::die("the export is too small (fewer than 2 blocks for the workload)");

    // the mix, without what the export cannot do
    std::string_view l = g_opt->mix;
    double cum = 0;
    while (!l.empty()) {
        const auto comma = l.find(',');
        const std::string_view item = l.substr(0, comma);
        l = comma == std::string_view::npos ? std::string_view() : l.substr(comma + 1);
        const auto eq = item.find('=');
        const std::string k(item.substr(0, eq));
        if (eq == std::string_view::npos ||
            (k != "write" && k != "read" && k != "trim" && k != "slabtrim" && k != "zero"))
            usage(fmt("--mix: '%.*s' is not write|read|trim|slabtrim|zero=WEIGHT",
                      static_cast<int>(item.size()), item.data())
                      .c_str());
        const double w = parse_double("--mix", item.substr(eq + 1));
        if (((k == "trim" || k == "slabtrim") && !can_trim) || (k == "zero" && !can_zero) ||
            w <= 0)
            continue;
        cum += w;
        g_wl.mix.emplace_back(k, cum);
    }
    if (g_wl.mix.empty())
        usage("--mix leaves nothing to do");
    std::mt19937_64 master(g_seed);
    std::set<std::uint64_t> hot;
    const std::uint64_t nhot = std::min(g_opt->hot, g_wl.nblocks);
    while (hot.size() < nhot)
        hot.insert(below(master, g_wl.nblocks));
    g_wl.hot.assign(hot.begin(), hot.end());
    g_wl.slab_blocks = std::max<std::uint64_t>(1, g_opt->slab_size / kBlock);

    std::printf("nbdhistory: seed=%" PRIu64 " socket=%s seconds=%g threads=%u hot=%zu "
                "blocks=%" PRIu64 " trim=%s zero=%s rate=%g%s%s\n",
                g_seed, g_opt->socket.c_str(), g_opt->seconds, g_opt->threads, g_wl.hot.size(),
                nblocks, can_trim ? "yes" : "no", can_zero ? "yes" : "no", g_opt->rate,
                g_opt->inject.empty() ? "" : " inject=", g_opt->inject.c_str());
    std::fflush(stdout);

    const double t0 = boot_s();
    std::vector<std::thread> threads;
    for (auto &cp : clients) {
        Client *c = cp.get();
        if (c->idx() < g_opt->threads)
            threads.emplace_back([c] {
                work(*c);
                c->done.store(true);
            });
        else
            threads.emplace_back([c, nblocks, t0] {
                inject(*c, nblocks - 1, t0 + g_opt->seconds / 3);
                c->done.store(true);
            });
    }
    sleep_s(t0 + g_opt->seconds - boot_s());
    g_stop.store(true);
    const double t_stop = boot_s();

    // Every thread ends within --op-timeout; one that does not is a hang (not joined: it may
    // be stuck in the kernel; its history is left out of the check).
    std::vector<std::string> hangs;
    std::vector<bool> joined(clients.size(), false);
    for (std::size_t i = 0; i < clients.size(); i++) {
        while (!clients[i]->done.load() && boot_s() < t_stop + g_opt->op_timeout)
            sleep_s(0.05);
        if (clients[i]->done.load()) {
            threads[i].join();
            joined[i] = true;
        } else {
            const double since = clients[i]->busy_since.load();
            hangs.push_back(fmt("a request of thread %zu hung for more than %g s (in flight "
                                "since uptime %.2f)",
                                i, g_opt->op_timeout, since));
            threads[i].detach();
        }
    }

    // Quiescent phase, on a new connection: every block whose last write failed is written
    // until it succeeds (the kernel's rewrite of a re-dirtied page), then every block is read
    // back; both bounded in time (a slab that lost every replica fails with EIO for good, which
    // is allowed: not wrong bytes).
    std::uint64_t unwritten = 0, final_failed = 0;
    auto fin = std::make_unique<Client>(static_cast<unsigned>(clients.size()), g_opt->socket);
    if (hangs.empty()) {
        sleep_s(g_opt->settle);
        std::vector<std::uint64_t> todo;
        {
            std::lock_guard lk(g_pending_mu);
            for (const auto &[b, t] : g_pending)
                todo.push_back(b);
        }
        double deadline = boot_s() + *g_opt->recovery_seconds;
        for (const std::uint64_t b : todo) {
            while (fin->write(b, 1) != 0) {
                if (boot_s() > deadline) {
                    unwritten++;
                    break;
                }
                sleep_s(0.2);
            }
        }
        deadline = boot_s() + *g_opt->recovery_seconds;
        for (std::uint64_t first = 0; first < nblocks; first += kReadBackChunk) {
            const std::uint64_t n = std::min<std::uint64_t>(kReadBackChunk, nblocks - first);
            while (fin->read(first, n) != 0) {
                if (boot_s() > deadline) {
                    final_failed += n;
                    break;
                }
                sleep_s(0.2);
            }
        }
        fin->disconnect();
        for (std::size_t i = 0; i < clients.size(); i++)
            if (joined[i])
                clients[i]->disconnect();
    }

    // The check. (A hung thread that wakes up waits for this lock before it adds a bad read.)
    std::unique_lock bad_lock(g_bad_mu);
    std::map<std::uint64_t, std::vector<Ev>> history;
    Stats total;
    auto merge = [&](const Client &c) {
        for (const Rec &r : c.log_)
            history[r.block].push_back(r.ev);
        for (int k = 0; k < 4; k++) {
            total.count[k] += c.stats_.count[k];
            total.ok[k] += c.stats_.ok[k];
            total.failed[k] += c.stats_.failed[k];
        }
        for (const auto &[e, n] : c.stats_.errnos)
            total.errnos[e] += n;
        if (c.stats_.longest > total.longest) {
            total.longest = c.stats_.longest;
            total.longest_what = c.stats_.longest_what;
        }
    };
    for (std::size_t i = 0; i < clients.size(); i++)
        if (joined[i])
            merge(*clients[i]);
    merge(*fin);
    Checked checked;
    struct Violation {
        std::uint64_t block;
        Ev ev;
        std::string why;
    };
    std::vector<Violation> violations;
    for (const auto &[block, evs] : history)
        for (auto &f : check_block(block, evs, g_bad, g_opt->strict_atomic, checked))
            violations.push_back({block, *f.ev, std::move(f.why)});
    std::sort(violations.begin(), violations.end(),
              [](const Violation &a, const Violation &b) { return a.ev.start < b.ev.start; });

    std::map<std::string, std::uint64_t> fault_kinds;
    const auto faults = read_faults(g_opt->fault_log, fault_kinds);
    for (const std::string &h : hangs)
        std::printf("VIOLATION: %s\n", h.c_str());
    std::set<std::pair<std::uint64_t, std::pair<RKind, std::uint64_t>>> shown;
    for (const Violation &v : violations) {
        const auto key = std::make_pair(
            v.block, std::make_pair(v.ev.rkind, v.ev.rkind == RKind::Bad ? 0 : v.ev.value));
        if (shown.count(key))
            continue;
        if (shown.size() >= g_opt->max_print) {
            std::printf("... and more: %zu violations in all\n", violations.size());
            break;
        }
        shown.insert(key);
        std::printf("VIOLATION: block %" PRIu64 ": read op %" PRIu64
                    " at uptime %.3f returned %s\n",
                    v.block, v.ev.op, v.ev.start, v.why.c_str());
        print_history(v.block, v.ev, history[v.block], faults, t0);
    }

    const std::uint64_t ops = total.count[0] + total.count[1] + total.count[2] + total.count[3];
    const std::uint64_t failed =
        total.failed[0] + total.failed[1] + total.failed[2] + total.failed[3];
    std::string errs, fks;
    for (const auto &[e, n] : total.errnos)
        errs += fmt("%s%s=%" PRIu64, errs.empty() ? "" : ",", errno_name(e).c_str(), n);
    std::uint64_t nfaults = 0;
    for (const auto &[k, n] : fault_kinds) {
        fks += fmt("%s%s=%" PRIu64, fks.empty() ? "" : ",", k.c_str(), n);
        nfaults += n;
    }
    const auto eio = total.errnos.count(EIO) ? total.errnos[EIO] : 0;
    std::string tail;
    if (!violations.empty())
        tail += fmt(" first-violation-at=%.1fs", violations.front().ev.start - t0);
    tail += fmt(" longest=%.3fs", total.longest);
    if (g_opt->bound > 0)
        tail += fmt(" bound=%gs%s", g_opt->bound, total.longest > g_opt->bound ? " OVER-BOUND" : "");
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    tail += fmt(" cpu=%.1fs",
                static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                    static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    tail += " (longest: " + (total.longest_what.empty() ? "-" : total.longest_what) + ")";
    std::printf("nbdhistory: seed=%" PRIu64 " ops=%" PRIu64 " writes=%" PRIu64 " reads=%" PRIu64
                " trims=%" PRIu64 " zeros=%" PRIu64 " failed=%" PRIu64 " eio=%" PRIu64
                " (%s) reads-checked=%" PRIu64 " data=%" PRIu64 " zero-reads=%" PRIu64
                " mixed-in-flux=%" PRIu64 " blocks=%zu read-back=%" PRIu64 "/%" PRIu64
                " unwritten=%" PRIu64 " faults=%" PRIu64 " (%s) violations=%zu%s\n",
                g_seed, ops, total.count[0], total.count[3], total.count[2], total.count[1],
                failed, eio, errs.empty() ? "-" : errs.c_str(), checked.reads, checked.data,
                checked.zeros, checked.mixed, history.size(),
                hangs.empty() ? nblocks - final_failed : 0, nblocks, unwritten, nfaults,
                fks.empty() ? "-" : fks.c_str(), violations.size() + hangs.size(), tail.c_str());
    std::fflush(stdout);
    int rc = 0;
    if (!violations.empty() || !hangs.empty())
        rc = 1;
    if (rc == 0 && (final_failed || unwritten) && g_opt->require_recovery) {
        std::printf("nbdhistory: FAIL: after the faults stopped, %" PRIu64
                    " blocks could not be read back and %" PRIu64 " could not be written\n",
                    final_failed, unwritten);
        rc = 1;
    }
    if (rc == 0 && checked.data == 0) {
        std::printf("nbdhistory: FAIL: no read returned written data: nothing was checked\n");
        rc = 1;
    }
    std::fflush(nullptr);
    // Hung threads are not joined: end without destroying them.
    std::_Exit(rc);
}

}  // namespace

int main(int argc, char **argv) {
    nbdwire::prog = "nbdhistory";
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const Options opt = parse(argc, argv);
    g_opt = &opt;
    if (opt.self_test)
        return self_test();
    return run();
}
