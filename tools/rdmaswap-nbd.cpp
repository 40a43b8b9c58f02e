// SPDX-License-Identifier: MIT
// rdmaswap-nbd: attach an NBD Unix socket to /dev/nbdN over the kernel's generic-netlink "nbd"
// family with a dead-connection timeout, and hand a live device new sockets after the server
// restarted (NBD_CMD_RECONFIGURE), so that swap on /dev/nbdN survives an nbdkit restart.
//
// Contract (see docs/man/rdmaswap-nbd.8.in):
//   connect    handshake(s) (fixed newstyle, NBD_OPT_GO), then NBD_CMD_CONNECT with every socket,
//              the export's size and transmission flags, the block size, the request time-out
//              and NBD_ATTR_DEAD_CONN_TIMEOUT; then exits (the kernel holds the sockets).
//   reconnect  waits (bounded) for the server's socket, handshake(s), checks that the export
//              still matches the device (size, read-only, flush, trim, multi-conn), then
//              NBD_CMD_RECONFIGURE with the new sockets; the kernel puts each in a dead slot.
//              With --statusfile (the plugin's statusfile=), it first waits for the restarted
//              plugin to write it and refuses when the plugin took nothing over (reattached=0):
//              the device would read zeros where the kernel's swapped-out pages were.
//   disconnect NBD_CMD_DISCONNECT.
// connect and reconnect lock themselves in memory (mlockall) and set oom_score_adj -1000 first:
// they run while the swap device may be stalled, and must not need swap to finish.
// Exit status: 0 done, 1 failed (the message names the step and the errno), 2 usage.
#include <fcntl.h>
#include <linux/genetlink.h>
#include <linux/nbd-netlink.h>
#include <linux/nbd.h>
#include <linux/netlink.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/util/fd.h"

