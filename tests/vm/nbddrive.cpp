// SPDX-License-Identifier: MIT
// nbddrive: drives an NBD server on a Unix socket with mixed reads and writes for the allocation
// proof in the VM (tests/alloc's drive.py needs python and libnbd, the VM has neither).
//
//   nbddrive --socket PATH [--requests N] [--warmup W] [--connections C] [--depth D]
//            [--ctl CTL:OUT[,CTL:OUT...]] [--seed S]
//   nbddrive --socket PATH --handshake-only
//
// Speaks the NBD protocol itself (nbd_wire.h: fixed newstyle, NBD_OPT_EXPORT_NAME with the empty
// name, simple replies), so it needs nothing beyond libc and the C++ standard library. It opens
// C connections (4), writes the whole device once in 128 KiB writes (so every slab exists), then
// runs W random requests per connection (warm-up: every server thread has served every kind),
// then starts counting in every process named by --ctl (writes '1' to CTL, waits for OUT to say
// "counting", see tests/alloc/alloc_counter.c), runs N random requests spread over the
// connections with D in flight on each, stops counting (writes '0', waits for "allocs=") and
// disconnects. Requests are 4 KiB, 32 KiB or 128 KiB reads or writes (each of the six equally
// likely), 4 KiB-aligned.
// Any failed request is an error. --handshake-only connects, negotiates and disconnects (the
// counter's control: a new connection makes nbdkit allocate).
//
// Output: "nbddrive: ..." lines, the last one "nbddrive: OK requests=N seconds=S ...".
// Exit status: 0 OK, 1 a request or the protocol failed, 2 usage.

#include <fcntl.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "nbd_wire.h"

namespace {

using nbdwire::connect_nbd;
using nbdwire::die;
using nbdwire::die_errno;
using nbdwire::disconnect_nbd;
using nbdwire::get_be;
using nbdwire::kCmdRead;
using nbdwire::kCmdWrite;
using nbdwire::kReplyMagic;
using nbdwire::read_full;
using nbdwire::write_full;
using nbdwire::write_iov;

constexpr std::uint32_t kSizes[] = {4096, 32 * 1024, 128 * 1024};
constexpr std::uint32_t kMaxLen = 128 * 1024;

double now_s() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

struct Op {
    std::uint16_t type;
    std::uint32_t len;
    std::uint64_t offset;
};

// One connection: a sender thread issues the requests, a receiver thread takes the replies; at
// most `depth` are in flight (one slot, and one 128 KiB buffer, each).
class Conn {
public:
    Conn(const std::string &path, unsigned depth) : depth_(depth) {
        fd_ = connect_nbd(path, &size_);
        bufs_.resize(depth);
        for (auto &b : bufs_)
            b.assign(kMaxLen, 0x5a);
        ops_.resize(depth);
        for (unsigned i = 0; i < depth; i++)
            free_.push_back(i);
    }
    std::uint64_t size() const { return size_; }

    // run: issue `count` requests from gen(i) and wait for all their replies.
    template <typename Gen>
    void run(std::uint64_t count, Gen gen) {
        std::thread rx([&] { receive(count); });
        for (std::uint64_t i = 0; i < count; i++) {
            unsigned slot;
            {
                std::unique_lock lk(mu_);
                cv_.wait(lk, [&] { return !free_.empty(); });
                slot = free_.back();
                free_.pop_back();
            }
            const Op op = gen(i);
            ops_[slot] = op;
            unsigned char req[nbdwire::kRequestLen];
            nbdwire::encode_request(req, op.type, slot, op.offset, op.len);
            iovec iov[2] = {{req, sizeof(req)}, {bufs_[slot].data(), op.len}};
            write_iov(fd_, iov, op.type == kCmdWrite ? 2 : 1);
        }
        rx.join();
    }

