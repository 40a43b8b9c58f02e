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
//
// The files: nbd.h (what they share), handshake.cpp, netlink.h, and this one (the device
// commands and the command line).
#include <fcntl.h>
#include <linux/nbd-netlink.h>
#include <linux/nbd.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

#include "tools/rdmaswap-nbd/netlink.h"
#include "tools/rdmaswap-nbd/nbd.h"

namespace {

using namespace rdmaswap::nbd;
using rdmaswap::Fd;


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