namespace {

constexpr const char *kProg = "rdmaswap-nbd";

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

// An error that names the step; caught in main, never escapes it.
struct Failure {
	std::string what;
};

[[noreturn]] void fail(const std::string &step, int err = 0)
{
	std::string m = step;
	if (err)
		m += ": " + std::string(strerrordesc_np(err) ? strerrordesc_np(err) : "unknown error") + " (errno " + std::to_string(err) + ")";
	throw Failure{m};
}

using rdmaswap::Fd;

struct Options {
	std::string command;
	std::string socket;
	std::string device;
	std::string exportname;
	std::string statusfile;
	unsigned connections = 1;
	uint64_t block_size = 4096;
	uint64_t dead_conn_timeout = 60;
	uint64_t timeout = 80;
	unsigned wait = 60;
};

// What NBD_OPT_GO told us about the export.
struct Export {
	uint64_t size = 0;
	uint16_t flags = 0;
	uint32_t min_block = 1;
	uint32_t max_block = 0;
};

// ---------------------------------------------------------------------------------------------
// NBD handshake on a Unix socket

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

// ---------------------------------------------------------------------------------------------
// Generic netlink

class Msg {
public:
	Msg(uint16_t type, uint16_t flags, uint8_t cmd, uint8_t version)
	{
		buf_.resize(NLMSG_HDRLEN + GENL_HDRLEN);
		auto *nh = reinterpret_cast<nlmsghdr *>(buf_.data());
		nh->nlmsg_type = type;
		nh->nlmsg_flags = uint16_t(NLM_F_REQUEST | NLM_F_ACK | flags);
		nh->nlmsg_seq = 1;
		auto *gh = reinterpret_cast<genlmsghdr *>(buf_.data() + NLMSG_HDRLEN);
		gh->cmd = cmd;
		gh->version = version;
	}
	void put(uint16_t type, const void *data, size_t len)
	{
		nlattr a{};
		a.nla_len = uint16_t(NLA_HDRLEN + len);
		a.nla_type = type;
		const size_t at = buf_.size();
		buf_.resize(at + NLA_ALIGN(a.nla_len));
		std::memcpy(buf_.data() + at, &a, sizeof(a));
		if (len)
			std::memcpy(buf_.data() + at + NLA_HDRLEN, data, len);
	}
	void u32(uint16_t type, uint32_t v) { put(type, &v, sizeof(v)); }
	void u64(uint16_t type, uint64_t v) { put(type, &v, sizeof(v)); }
	void str(uint16_t type, const std::string &s) { put(type, s.c_str(), s.size() + 1); }
	size_t begin_nest(uint16_t type)
	{
		const size_t at = buf_.size();
		put(uint16_t(type | NLA_F_NESTED), nullptr, 0);
		return at;
	}
	void end_nest(size_t at)
	{
		nlattr a;
		std::memcpy(&a, buf_.data() + at, sizeof(a));
		a.nla_len = uint16_t(buf_.size() - at);
		std::memcpy(buf_.data() + at, &a, sizeof(a));
	}
	std::vector<uint8_t> &finish()
	{
		reinterpret_cast<nlmsghdr *>(buf_.data())->nlmsg_len = uint32_t(buf_.size());
		return buf_;
	}

private:
	std::vector<uint8_t> buf_;
};

class Genl {
public:
	Genl()
	{
		fd_ = Fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_GENERIC));
		if (fd_.get() < 0)
			fail("netlink: socket(NETLINK_GENERIC)", errno);
		sockaddr_nl sa{};
		sa.nl_family = AF_NETLINK;
		if (::bind(fd_.get(), reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) < 0)
			fail("netlink: bind", errno);
		struct timeval tv{30, 0};
		::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	}

	// The id of the "nbd" family (registered when the nbd module is loaded).
	uint16_t nbd_family()
	{
		Msg m(GENL_ID_CTRL, 0, CTRL_CMD_GETFAMILY, 1);
		m.str(CTRL_ATTR_FAMILY_NAME, NBD_GENL_FAMILY_NAME);
		uint16_t id = 0;
		const int err = transact(m, [&](const nlattr *a) {
			if ((a->nla_type & NLA_TYPE_MASK) == CTRL_ATTR_FAMILY_ID)
				std::memcpy(&id, reinterpret_cast<const uint8_t *>(a) + NLA_HDRLEN, sizeof(id));
		});
		if (err == ENOENT)
			fail("netlink: no generic-netlink family \"nbd\" (is the nbd module loaded? modprobe nbd)", err);
		if (err)
			fail("netlink: CTRL_CMD_GETFAMILY nbd", err);
		if (!id)
			fail("netlink: CTRL_CMD_GETFAMILY nbd: no family id in the reply");
		return id;
	}

	// Sends M, calls on_attr for each top-level attribute of every reply, returns the ack's
	// errno (0 = success).
	template <typename F> int transact(Msg &m, F on_attr)
	{
		auto &b = m.finish();
		sockaddr_nl to{};
		to.nl_family = AF_NETLINK;
		if (::sendto(fd_.get(), b.data(), b.size(), 0, reinterpret_cast<sockaddr *>(&to), sizeof(to)) < 0)
			fail("netlink: sendto", errno);
		std::vector<uint8_t> rb(65536);
		for (;;) {
			ssize_t n = ::recv(fd_.get(), rb.data(), rb.size(), 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0)
				fail("netlink: waiting for the kernel's answer", errno);
			int len = int(n);
			for (auto *nh = reinterpret_cast<nlmsghdr *>(rb.data()); NLMSG_OK(nh, len); nh = NLMSG_NEXT(nh, len)) {
				if (nh->nlmsg_type == NLMSG_ERROR) {
					auto *e = static_cast<nlmsgerr *>(NLMSG_DATA(nh));
					return -e->error;
				}
				if (nh->nlmsg_type == NLMSG_DONE)
					return 0;
				const auto *p = static_cast<const uint8_t *>(NLMSG_DATA(nh)) + GENL_HDRLEN;
				int alen = int(nh->nlmsg_len) - int(NLMSG_HDRLEN + GENL_HDRLEN);
				for (auto *a = reinterpret_cast<const nlattr *>(p); alen >= int(NLA_HDRLEN) && a->nla_len >= NLA_HDRLEN && a->nla_len <= alen;
				     alen -= NLA_ALIGN(a->nla_len), a = reinterpret_cast<const nlattr *>(reinterpret_cast<const uint8_t *>(a) + NLA_ALIGN(a->nla_len)))
					on_attr(a);
			}
		}
	}

