// SPDX-License-Identifier: MIT
// rdmaswap-nbd: the NBD handshake on a Unix socket (nbd.h).
#include <linux/nbd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tools/rdmaswap-nbd/nbd.h"

namespace rdmaswap::nbd {

namespace {

// NBD protocol constants (doc/proto.md of the NBD project)
constexpr uint64_t kNbdMagic = 0x4e42444d41474943ULL;	 // "NBDMAGIC"
constexpr uint64_t kIHaveOpt = 0x49484156454F5054ULL;	 // "IHAVEOPT"
constexpr uint64_t kOptReplyMagic = 0x0003e889045565a9ULL;
constexpr uint16_t kFlagFixedNewstyle = 1 << 0;
constexpr uint16_t kFlagNoZeroes = 1 << 1;
constexpr uint32_t kOptGo = 7;
constexpr uint32_t kRepAck = 1;
constexpr uint32_t kRepInfo = 3;
constexpr uint32_t kRepErrBit = 1U << 31;
constexpr uint16_t kInfoExport = 0;
constexpr uint16_t kInfoBlockSize = 3;
// transmission flags this client knows; the kernel's nbd driver acts on these
constexpr uint16_t kFlagsKnown = NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY | NBD_FLAG_SEND_FLUSH |
				 NBD_FLAG_SEND_FUA | (1 << 4) /* ROTATIONAL */ | NBD_FLAG_SEND_TRIM |
				 (1 << 6) /* SEND_WRITE_ZEROES */ | (1 << 7) /* SEND_DF */ |
				 NBD_FLAG_CAN_MULTI_CONN | (1 << 9) /* SEND_RESIZE */ |
				 (1 << 10) /* SEND_CACHE */ | (1 << 11) /* SEND_FAST_ZERO */;



void write_all(int fd, const void *buf, size_t n, const char *step)
{
	auto *p = static_cast<const uint8_t *>(buf);
	while (n) {
		ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			fail(std::string("handshake: sending ") + step, errno);
		p += r;
		n -= size_t(r);
	}
}

void read_all(int fd, void *buf, size_t n, const char *step)
{
	auto *p = static_cast<uint8_t *>(buf);
	while (n) {
		ssize_t r = ::recv(fd, p, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			fail(std::string("handshake: reading ") + step, errno);
		if (r == 0)
			fail(std::string("handshake: the server closed the connection while sending ") + step);
		p += r;
		n -= size_t(r);
	}
}

uint64_t be64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}
uint32_t be32(const uint8_t *p) { return uint32_t(p[0]) << 24 | p[1] << 16 | p[2] << 8 | p[3]; }
uint16_t be16(const uint8_t *p) { return uint16_t(p[0] << 8 | p[1]); }
void put64(std::vector<uint8_t> &b, uint64_t v)
{
	for (int i = 7; i >= 0; i--)
		b.push_back(uint8_t(v >> (8 * i)));
}
void put32(std::vector<uint8_t> &b, uint32_t v)
{
	for (int i = 3; i >= 0; i--)
		b.push_back(uint8_t(v >> (8 * i)));
}
void put16(std::vector<uint8_t> &b, uint16_t v)
{
	b.push_back(uint8_t(v >> 8));
	b.push_back(uint8_t(v));
}

} // namespace

// Connects to the Unix socket PATH, retrying for up to wait_s seconds while it is missing or
// refuses (a restarting server).
Fd connect_unix(const std::string &path, unsigned wait_s)
{
	sockaddr_un sa{};
	sa.sun_family = AF_UNIX;
	if (path.size() >= sizeof(sa.sun_path))
		fail("socket path too long: " + path);
	std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
	const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
	for (;;) {
		Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
		if (fd.get() < 0)
			fail("socket(AF_UNIX)", errno);
		if (::connect(fd.get(), reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) == 0)
			return fd;
		const int err = errno;
		if ((err != ENOENT && err != ECONNREFUSED && err != EAGAIN) ||
		    std::chrono::steady_clock::now() >= deadline)
			fail("connect to " + path + (wait_s ? " (waited " + std::to_string(wait_s) + " s)" : ""), err);
		std::this_thread::sleep_for(std::chrono::milliseconds(100));
	}
}

// Fixed-newstyle handshake with NBD_OPT_GO on a connected socket. The socket is left in the
// transmission phase.
Export handshake(int fd, const std::string &exportname)
{
	struct timeval tv{30, 0};	// a server that says nothing must not hang us
	::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	uint8_t hello[18];
	read_all(fd, hello, sizeof(hello), "the greeting");
	if (be64(hello) != kNbdMagic)
		fail("handshake: not an NBD server (no NBDMAGIC)");
	if (be64(hello + 8) != kIHaveOpt)
		fail("handshake: the server is not newstyle (old-style NBD is not supported)");
	const uint16_t hflags = be16(hello + 16);
	if (!(hflags & kFlagFixedNewstyle))
		fail("handshake: the server does not offer fixed newstyle negotiation");
	const bool nozeroes = hflags & kFlagNoZeroes;
	std::vector<uint8_t> b;
	put32(b, kFlagFixedNewstyle | (nozeroes ? kFlagNoZeroes : 0));
	put64(b, kIHaveOpt);
	put32(b, kOptGo);
	put32(b, uint32_t(4 + exportname.size() + 2 + 2));
	put32(b, uint32_t(exportname.size()));
	b.insert(b.end(), exportname.begin(), exportname.end());
	put16(b, 1);
	put16(b, kInfoBlockSize);
	write_all(fd, b.data(), b.size(), "NBD_OPT_GO");

	Export ex;
	bool have_export = false;
	for (int replies = 0; replies < 64; replies++) {
		uint8_t h[20];
		read_all(fd, h, sizeof(h), "an option reply");
		if (be64(h) != kOptReplyMagic)
			fail("handshake: bad option reply magic");
		if (be32(h + 8) != kOptGo)
			fail("handshake: the reply is for option " + std::to_string(be32(h + 8)) + ", not NBD_OPT_GO");
		const uint32_t type = be32(h + 12);
		const uint32_t len = be32(h + 16);
		if (len > 65536)
			fail("handshake: option reply too long (" + std::to_string(len) + " bytes)");
		std::vector<uint8_t> data(len);
		if (len)
			read_all(fd, data.data(), len, "an option reply's data");
		if (type & kRepErrBit) {
			std::string msg(data.begin(), data.end());
			fail("handshake: the server refused NBD_OPT_GO for export '" + exportname +
			     "' (reply type 0x" + [&] { char s[16]; std::snprintf(s, sizeof(s), "%x", type); return std::string(s); }() +
			     (msg.empty() ? "" : ": " + msg) + ")");
		}
		if (type == kRepAck) {
			if (!have_export)
				fail("handshake: the server acknowledged NBD_OPT_GO without NBD_INFO_EXPORT");
			return ex;
		}
		if (type != kRepInfo || len < 2)
			continue;	// unknown reply types are allowed and ignored
		const uint16_t info = be16(data.data());
		if (info == kInfoExport) {
			if (len != 12)
				fail("handshake: NBD_INFO_EXPORT of " + std::to_string(len) + " bytes (want 12)");
			ex.size = be64(data.data() + 2);
			ex.flags = be16(data.data() + 10);
			have_export = true;
		} else if (info == kInfoBlockSize && len == 14) {
			ex.min_block = be32(data.data() + 2);
			ex.max_block = be32(data.data() + 10);
		}
	}
	fail("handshake: no NBD_REP_ACK after 64 replies");
}

// Checks what the kernel needs of an export; the flags the kernel gets are the server's.
void check_export(const Export &ex, const Options &o)
{
	if (!(ex.flags & NBD_FLAG_HAS_FLAGS))
		fail("handshake: the server's transmission flags lack NBD_FLAG_HAS_FLAGS");
	if (ex.flags & ~kFlagsKnown) {
		char s[64];
		std::snprintf(s, sizeof(s), "0x%x", unsigned(ex.flags & ~kFlagsKnown));
		fail(std::string("handshake: the server sets unknown transmission flags ") + s);
	}
	if (ex.size == 0)
		fail("handshake: the export is empty (size 0)");
	if (ex.size % o.block_size)
		fail("handshake: the export's size " + std::to_string(ex.size) +
		     " is not a multiple of the block size " + std::to_string(o.block_size));
	if (ex.min_block > o.block_size || (ex.max_block && ex.max_block < o.block_size))
		fail("handshake: block size " + std::to_string(o.block_size) +
		     " is outside the server's range " + std::to_string(ex.min_block) + ".." +
		     std::to_string(ex.max_block));
	if (o.connections > 1 && !(ex.flags & NBD_FLAG_CAN_MULTI_CONN))
		fail("handshake: --connections " + std::to_string(o.connections) +
		     " but the server does not set NBD_FLAG_CAN_MULTI_CONN");
}

// Opens and negotiates o.connections sockets; all must describe the same export.
std::vector<Fd> open_sockets(const Options &o, unsigned wait_s, Export &ex)
{
	std::vector<Fd> socks;
	for (unsigned i = 0; i < o.connections; i++) {
		Fd fd = connect_unix(o.socket, i == 0 ? wait_s : 0);
		Export e = handshake(fd.get(), o.exportname);
		check_export(e, o);
		if (i == 0)
			ex = e;
		else if (e.size != ex.size || e.flags != ex.flags)
			fail("handshake: connection " + std::to_string(i + 1) + " sees another export (size or flags differ)");
		// the kernel owns the socket's timing from now on
		struct timeval tv{0, 0};
		::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		socks.push_back(std::move(fd));
	}
	return socks;
}

} // namespace rdmaswap::nbd
