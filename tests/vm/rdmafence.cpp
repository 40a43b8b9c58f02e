// SPDX-License-Identifier: MIT
// The RDMA fence's regression run (issue 25, defect 1; docs/architecture.md "A failed write's
// outcome"): two data paths A and B of one memserver session over Soft-RoCE, and tc on the
// client's link holding A's packets to the memserver (its QP number in the RoCE v2 BTH) and the
// CM's DREQs in a netem delay, so that A's WRITE of 0xbb times out and reaches the memserver
// late. A newer WRITE of 0xcc through B is acknowledged meanwhile; once everything held has been
// delivered, a read must return 0xcc (or fail), never 0xbb.
//
//   eager:    the plugin's QP for A is fenced by A's immediate reconnect (its connect names it)
//   deferred: connect requests are dropped too, so that fence fails; B's write must then fail
//             (it may not go out while A's QP is unfenced), and succeed once connects pass
//             again (its reconnect names A's QP)
//
// Needs root, iproute2's tc (sch_prio, sch_netem, cls_u32), and a memserver reached through DEV
// (guest-init.sh's fence run sets that up). Exit 0 pass, 1 fail, 2 usage.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/obs/log.h"
#include "common/transport/rdma/client.h"
#include "common/transport/remote_server.h"
#include "common/util/config.h"
#include "common/util/deadline.h"
#include "common/util/err_text.h"
#include "common/wire/auth.h"

extern char **environ;

using namespace rdmaswap;
using Ms = std::chrono::milliseconds;