private:
	Fd fd_;
};

// ---------------------------------------------------------------------------------------------
// The device

uint32_t device_index(const std::string &dev)
{
	const std::string p = "/dev/nbd";
	if (dev.compare(0, p.size(), p) != 0 || dev.size() == p.size() || dev.size() > p.size() + 6 ||
	    dev.find_first_not_of("0123456789", p.size()) != std::string::npos)
		fail("--device must be /dev/nbdN, not '" + dev + "'");
	return uint32_t(std::stoul(dev.substr(p.size())));
}

std::optional<std::string> sysfs(uint32_t index, const std::string &rel)
{
	const std::string path = "/sys/block/nbd" + std::to_string(index) + "/" + rel;
	FILE *f = std::fopen(path.c_str(), "re");
	if (!f)
		return std::nullopt;
	char line[128] = "";
	const bool ok = std::fgets(line, sizeof(line), f) != nullptr;
	std::fclose(f);
	if (!ok)
		return std::nullopt;
	std::string s(line);
	while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
		s.pop_back();
	return s;
}

// Stays in RAM and out of the OOM killer's way while the swap device may be stalled.
void protect_self()
{
	if (::mlockall(MCL_CURRENT | MCL_FUTURE) < 0)
		fail("mlockall (a swap client must not be swapped out; needs CAP_IPC_LOCK or RLIMIT_MEMLOCK)", errno);
	Fd f(::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC));
	if (f.get() < 0 || ::write(f.get(), "-1000", 5) != 5)
		fail("setting /proc/self/oom_score_adj to -1000", errno);
}

void add_sockets(Msg &m, const std::vector<Fd> &socks)
{
	const size_t outer = m.begin_nest(NBD_ATTR_SOCKETS);
	for (const auto &s : socks) {
		const size_t item = m.begin_nest(NBD_SOCK_ITEM);
		m.u32(NBD_SOCK_FD, uint32_t(s.get()));
		m.end_nest(item);
	}
	m.end_nest(outer);
}

// What connect and reconnect share: the device, the netlink socket, negotiated sockets.
struct Attach {
	uint32_t index = 0;
	Genl nl;
	uint16_t family = 0;
	Export ex;
	std::vector<Fd> socks;
};

// Locks us in memory first, then finds the nbd family and negotiates o.connections sockets.
void prepare(const Options &o, Attach &a)
{
	a.index = device_index(o.device);
	protect_self();
	a.family = a.nl.nbd_family();
	a.socks = open_sockets(o, o.wait, a.ex);
}