    void close() { disconnect_nbd(fd_); }

private:
    void receive(std::uint64_t count) {
        for (std::uint64_t i = 0; i < count; i++) {
            unsigned char rep[16];
            read_full(fd_, rep, sizeof(rep));
            if (get_be(rep, 4) != kReplyMagic)
                die("bad reply magic (structured replies are not negotiated)");
            const auto err = static_cast<std::uint32_t>(get_be(rep + 4, 4));
            const std::uint64_t slot = get_be(rep + 8, 8);
            if (slot >= depth_)
                die("reply with an unknown handle");
            const Op op = ops_[slot];
            if (err != 0) {
                std::fprintf(stderr, "nbddrive: FAIL %s of %u bytes at %llu: NBD error %u\n",
                             op.type == kCmdWrite ? "write" : "read", op.len,
                             static_cast<unsigned long long>(op.offset), err);
                std::exit(1);
            }
            if (op.type == kCmdRead)
                read_full(fd_, bufs_[slot].data(), op.len);
            done_.fetch_add(1, std::memory_order_relaxed);
            {
                std::lock_guard lk(mu_);
                free_.push_back(static_cast<unsigned>(slot));
            }
            cv_.notify_one();
        }
    }

    int fd_ = -1;
    std::uint64_t size_ = 0;
    unsigned depth_;

public:
    std::atomic<std::uint64_t> done_{0};  // replies received, for the progress lines

private:
    std::vector<std::vector<unsigned char>> bufs_;
    std::vector<Op> ops_;
    std::vector<unsigned> free_;
    std::mutex mu_;
    std::condition_variable cv_;
};

// counting(ctl, '1'|'0'): tell every counter process, wait (10 s each) for its answer.
void counting(const std::vector<std::pair<std::string, std::string>> &ctl, char c) {
    const char *want = c == '1' ? "counting" : "allocs=";
    for (const auto &[fifo, out] : ctl) {
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            die_errno(("open " + fifo).c_str());
        write_full(fd, &c, 1);
        ::close(fd);
    }
    for (const auto &[fifo, out] : ctl) {
        bool ok = false;
        for (int i = 0; i < 100 && !ok; i++) {
            char buf[16] = {};
            const int fd = ::open(out.c_str(), O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
                ::close(fd);
                ok = n > 0 && std::string_view(buf).starts_with(want);
            }
            if (!ok)
                ::usleep(100 * 1000);
        }
        if (!ok) {
            std::fprintf(stderr, "nbddrive: FAIL %s did not answer '%c' within 10 s\n",
                         out.c_str(), c);
            std::exit(1);
        }
    }
}

bool parse_u64(std::string_view s, std::uint64_t *v) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

[[noreturn]] void usage() {
    std::fprintf(stderr,
                 "usage: nbddrive --socket PATH [--requests N] [--warmup W] [--connections C]\n"
                 "                [--depth D] [--ctl CTL:OUT[,CTL:OUT...]] [--seed S]\n"
                 "       nbddrive --socket PATH --handshake-only\n");
    std::exit(2);
}

}  // namespace