namespace {

struct Options {
	Endpoint server;
	std::string key_file;
	std::string dev;
	std::string tc = "/usr/sbin/tc";
	Ms timeout{1000};
	Ms delay{6000};
	std::vector<std::string> scenarios{"eager", "deferred"};
};

constexpr uint32_t kPage = 4096;

void say(const std::string &s)
{
	std::printf("rdmafence: %s\n", s.c_str());
	std::fflush(stdout);
}

double secs_since(Clock::time_point t0)
{
	return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt_s(double s)
{
	char b[32];
	std::snprintf(b, sizeof b, "%.2f s", s);
	return b;
}

// Runs `args` (no shell), waits for it. Its exit status, or -1.
int run(const std::vector<std::string> &args, bool quiet = false)
{
	std::vector<char *> argv;
	for (const auto &a : args)
		argv.push_back(const_cast<char *>(a.c_str()));
	argv.push_back(nullptr);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	if (quiet) // (what it says when there is nothing to delete)
		posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	pid_t pid = 0;
	const int sp = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
	posix_spawn_file_actions_destroy(&fa);
	if (sp != 0)
		return -1;
	int st = 0;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	const int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	if (rc && !quiet) {
		std::string line;
		for (const auto &a : args)
			line += (line.empty() ? "" : " ") + a;
		say("command failed (" + std::to_string(rc) + "): " + line);
	}
	return rc;
}

// The qdisc and filters on DEV's egress: band 1:2 passes, 1:3 and 1:5 are netem delays (A's
// packets; DREQs), 1:4 drops.
class Hold {
public:
	explicit Hold(const Options &o) : o_(o) {}
	~Hold() { remove(); }
	Hold(const Hold &) = delete;
	Hold &operator=(const Hold &) = delete;

	// Delay the RoCE v2 packets to the memserver's QP `qpn` and every CM DREQ (a MAD to QP 1,
	// attribute 0x0015): the QP stays in RTS at the memserver until the held packets are in.
	bool install(uint32_t qpn)
	{
		run({o_.tc, "qdisc", "del", "dev", o_.dev, "root"}, true);
		installed_ = true;
		char q[16];
		std::snprintf(q, sizeof q, "0x%08x", qpn);
		return tc({"qdisc", "add", "dev", o_.dev, "root", "handle", "1:", "prio", "bands", "5",
			   "priomap", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1", "1",
			   "1", "1"}) &&
		       tc({"qdisc", "add", "dev", o_.dev, "parent", "1:3", "handle", "30:", "netem",
			   "delay", std::to_string(o_.delay.count()) + "ms", "limit", "100000"}) &&
		       tc({"qdisc", "add", "dev", o_.dev, "parent", "1:4", "handle", "40:", "netem",
			   "loss", "100%"}) &&
		       tc({"qdisc", "add", "dev", o_.dev, "parent", "1:5", "handle", "50:", "netem",
			   "delay", std::to_string(o_.delay.count()) + "ms", "limit", "100000"}) &&
		       // BTH at byte 28 of the IP packet (20 IP + 8 UDP); its destination QP in bytes
		       // 5-7: the low 24 bits of the word at 32.
		       tc({"filter", "add", "dev", o_.dev, "parent", "1:", "protocol", "ip", "prio", "1",
			   "u32", "match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", "4791",
			   "0xffff", "match", "u32", q, "0x00ffffff", "at", "32", "flowid", "1:3"}) &&
		       // QP 1's MADs: BTH 12 + DETH 8, then the MAD header, its attribute id at 16.
		       tc(cm_filter("1", "0x0015", "1:5"));
	}
	// Drop every CM connect request (attribute 0x0010): connects fail until allow_connects().
	bool drop_connects() { return tc(cm_filter("2", "0x0010", "1:4")); }
	bool allow_connects()
	{
		return tc({"filter", "del", "dev", o_.dev, "parent", "1:", "protocol", "ip", "prio",
			   "2"});
	}
	// A's packets the delay let through so far (tc -s qdisc: its netem's), -1 if unknown.
	long held()
	{
		const std::string cmd = o_.tc + " -s qdisc show dev " + o_.dev;
		FILE *f = popen(cmd.c_str(), "r");
		if (!f)
			return -1;
		char line[512];
		bool in30 = false;
		long pkts = -1;
		while (std::fgets(line, sizeof line, f)) {
			if (std::strncmp(line, "qdisc ", 6) == 0)
				in30 = std::strstr(line, " 30: ") != nullptr;
			else if (in30 && pkts < 0)
				if (const char *s = std::strstr(line, "Sent "))
					if (const char *b = std::strstr(s, " bytes "))
						pkts = std::strtol(b + 7, nullptr, 10);
		}
		pclose(f);
		return pkts;
	}
	void remove()
	{
		if (installed_)
			run({o_.tc, "qdisc", "del", "dev", o_.dev, "root"}, true);
		installed_ = false;
	}

private:
	std::vector<std::string> cm_filter(const char *prio, const char *attr, const char *flow)
	{
		return {"filter", "add", "dev", o_.dev, "parent", "1:", "protocol", "ip", "prio", prio,
			"u32", "match", "ip", "protocol", "17", "0xff", "match", "ip", "dport", "4791",
			"0xffff", "match", "u32", "0x00000001", "0x00ffffff", "at", "32", "match", "u16",
			attr, "0xffff", "at", "64", "flowid", flow};
	}
	bool tc(std::vector<std::string> args)
	{
		args.insert(args.begin(), o_.tc);
		return run(args) == 0;
	}

	const Options &o_;
	bool installed_ = false;
};

struct Session {
	std::unique_ptr<rdma::ClientContext> ctx;
	std::unique_ptr<RemoteServer> server;
	std::vector<std::byte> region;
	std::unique_ptr<DataPath> a, b;
	SlabGrant slab;
};

// One page at `off` of the slab through `p`: written full of `v`, or read into the region's
// second page. 0 or the errno.
int write_page(Session &s, DataPath &p, uint64_t off, uint8_t v)
{
	std::memset(s.region.data(), v, kPage);
	if (int err = p.post_write(s.slab, off, kPage, s.region.data())) {
		p.complete();
		return err;
	}
	return p.complete();
}

int read_page(Session &s, DataPath &p, uint64_t off, int &value)
{
	std::byte *dst = s.region.data() + kPage;
	std::memset(dst, 0x5a, kPage);
	if (int err = p.post_read(s.slab, off, kPage, dst)) {
		p.complete();
		return err;
	}
	if (int err = p.complete())
		return err;
	value = int(dst[0]);
	for (uint32_t i = 1; i < kPage; i++)
		if (dst[i] != dst[0]) {
			value = -1; // torn
			break;
		}
	return 0;
}

// `op` until it returns 0 or `within` has passed (the path's reconnect backoff).
template <typename Op>
int retry(Ms within, Op op)
{
	const auto until = Clock::now() + within;
	for (;;) {
		const int err = op();
		if (err == 0 || Clock::now() >= until)
			return err;
		std::this_thread::sleep_for(Ms(200));
	}
}

std::string byte_name(int v)
{
	if (v < 0)
		return "a torn page";
	char b[16];
	std::snprintf(b, sizeof b, "0x%02x", unsigned(v));
	return b;
}

// One scenario on page `off`. True if it passed.
bool scenario(const Options &o, Session &s, const std::string &name, uint64_t off)
{
	const bool deferred = name == "deferred";
	say("--- " + name + ": page at " + std::to_string(off) + " ---");
	// Both paths up, the page 0xaa.
	if (int err = retry(Ms(5000), [&] { return write_page(s, *s.b, off, 0xaa); })) {
		say("FAIL: writing 0xaa through B: " + std::string(err_text(err)));
		return false;
	}
	int v = 0;
	if (int err = retry(Ms(5000), [&] { return read_page(s, *s.a, off, v); }); err || v != 0xaa) {
		say("FAIL: reading 0xaa back through A: " +
		    (err ? std::string(err_text(err)) : byte_name(v)));
		return false;
	}
	const uint32_t qa = rdma::remote_qp_num(*s.a), qb = rdma::remote_qp_num(*s.b);
	say("memserver QPs: A " + std::to_string(qa) + ", B " + std::to_string(qb));
	if (!qa) {
		say("FAIL: the memserver did not tell path A its QP number (accept private data)");
		return false;
	}
	Hold hold(o);
	if (!hold.install(qa) || (deferred && !hold.drop_connects())) {
		say("FAIL: cannot install the tc hold on " + o.dev);
		return false;
	}
	const auto t0 = Clock::now();
	const int ea = write_page(s, *s.a, off, 0xbb);
	say("A's write of 0xbb (held): " + std::string(ea ? err_text(ea) : "succeeded") + " after " +
	    fmt_s(secs_since(t0)));
	if (ea == 0) {
		say("FAIL: the held write succeeded: the hold did not hold it");
		return false;
	}
	bool ok = true;
	bool written = false;
	if (deferred) {
		// A's QP could not be fenced (connects are dropped): no write may go out now.
		const auto t1 = Clock::now();
		const int eb = write_page(s, *s.b, off, 0xcc);
		say("B's write of 0xcc while A's QP is unfenced: " +
		    std::string(eb ? err_text(eb) : "succeeded") + " after " + fmt_s(secs_since(t1)));
		if (eb == 0) {
			say("FAIL: a write went out while the failed write's QP was not fenced");
			ok = false;
			written = true;
		}
		if (!hold.allow_connects()) {
			say("FAIL: cannot remove the connect drop");
			return false;
		}
	}
	if (!written) {
		const auto t1 = Clock::now();
		const int eb = retry(Ms(4000), [&] { return write_page(s, *s.b, off, 0xcc); });
		say("B's write of 0xcc: " + std::string(eb ? err_text(eb) : "succeeded") + " after " +
		    fmt_s(secs_since(t1)) + " (" + fmt_s(secs_since(t0)) + " after A's)");
		if (eb) {
			say("FAIL: the newer write failed: nothing to judge");
			return false;
		}
	}
	const auto late = o.delay + Ms(1500);
	if (Clock::now() < t0 + late) {
		say("waiting until the held packets are delivered (" +
		    fmt_s(std::chrono::duration<double>(late).count()) + " after A's write)");
		std::this_thread::sleep_until(t0 + late);
	}
	const long held = hold.held();
	say("packets held and delivered late: " + (held < 0 ? std::string("unknown") : std::to_string(held)));
	int got = 0;
	const int er = retry(Ms(4000), [&] { return read_page(s, *s.b, off, got); });
	hold.remove();
	if (er) {
		say("read after the delivery: " + std::string(err_text(er)) + " (allowed)");
	} else if (got == 0xcc) {
		say("read after the delivery: 0xcc (the newer write)");
	} else if (got == 0xbb) {
		say("FAIL: read 0xbb: the failed write landed after the newer write was acknowledged");
		ok = false;
	} else {
		say("FAIL: read " + byte_name(got) + ", want 0xcc");
		ok = false;
	}
	if (held <= 0) {
		say("FAIL: tc held no packet of A's: the run proves nothing");
		ok = false;
	}
	say(std::string(ok ? "PASS" : "FAIL") + ": " + name);
	return ok;
}

[[noreturn]] void usage(const char *why)
{
	std::fprintf(stderr,
		     "rdmafence: %s\nusage: rdmafence --server HOST[:PORT] --auth-key FILE --dev DEV "
		     "[--tc PATH] [--timeout-ms N] [--delay-ms N] [--scenarios eager,deferred]\n",
		     why);
	std::exit(2);
}

Options parse(int argc, char **argv)
{
	Options o;
	for (int i = 1; i < argc; i++) {
		const std::string a = argv[i];
		if (i + 1 >= argc)
			usage(("missing value for " + a).c_str());
		const std::string v = argv[++i];
		if (a == "--server") {
			auto ep = parse_endpoint(v);
			if (!ep)
				usage("bad --server");
			o.server = *ep;
		} else if (a == "--auth-key") {
			o.key_file = v;
		} else if (a == "--dev") {
			o.dev = v;
		} else if (a == "--tc") {
			o.tc = v;
		} else if (a == "--timeout-ms") {
			o.timeout = Ms(std::atol(v.c_str()));
		} else if (a == "--delay-ms") {
			o.delay = Ms(std::atol(v.c_str()));
		} else if (a == "--scenarios") {
			o.scenarios.clear();
			size_t p = 0;
			while (p <= v.size()) {
				const size_t c = std::min(v.find(',', p), v.size());
				const std::string n = v.substr(p, c - p);
				if (n != "eager" && n != "deferred")
					usage("unknown scenario");
				o.scenarios.push_back(n);
				p = c + 1;
			}
		} else {
			usage(("unknown option " + a).c_str());
		}
	}
	if (o.server.host.empty() || o.key_file.empty() || o.dev.empty())
		usage("--server, --auth-key and --dev are required");
	if (o.timeout.count() <= 0 || o.delay <= 3 * o.timeout)
		usage("--delay-ms must exceed 3 x --timeout-ms (the deferred scenario's fences)");
	return o;
}

} // namespace

int main(int argc, char **argv)
{
	const Options o = parse(argc, argv);
	try {
		set_log_level("warn");
		Session s;
		s.ctx = std::make_unique<rdma::ClientContext>(o.server, o.timeout);
		RemoteServerOptions ro;
		ro.endpoint = o.server;
		ro.kind = TransportKind::Rdma;
		ro.rdma = s.ctx.get();
		ro.timeout = o.timeout;
		ro.auth_key = load_auth_key(o.key_file);
		s.server = std::make_unique<RemoteServer>(ro);
		s.region.resize(2 * kPage);
		// Two data paths of one session, as Volume opens them (paths=).
		s.a = s.server->open_data_path(s.region);
		s.b = s.server->open_data_path(s.region);
		if (int err = s.server->alloc_slab(s.slab)) {
			say("FAIL: ALLOC: " + std::string(err_text(err)));
			return 1;
		}
		say("session to " + o.server.str() + ", timeout " + std::to_string(o.timeout.count()) +
		    " ms, hold " + std::to_string(o.delay.count()) + " ms on " + o.dev);
		bool ok = true;
		uint64_t off = 0;
		for (const auto &n : o.scenarios) {
			ok = scenario(o, s, n, off) && ok;
			off += kPage;
		}
		say(ok ? "OK" : "FAILED");
		return ok ? 0 : 1;
	} catch (const std::exception &e) {
		say(std::string("FAIL: ") + e.what());
		return 1;
	}
}