int do_connect(const Options &o)
{
	Attach a;
	prepare(o, a);
	const Export &ex = a.ex;
	Genl &nl = a.nl;
	Msg m(a.family, 0, NBD_CMD_CONNECT, NBD_GENL_VERSION);
	m.u32(NBD_ATTR_INDEX, a.index);
	m.u64(NBD_ATTR_SIZE_BYTES, ex.size);
	m.u64(NBD_ATTR_BLOCK_SIZE_BYTES, o.block_size);
	m.u64(NBD_ATTR_SERVER_FLAGS, ex.flags);
	m.u64(NBD_ATTR_TIMEOUT, o.timeout);
	m.u64(NBD_ATTR_DEAD_CONN_TIMEOUT, o.dead_conn_timeout);
	m.u64(NBD_ATTR_CLIENT_FLAGS, 0);	// the device stays until `disconnect`
	add_sockets(m, a.socks);
	const int err = nl.transact(m, [](const nlattr *) {});
	if (err == EBUSY)
		fail("NBD_CMD_CONNECT " + o.device + ": the device is in use (connected already?)", err);
	if (err)
		fail("NBD_CMD_CONNECT " + o.device + " (the kernel log may say why)", err);
	std::printf("%s: %s connected: %u connection(s) to %s, %llu bytes, block size %llu, flags 0x%x, "
		    "timeout %llu s, dead-conn-timeout %llu s\n",
		    kProg, o.device.c_str(), o.connections, o.socket.c_str(), (unsigned long long)ex.size,
		    (unsigned long long)o.block_size, unsigned(ex.flags), (unsigned long long)o.timeout,
		    (unsigned long long)o.dead_conn_timeout);
	return 0;
}

// The restarted server must offer what the device was configured with.
void check_same_export(uint32_t index, const Options &o, const Export &ex)
{
	const auto sectors = sysfs(index, "size");
	if (!sectors)
		fail(o.device + ": no /sys/block/nbd" + std::to_string(index) + "/size (no such device?)");
	const uint64_t dev_size = std::stoull(*sectors) * 512;
	if (dev_size == 0)
		fail(o.device + " is not connected (size 0): use `connect`, not `reconnect`");
	if (dev_size != ex.size)
		fail("the server's export has " + std::to_string(ex.size) + " bytes, " + o.device + " has " +
		     std::to_string(dev_size) + ": refusing to reconnect to another export");
	const auto ro = sysfs(index, "ro");
	if (ro && (*ro == "1") != bool(ex.flags & NBD_FLAG_READ_ONLY))
		fail(std::string("the server's export is ") + (ex.flags & NBD_FLAG_READ_ONLY ? "read-only" : "writable") +
		     ", " + o.device + " is not: refusing to reconnect");
	const auto wc = sysfs(index, "queue/write_cache");
	if (wc && (*wc == "write back") != bool(ex.flags & NBD_FLAG_SEND_FLUSH))
		fail("the server's flush support (NBD_FLAG_SEND_FLUSH) differs from " + o.device +
		     "'s (queue/write_cache: " + *wc + "): refusing to reconnect");
	const auto dmax = sysfs(index, "queue/discard_max_bytes");
	if (dmax && (*dmax != "0") != bool(ex.flags & NBD_FLAG_SEND_TRIM))
		fail("the server's trim support (NBD_FLAG_SEND_TRIM) differs from " + o.device +
		     "'s (queue/discard_max_bytes: " + *dmax + "): refusing to reconnect");
}

// The restarted plugin's statusfile= must be written after our handshake (the plugin rewrites
// it every second; an older file may be the dead nbdkit's) and say reattached= > 0.
void check_reattached(const Options &o)
{
	timespec after{};
	::clock_gettime(CLOCK_REALTIME, &after);
	const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.wait + 5);
	for (;;) {
		struct stat st{};
		if (::stat(o.statusfile.c_str(), &st) == 0 &&
		    (st.st_mtim.tv_sec > after.tv_sec ||
		     (st.st_mtim.tv_sec == after.tv_sec && st.st_mtim.tv_nsec > after.tv_nsec))) {
			FILE *f = std::fopen(o.statusfile.c_str(), "re");
			if (!f)
				fail("reading the plugin's status file " + o.statusfile, errno);
			char line[256];
			std::optional<unsigned long long> n;
			while (std::fgets(line, sizeof(line), f))
				if (std::strncmp(line, "reattached=", 11) == 0)
					n = std::strtoull(line + 11, nullptr, 10);
			std::fclose(f);
			if (!n)
				fail("the plugin's status file " + o.statusfile + " has no reattached= line (volume= not set?)");
			if (*n == 0)
				fail("the restarted plugin took nothing over from the memservers (reattached=0 in " +
				     o.statusfile + "; lease expired, another volume=, or the memservers restarted): "
				     "the swapped-out pages are gone and the device would read zeros; refusing to reconnect");
			return;
		}
		if (std::chrono::steady_clock::now() >= deadline)
			fail("the plugin's status file " + o.statusfile + " was not rewritten within " +
			     std::to_string(o.wait + 5) + " s of the handshake (statusfile= of this nbdkit?)");
		std::this_thread::sleep_for(std::chrono::milliseconds(100));
	}
}