int main(int argc, char **argv) {
    nbdwire::prog = "nbddrive";
    std::string sock;
    std::uint64_t requests = 100000, warmup = 1000, conns = 4, depth = 16, seed = 1;
    bool handshake_only = false;
    std::vector<std::pair<std::string, std::string>> ctl;
    for (int i = 1; i < argc; i++) {
        const std::string_view a = argv[i];
        auto val = [&]() -> std::string_view {
            if (i + 1 >= argc)
                usage();
            return argv[++i];
        };
        auto num = [&](std::uint64_t *v) {
            if (!parse_u64(val(), v))
                usage();
        };
        if (a == "--socket") {
            sock = val();
        } else if (a == "--requests") {
            num(&requests);
        } else if (a == "--warmup") {
            num(&warmup);
        } else if (a == "--connections") {
            num(&conns);
        } else if (a == "--depth") {
            num(&depth);
        } else if (a == "--seed") {
            num(&seed);
        } else if (a == "--handshake-only") {
            handshake_only = true;
        } else if (a == "--ctl") {
            std::string_view l = val();
            while (!l.empty()) {
                const auto comma = l.find(',');
                const std::string_view item = l.substr(0, comma);
                const auto colon = item.find(':');
                if (colon == std::string_view::npos)
                    usage();
                ctl.emplace_back(std::string(item.substr(0, colon)),
                                 std::string(item.substr(colon + 1)));
                l = comma == std::string_view::npos ? std::string_view() : l.substr(comma + 1);
            }
        } else {
            usage();
        }
    }
    if (sock.empty() || conns == 0 || conns > 64 || depth == 0 || depth > 256)
        usage();
    std::setvbuf(stdout, nullptr, _IOLBF, 0);

    if (handshake_only) {
        std::uint64_t size = 0;
        disconnect_nbd(connect_nbd(sock, &size));
        std::printf("nbddrive: OK handshake, size=%llu\n", static_cast<unsigned long long>(size));
        return 0;
    }

    std::vector<std::unique_ptr<Conn>> cs;
    for (std::uint64_t i = 0; i < conns; i++)
        cs.push_back(std::make_unique<Conn>(sock, static_cast<unsigned>(depth)));
    const std::uint64_t size = cs[0]->size();
    if (size < kMaxLen || size % 4096 != 0)
        die("the export is smaller than 128 KiB or not a multiple of 4 KiB");

    // The whole device once, so that every slab exists before the steady state.
    std::printf("nbddrive: %llu connections, %llu MiB; writing all of it\n",
                static_cast<unsigned long long>(conns), static_cast<unsigned long long>(size >> 20));
    double t0 = now_s();
    cs[0]->run(size / kMaxLen, [](std::uint64_t i) {
        return Op{kCmdWrite, kMaxLen, i * kMaxLen};
    });
    std::printf("nbddrive: wrote all %llu MiB in %.2f s\n",
                static_cast<unsigned long long>(size >> 20), now_s() - t0);

    // phase: n requests on every connection at once (per connection: n / conns, the first ones
    // one more), random kind, size and offset.
    auto phase = [&](std::uint64_t n, std::uint64_t salt) {
        std::vector<std::thread> ts;
        for (std::uint64_t c = 0; c < conns; c++) {
            const std::uint64_t mine = n / conns + (c < n % conns ? 1 : 0);
            ts.emplace_back([&, c, mine] {
                std::mt19937_64 rng(seed * 1000003 + salt * 1009 + c);
                cs[c]->run(mine, [&](std::uint64_t) {
                    const std::uint64_t r = rng();
                    const std::uint32_t len = kSizes[r % 3];
                    const auto type = (r >> 8) & 1 ? kCmdWrite : kCmdRead;
                    const std::uint64_t off = ((r >> 16) % ((size - len) / 4096 + 1)) * 4096;
                    return Op{type, len, off};
                });
            });
        }
        // a progress line every 10 s (a slow run under TCG is then told apart from a hang)
        std::mutex pm;
        std::condition_variable pcv;
        bool finished = false;
        std::uint64_t base = 0;
        for (auto &c : cs)
            base += c->done_.load();
        std::thread progress([&] {
            std::unique_lock lk(pm);
            const double start = now_s();
            while (!pcv.wait_for(lk, std::chrono::seconds(10), [&] { return finished; })) {
                std::uint64_t d = 0;
                for (auto &c : cs)
                    d += c->done_.load();
                std::printf("nbddrive: %llu of %llu requests after %.0f s\n",
                            static_cast<unsigned long long>(d - base),
                            static_cast<unsigned long long>(n), now_s() - start);
            }
        });
        for (auto &t : ts)
            t.join();
        {
            std::lock_guard lk(pm);
            finished = true;
        }
        pcv.notify_one();
        progress.join();
    };
    t0 = now_s();
    phase(warmup * conns, 1);
    std::printf("nbddrive: warm-up of %llu requests in %.2f s\n",
                static_cast<unsigned long long>(warmup * conns), now_s() - t0);

    if (!ctl.empty())
        counting(ctl, '1');
    t0 = now_s();
    phase(requests, 2);
    const double secs = now_s() - t0;
    if (!ctl.empty())
        counting(ctl, '0');
    for (auto &c : cs)
        c->close();
    std::printf("nbddrive: OK requests=%llu seconds=%.2f (%.0f requests/s, %.1f us each) "
                "connections=%llu depth=%llu\n",
                static_cast<unsigned long long>(requests), secs,
                static_cast<double>(requests) / secs,
                secs * 1e6 / static_cast<double>(requests),
                static_cast<unsigned long long>(conns), static_cast<unsigned long long>(depth));
    return 0;
}
