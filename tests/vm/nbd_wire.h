// SPDX-License-Identifier: MIT
// The NBD client side the VM's test tools share (nbddrive, nbdhistory): fixed newstyle
// negotiation with NBD_OPT_EXPORT_NAME on a Unix socket, simple replies, big-endian fields and
// whole-buffer socket I/O. libc and the C++ standard library only (the VM has no libnbd).
//
// Errors on the socket (the server went away, a protocol violation) are fatal: die() prints
// "<prog>: FAIL <what>" on stderr and ends the process with status 1 at once (_Exit: other
// threads may still be running). Each tool sets nbdwire::prog to its name first.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace nbdwire {

inline const char *prog = "nbd";

constexpr std::uint64_t kNbdMagic = 0x4e42444d41474943ULL;  // "NBDMAGIC"
constexpr std::uint64_t kIHaveOpt = 0x49484156454f5054ULL;  // "IHAVEOPT"
constexpr std::uint16_t kFlagFixedNewstyle = 1;
constexpr std::uint16_t kFlagNoZeroes = 2;
constexpr std::uint32_t kOptExportName = 1;
constexpr std::uint32_t kRequestMagic = 0x25609513;
constexpr std::uint32_t kReplyMagic = 0x67446698;
constexpr std::uint16_t kCmdRead = 0;
constexpr std::uint16_t kCmdWrite = 1;
constexpr std::uint16_t kCmdDisc = 2;
constexpr std::uint16_t kCmdTrim = 4;
constexpr std::uint16_t kCmdWriteZeroes = 6;
// Transmission flags (the export's, sent with its size).
constexpr std::uint16_t kSendTrim = 1u << 5;
constexpr std::uint16_t kSendWriteZeroes = 1u << 6;
constexpr std::size_t kRequestLen = 28;
constexpr std::size_t kReplyLen = 16;

inline const char *err_text(int err) {
    const char *d = ::strerrordesc_np(err);  // thread-safe, unlike strerror
    return d ? d : "unknown error";
}

[[noreturn]] inline void die(const char *what) {
    std::fprintf(stderr, "%s: FAIL %s\n", prog, what);
    std::fflush(nullptr);
    std::_Exit(1);
}

[[noreturn]] inline void die_errno(const char *what) {
    const int err = errno;
    std::fprintf(stderr, "%s: FAIL %s: %s\n", prog, what, err_text(err));
    std::fflush(nullptr);
    std::_Exit(1);
}

inline void put_be(unsigned char *p, std::uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; i--) {
        p[i] = static_cast<unsigned char>(v);
        v >>= 8;
    }
}

inline std::uint64_t get_be(const unsigned char *p, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = (v << 8) | p[i];
    return v;
}

inline void read_full(int fd, void *buf, std::size_t len) {
    auto *p = static_cast<unsigned char *>(buf);
    while (len > 0) {
        const ssize_t n = ::read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die_errno("read from the NBD socket");
        if (n == 0)
            die("the server closed the connection");
        p += n;
        len -= static_cast<std::size_t>(n);
    }
}

inline void write_iov(int fd, iovec *iov, int cnt) {
    while (cnt > 0) {
        ssize_t n = ::writev(fd, iov, cnt);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die_errno("write to the NBD socket");
        while (cnt > 0 && static_cast<std::size_t>(n) >= iov->iov_len) {
            n -= static_cast<ssize_t>(iov->iov_len);
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = static_cast<char *>(iov->iov_base) + n;
            iov->iov_len -= static_cast<std::size_t>(n);
        }
    }
}

inline void write_full(int fd, const void *buf, std::size_t len) {
    iovec iov{const_cast<void *>(buf), len};
    write_iov(fd, &iov, 1);
}

// encode_request: the 28-byte request header.
inline void encode_request(unsigned char *req, std::uint16_t type, std::uint64_t handle,
                           std::uint64_t offset, std::uint32_t len) {
    put_be(req, kRequestMagic, 4);
    put_be(req + 4, 0, 2);  // command flags
    put_be(req + 6, type, 2);
    put_be(req + 8, handle, 8);
    put_be(req + 16, offset, 8);
    put_be(req + 24, len, 4);
}

// connect_nbd: a connected, negotiated socket to the default export of the server at `path`;
// sets *size to the export size and, if tflags is given, *tflags to its transmission flags.
inline int connect_nbd(const std::string &path, std::uint64_t *size,
                       std::uint16_t *tflags = nullptr) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        die_errno("socket");
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    if (path.size() >= sizeof(sa.sun_path))
        die("socket path too long");
    std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) < 0)
        die_errno(("connect to " + path).c_str());
    unsigned char hello[18];
    read_full(fd, hello, sizeof(hello));
    if (get_be(hello, 8) != kNbdMagic || get_be(hello + 8, 8) != kIHaveOpt)
        die("the server does not speak newstyle NBD");
    const auto sflags = static_cast<std::uint16_t>(get_be(hello + 16, 2));
    if (!(sflags & kFlagFixedNewstyle))
        die("the server does not offer fixed newstyle");
    const std::uint32_t cflags = kFlagFixedNewstyle | (sflags & kFlagNoZeroes);
    unsigned char opt[20];
    put_be(opt, cflags, 4);
    put_be(opt + 4, kIHaveOpt, 8);
    put_be(opt + 12, kOptExportName, 4);
    put_be(opt + 16, 0, 4);  // the empty export name
    write_full(fd, opt, sizeof(opt));
    unsigned char info[10 + 124];
    read_full(fd, info, (cflags & kFlagNoZeroes) ? 10 : sizeof(info));
    *size = get_be(info, 8);
    if (tflags)
        *tflags = static_cast<std::uint16_t>(get_be(info + 8, 2));
    return fd;
}

// disconnect_nbd: NBD_CMD_DISC, then close.
inline void disconnect_nbd(int fd) {
    unsigned char req[kRequestLen];
    encode_request(req, kCmdDisc, 0, 0, 0);
    write_full(fd, req, sizeof(req));
    ::close(fd);
}

}  // namespace nbdwire