int do_reconnect(const Options &o)
{
	Attach a;
	prepare(o, a);
	const Export &ex = a.ex;
	check_same_export(a.index, o, ex);
	if (!o.statusfile.empty())
		check_reattached(o);
	Msg m(a.family, 0, NBD_CMD_RECONFIGURE, NBD_GENL_VERSION);
	m.u32(NBD_ATTR_INDEX, a.index);
	add_sockets(m, a.socks);
	const int err = a.nl.transact(m, [](const nlattr *) {});
	if (err == EINVAL)
		fail("NBD_CMD_RECONFIGURE " + o.device + ": the kernel refused (not connected over netlink, or "
		     "already torn down: the dead-connection timeout may have run out)", err);
	if (err)
		fail("NBD_CMD_RECONFIGURE " + o.device + " (the kernel log may say why)", err);
	std::printf("%s: %s reconfigured with %u new connection(s) to %s (%llu bytes, flags 0x%x)\n", kProg,
		    o.device.c_str(), o.connections, o.socket.c_str(), (unsigned long long)ex.size,
		    unsigned(ex.flags));
	return 0;
}

int do_disconnect(const Options &o)
{
	const uint32_t index = device_index(o.device);
	Genl nl;
	const uint16_t family = nl.nbd_family();
	Msg m(family, 0, NBD_CMD_DISCONNECT, NBD_GENL_VERSION);
	m.u32(NBD_ATTR_INDEX, index);
	const int err = nl.transact(m, [](const nlattr *) {});
	if (err)
		fail("NBD_CMD_DISCONNECT " + o.device, err);
	std::printf("%s: %s disconnected\n", kProg, o.device.c_str());
	return 0;
}

// ---------------------------------------------------------------------------------------------

int usage(FILE *out)
{
	std::fprintf(out,
		     "usage: rdmaswap-nbd connect --socket PATH --device /dev/nbdN [--connections N]\n"
		     "                    [--block-size BYTES] [--dead-conn-timeout SECONDS]\n"
		     "                    [--timeout SECONDS] [--export NAME] [--wait SECONDS]\n"
		     "       rdmaswap-nbd reconnect --socket PATH --device /dev/nbdN [--connections N]\n"
		     "                    [--export NAME] [--wait SECONDS] [--statusfile PATH]\n"
		     "       rdmaswap-nbd disconnect --device /dev/nbdN\n"
		     "  --socket PATH              the NBD server's Unix socket (nbdkit -U PATH)\n"
		     "  --device /dev/nbdN         the kernel's NBD device\n"
		     "  --connections N            sockets to hand the kernel (default 1; >1 needs\n"
		     "                             the server's NBD_FLAG_CAN_MULTI_CONN)\n"
		     "  --block-size BYTES         the device's block size (default 4096)\n"
		     "  --dead-conn-timeout SECONDS  requests wait this long for `reconnect` when every\n"
		     "                             connection is dead (default 60)\n"
		     "  --timeout SECONDS          a request unanswered this long marks its connection\n"
		     "                             dead and is requeued (default 80; 0 = never)\n"
		     "  --export NAME              the export name (default \"\")\n"
		     "  --wait SECONDS             how long to wait for the socket to accept (default 60)\n"
		     "  --statusfile PATH          reconnect: the plugin's statusfile=; refuse when the\n"
		     "                             restarted plugin took nothing over (reattached=0)\n"
		     "  --help                     this text\n"
		     "exit status: 0 done, 1 failed, 2 usage\n");
	return out == stdout ? 0 : 2;
}

bool parse_u64(const char *s, uint64_t &v, uint64_t max)
{
	if (!*s || *s == '-')
		return false;
	char *end = nullptr;
	errno = 0;
	const unsigned long long x = std::strtoull(s, &end, 10);
	if (errno || *end || x > max)
		return false;
	v = x;
	return true;
}

// 0 ok, else the exit status
int parse(int argc, char **argv, Options &o)
{
	if (argc < 2)
		return usage(stderr);
	o.command = argv[1];
	if (o.command == "--help" || o.command == "-h")
		return usage(stdout), -1;
	if (o.command != "connect" && o.command != "reconnect" && o.command != "disconnect") {
		std::fprintf(stderr, "%s: unknown command '%s'\n", kProg, argv[1]);
		return usage(stderr);
	}
	for (int i = 2; i < argc; i++) {
		const std::string a = argv[i];
		if (a == "--help")
			return usage(stdout), -1;
		if (i + 1 >= argc) {
			std::fprintf(stderr, "%s: %s needs a value (or is unknown)\n", kProg, a.c_str());
			return 2;
		}
		const char *v = argv[++i];
		uint64_t n = 0;
		bool ok = true;
		const bool any = o.command != "disconnect";
		const bool conn = o.command == "connect";
		if (a == "--socket" && any)
			o.socket = v;
		else if (a == "--device")
			o.device = v;
		else if (a == "--export" && any)
			o.exportname = v;
		else if (a == "--connections" && any)
			ok = parse_u64(v, n, 64) && n >= 1, o.connections = unsigned(n);
		else if (a == "--wait" && any)
			ok = parse_u64(v, n, 3600), o.wait = unsigned(n);
		else if (a == "--statusfile" && o.command == "reconnect")
			o.statusfile = v;
		else if (a == "--block-size" && conn)
			ok = parse_u64(v, o.block_size, 65536) && o.block_size >= 512 &&
			     !(o.block_size & (o.block_size - 1));
		else if (a == "--dead-conn-timeout" && conn)
			ok = parse_u64(v, o.dead_conn_timeout, 1000000);
		else if (a == "--timeout" && conn)
			ok = parse_u64(v, o.timeout, 1000000);
		else {
			std::fprintf(stderr, "%s: unknown option %s for %s\n", kProg, a.c_str(), o.command.c_str());
			return 2;
		}
		if (!ok) {
			std::fprintf(stderr, "%s: bad value '%s' for %s\n", kProg, v, a.c_str());
			return 2;
		}
	}
	if (o.device.empty() || (o.command != "disconnect" && o.socket.empty())) {
		std::fprintf(stderr, "%s %s: --device%s is required\n", kProg, o.command.c_str(),
			     o.command != "disconnect" ? " and --socket" : "");
		return 2;
	}
	if (o.exportname.size() > 4096) {
		std::fprintf(stderr, "%s: --export longer than 4096 bytes\n", kProg);
		return 2;
	}
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	try {
		Options o;
		if (int rc = parse(argc, argv, o))
			return rc < 0 ? 0 : rc;
		if (o.command == "connect")
			return do_connect(o);
		if (o.command == "reconnect")
			return do_reconnect(o);
		return do_disconnect(o);
	} catch (const Failure &f) {
		std::fprintf(stderr, "%s: %s\n", kProg, f.what.c_str());
	} catch (const std::exception &e) {
		std::fprintf(stderr, "%s: %s\n", kProg, e.what());
	} catch (...) {
		std::fprintf(stderr, "%s: unexpected failure\n", kProg);
	}
	return 1;
}
