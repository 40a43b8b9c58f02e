// SPDX-License-Identifier: MIT
// nbdkit-rdmaswap-plugin: a block device whose bytes live in rdmaswap memservers. Thin glue:
// configuration and the nbdkit callbacks; the work is done by rdmaswap::Volume (common/).
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdarg>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include <spdlog/sinks/sink.h>

#include "common/cluster/discovery.h"
#include "common/cluster/donor_set.h"
#include "common/cluster/holders.h"
#include "common/cluster/membership.h"
#include "common/cluster/probe.h"
#include "common/net/etcd.h"
#include "common/net/verbs.h"
#include "common/obs/log.h"
#include "common/obs/metrics_text.h"
#include "common/transport/control_client.h"
#include "common/transport/data_path_base.h"
#include "common/transport/rdma/client.h"
#include "common/transport/remote_server.h"
#include "common/util/config.h"
#include "common/util/deadline.h"
#include "common/util/encoding.h"
#include "common/util/err_text.h"
#include "common/util/swap_safety.h"
#include "common/volume/backup.h"
#include "common/volume/reattach.h"
#include "common/volume/state_files.h"
#include "common/volume/volume.h"
#include "common/wire/auth.h"
#include "common/wire/donor_cert.h"
#include "common/wire/volume_key.h"

// nbdkit -D rdmaswap.debug=1: the plugin's loggers log at debug level (default: info). nbdkit
// prints debug and info messages only with -v. A debug flag (see nbdkit-plugin(3), "Debug
// Flags"): nbdkit finds it by this name and sets it when it loads the plugin.
extern "C" NBDKIT_DLL_PUBLIC int rdmaswap_debug_debug;
int rdmaswap_debug_debug = 0;

namespace {

using namespace rdmaswap;

// Where a warning goes (nbdkit 1.32 has no warning level, and nbdkit_error prefixes "error:",
// which an operator's log watcher alerts on): the destination of nbdkit's own messages, as
// --log= chose it (/proc/self/cmdline, read once at load): stderr, syslog or nowhere. With
// --log=default (or none), stderr, unless nbdkit forked into the background and its stderr
// became /dev/null (decided again in after_fork): then syslog, as nbdkit does.
enum class LogTo { Stderr, Syslog, Null };
std::atomic<LogTo> g_log_to{LogTo::Stderr};
bool g_log_explicit = false; // --log= named a destination other than default

void choose_log_destination()
{
	FILE *f = std::fopen("/proc/self/cmdline", "re");
	if (!f)
		return;
	char buf[8192];
	const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
	std::fclose(f);
	buf[n] = '\0';
	std::string_view prev;
	for (size_t off = 0; off < n;) {
		const std::string_view arg(buf + off);
		off += arg.size() + 1;
		std::string_view v;
		if (arg.substr(0, 6) == "--log=")
			v = arg.substr(6);
		else if (prev == "--log")
			v = arg;
		prev = arg;
		if (arg == "--")
			break; // (nbdkit's own options end here)
		if (v.empty())
			continue;
		g_log_explicit = v != "default";
		g_log_to = v == "syslog" ? LogTo::Syslog : v == "null" ? LogTo::Null : LogTo::Stderr;
	}
}

// After the fork: nbdkit in the background without -v points stderr at /dev/null and logs to
// syslog (its --log=default).
void log_destination_after_fork()
{
	if (g_log_explicit)
		return;
	struct stat err{}, null{};
	if (fstat(STDERR_FILENO, &err) == 0 && stat("/dev/null", &null) == 0 &&
	    S_ISCHR(err.st_mode) && err.st_rdev == null.st_rdev)
		g_log_to = LogTo::Syslog;
}

// One warning line, "nbdkit: rdmaswap: warning: NAME: TEXT", written to where nbdkit logs:
// formatted on the stack (cut at about 2000 bytes), one write(2) or syslog(3) call, errno kept.
void log_warning(std::string_view name, std::string_view text)
{
	const int saved_errno = errno;
	switch (g_log_to.load(std::memory_order_relaxed)) {
	case LogTo::Null:
		break;
	case LogTo::Syslog:
		syslog(LOG_WARNING, "rdmaswap: warning: %.*s: %.*s", int(name.size()), name.data(),
		       int(text.size()), text.data());
		break;
	case LogTo::Stderr: {
		char buf[2048];
		size_t n = 0;
		auto put = [&](std::string_view s) {
			const size_t k = std::min(s.size(), sizeof buf - 1 - n);
			std::memcpy(buf + n, s.data(), k);
			n += k;
		};
		put("nbdkit: rdmaswap: warning: ");
		put(name);
		put(": ");
		put(text);
		buf[n++] = '\n';
		(void)write_fully(STDERR_FILENO, buf, n);
		break;
	}
	}
	errno = saved_errno;
}

// Routes the project's spdlog loggers into nbdkit's log: errors always (nbdkit_error),
// warnings always without "error:" (log_warning), info and debug only with nbdkit -v
// (nbdkit_debug). Formats nothing itself and allocates nothing: the message is already formatted
// by spdlog on the stack. Thread-safe without a lock of its own, as nbdkit_error, nbdkit_debug
// and log_warning are.
class NbdkitSink final : public spdlog::sinks::sink {
public:
	void log(const spdlog::details::log_msg &msg) override
	{
		const std::string_view name(msg.logger_name.data(), msg.logger_name.size());
		const std::string_view text(msg.payload.data(), msg.payload.size());
		if (msg.level == spdlog::level::warn)
			log_warning(name, text);
		else if (msg.level > spdlog::level::warn)
			nbdkit_error("%.*s: %.*s", int(name.size()), name.data(), int(text.size()),
				     text.data());
		else
			nbdkit_debug("%.*s: %.*s", int(name.size()), name.data(), int(text.size()),
				     text.data());
	}
	void flush() override {}
	void set_pattern(const std::string &) override {}
	void set_formatter(std::unique_ptr<spdlog::formatter>) override {}
};

// A warning of the plugin itself (printf-style, control path only).
[[gnu::format(printf, 1, 2)]] void warn(const char *fmt, ...)
{
	char text[2048];
	va_list ap;
	va_start(ap, fmt);
	const int n = std::vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	log_warning("plugin", std::string_view(text, n < 0 ? 0 : std::min(size_t(n), sizeof text - 1)));
}

struct Config {
	std::vector<Endpoint> servers; // server=
	std::vector<std::string> etcd; // etcd=: client URLs; empty: no discovery
	std::string etcd_prefix{discovery::kDefaultPrefix}; // etcd-prefix=
	bool etcd_prefix_set = false;
	EtcdSecurity etcd_security; // etcd-cacert= ... etcd-password-file=
	std::shared_ptr<const etcd::Credentials> etcd_credentials; // their files, read once
	std::string donor_cache; // donor-cache=; default: discovery::default_cache_path()
	std::string backup;      // backup=FILE: the disk backup tier (none by default)
	uint64_t backup_queue = 32 << 20; // backup-queue=SIZE
	uint64_t run_id = 0, previous_run_id = 0; // this start's and the last one's (backup.h)
	uint64_t size = 0;
	TransportKind transport = TransportKind::Auto;
	unsigned channels = 16;
	unsigned paths = 4; // paths=: data connections per donor, shared by the channels
	unsigned replicas = 0; // 0: default (2 with two or more servers, else 1)
	std::chrono::milliseconds timeout{10000};
	std::shared_ptr<const AuthKey> auth_key; // auth-key=; null only with insecure=true
	std::string donor_ca, donor_crl; // donor-ca=, donor-crl= (donor_cert.h)
	std::shared_ptr<DonorVerifier> donor_verifier; // of donor-ca=: handshakes, registrations
	bool insecure = false;
	std::string volume;    // volume=; default: default_volume_name()
	std::string volume_key_path; // volume-key=; default: default_volume_key_path()
	std::shared_ptr<const VolumeKey> volume_key; // derived for `volume` in config_complete
	unsigned lease = 60;   // lease=SECONDS; 0: nothing survives the plugin
	unsigned realtime = 1; // realtime=PRIORITY: SCHED_RR priority of nbdkit's threads; 0: off
	bool realtime_set = false;
	int busy_poll = -1; // busy-poll=: 1 on, 0 off, -1 auto (on with >= kBusyPollMinCpus CPUs)
	unsigned spread = DonorSet::kDefaultSpread; // spread=: donor set size; 0: every donor
	unsigned idle_disconnect = 60; // idle-disconnect=SECONDS; 0: never
	std::string holders_file; // the holders record (spread > 0): beside the volume key
} g_cfg; // NOLINT(cert-err58-cpp): its defaults allocate nothing; made at dlopen
// This run's run file (state_files.h), locked from config_complete to the process's end.
std::unique_ptr<state::RunFile> g_run;
std::vector<Endpoint> g_servers;   // server= and the donors etcd (or its cache) gave
std::vector<Endpoint> g_reachable; // servers that answered in get_ready
// What the start knows of each donor (get_ready): its hint, whether it answered the probe (only
// those that may hold slabs, and server= entries, are probed) and whether it may hold slabs
// of the volume (in the holders record; every donor without a record).
std::vector<Membership::Candidate> g_candidates;
bool g_recording = false; // the holders record is kept (spread > 0)
std::unique_ptr<rdma::ClientContext> g_rdma;
std::unique_ptr<Volume> g_volume;
std::unique_ptr<Membership> g_membership; // after g_volume: destroyed first
TransportKind g_chosen = TransportKind::Tcp;
std::string g_statusfile;          // statusfile=: where the status thread writes
std::string g_metricsfile;         // metrics-file=: the same, in the Prometheus text format

// Writes the volume's status to g_statusfile and its metrics to g_metricsfile (each if set)
// every second (write + rename in the same directory, so readers never see half a file).
// Control path only.
class StatusWriter {
public:
	StatusWriter()
		: thread_([this] {
			  std::unique_lock lock(mu_);
			  bool failing = false;
			  while (!stop_) {
				  // The thread's exception boundary: a file not written this second
				  // is written the next (logged once per streak).
				  try {
					  write();
					  failing = false;
				  } catch (const std::exception &e) {
					  if (!failing)
						  logger("plugin")->warn("status files not written: {}",
									 e.what());
					  failing = true;
				  }
				  cv_.wait_for(lock, std::chrono::seconds(1));
			  }
		  })
	{
	}
	~StatusWriter()
	{
		{
			std::lock_guard lock(mu_);
			stop_ = true;
		}
		cv_.notify_all();
		thread_.join();
	}

private:
	static void write()
	{
		if (!g_statusfile.empty())
			replace_file(g_statusfile, std::string("transport=") +
							   transport_name(g_chosen) + "\n" +
							   g_volume->status_text() +
							   g_membership->status_text());
		if (!g_metricsfile.empty()) {
			MetricsText info;
			info.family("rdmaswap_volume_info", "gauge",
				    "Always 1: the plugin's version and the transport it chose.");
			info.sample("rdmaswap_volume_info",
				    {{"version", RDMASWAP_VERSION},
				     {"transport", transport_name(g_chosen)}},
				    uint64_t(1));
			replace_file(g_metricsfile, info.take() + g_volume->metrics_text() +
							    g_membership->metrics_text());
		}
	}
	// `path` holds `text`, or is left as it was. The temporary file (PATH.tmp-RANDOM) is in
	// the same directory, so the rename is atomic; node_exporter's textfile collector reads
	// only *.prom files, so it never sees it. It is created new (O_EXCL) and never through
	// a symbolic link (O_NOFOLLOW), so a link planted in the directory cannot make this
	// process (root, often) write anywhere else; mode 0644, for the metrics collector.
	static void replace_file(const std::string &path, const std::string &text)
	{
		uint64_t rnd = 0;
		random_bytes(std::as_writable_bytes(std::span(&rnd, 1)));
		char suffix[32];
		std::snprintf(suffix, sizeof suffix, ".tmp-%016llx", (unsigned long long)rnd);
		const std::string tmp = path + suffix;
		const int fd = ::open(tmp.c_str(),
				      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
		if (fd < 0)
			return;
		const bool written = write_fully(fd, text.data(), text.size());
		if (::close(fd) == 0 && written && std::rename(tmp.c_str(), path.c_str()) == 0)
			return;
		::unlink(tmp.c_str());
	}
	std::mutex mu_;
	std::condition_variable cv_;
	bool stop_ = false;
	std::thread thread_;
};
std::unique_ptr<StatusWriter> g_status;

// nbdkit exits only once every request in flight has returned, and a request may wait up to
// timeout= on a slow donor (or be retried on the next one). This thread learns that nbdkit is
// shutting down from its quit signals (SIGINT, SIGQUIT, SIGTERM, SIGHUP: nbdkit's handler
// runs first, then ours writes a byte to a pipe) and then stops every network wait of the
// process (request_stop(), common/util/deadline.h): waiting requests fail with EIO at once and
// nbdkit exits. Not nbdkit_nanosleep: it logs "error: aborting sleep because of server shut
// down" on every clean shutdown. A shutdown that nbdkit starts without a signal
// (nbdkit_shutdown() from a filter) is not seen: its requests end within their timeout.
// Made in after_fork (nbdkit installs its handlers before it calls it); stopped (within
// 100 ms) at unload, when nbdkit's handlers are put back.
class ShutdownWatcher {
public:
	ShutdownWatcher()
	{
		if (pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0)
			throw std::runtime_error(std::string("pipe2: ") + err_text(errno));
		g_quit_fd = pipe_[1];
		for (size_t i = 0; i < std::size(kSignals); i++) {
			struct sigaction &o = g_old[i];
			if (sigaction(kSignals[i], nullptr, &o) != 0)
				continue;
			const bool handled = (o.sa_flags & SA_SIGINFO) ||
					     (o.sa_handler != SIG_DFL && o.sa_handler != SIG_IGN);
			if (!handled)
				continue; // nbdkit does not catch it: its default action stays
			struct sigaction sa{};
			sa.sa_sigaction = on_signal;
			sa.sa_flags = SA_SIGINFO | SA_RESTART;
			sigfillset(&sa.sa_mask);
			installed_[i] = sigaction(kSignals[i], &sa, nullptr) == 0;
		}
		thread_ = std::thread([this] { run(); });
	}
	~ShutdownWatcher()
	{
		for (size_t i = 0; i < std::size(kSignals); i++)
			if (installed_[i])
				sigaction(kSignals[i], &g_old[i], nullptr);
		done_.store(true);
		thread_.join();
		// The pipe stays open: a handler that began before the lines above may still write.
	}

private:
	static constexpr int kSignals[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP};
	static inline struct sigaction g_old[std::size(kSignals)];
	static inline int g_quit_fd = -1;

	// nbdkit's handler (it sets its quit flag), then one byte to the pipe. Async-signal-safe.
	static void on_signal(int sig, siginfo_t *info, void *ctx)
	{
		const int saved_errno = errno;
		for (size_t i = 0; i < std::size(kSignals); i++) {
			if (kSignals[i] != sig)
				continue;
			const struct sigaction &o = g_old[i];
			if (o.sa_flags & SA_SIGINFO)
				o.sa_sigaction(sig, info, ctx);
			else if (o.sa_handler != SIG_DFL && o.sa_handler != SIG_IGN)
				o.sa_handler(sig);
		}
		const char c = 0;
		[[maybe_unused]] const ssize_t w = ::write(g_quit_fd, &c, 1);
		errno = saved_errno;
	}
	void run()
	{
		while (!done_.load()) {
			pollfd p{pipe_[0], POLLIN, 0};
			if (poll(&p, 1, 100) > 0 && (p.revents & POLLIN)) {
				request_stop();
				return;
			}
		}
	}
	int pipe_[2] = {-1, -1};
	bool installed_[std::size(kSignals)] = {};
	std::atomic<bool> done_{false};
	std::thread thread_;
};
std::unique_ptr<ShutdownWatcher> g_shutdown;


int fail(int err, const char *what)
{
	nbdkit_error("rdmaswap: %s: %s", what, err_text(err));
	nbdkit_set_error(err);
	return -1;
}

// A string literal as a template argument (Boundary's callback name).
template <size_t N> struct Name {
	constexpr Name(const char (&s)[N]) { std::copy_n(s, N, text); }
	char text[N];
};

// The exception boundary of every nbdkit callback (docs/architecture.md, "Exception
// boundaries"): nbdkit calls Boundary<"what", fn>::call, which runs `fn`; an exception that
// leaves `fn` is logged once (nbdkit_error naming the callback) and becomes the callback's
// failure: -1 with EIO (a request fails, a start step fails and nbdkit exits), NULL (open: the
// connection is refused), nothing (void callbacks). Nothing thrown reaches nbdkit.
template <Name what, auto fn> struct Boundary;
template <Name what, typename R, typename... A, R (*fn)(A...)> struct Boundary<what, fn> {
	static R call(A... args) noexcept
	{
		try {
			return fn(args...);
		} catch (const std::exception &e) {
			nbdkit_error("rdmaswap: %s: %s", what.text, e.what());
		} catch (...) {
			nbdkit_error("rdmaswap: %s: unknown exception", what.text);
		}
		nbdkit_set_error(EIO);
		if constexpr (std::is_pointer_v<R>)
			return nullptr;
		else if constexpr (!std::is_void_v<R>)
			return R(-1);
	}
};

// Test hooks (RDMASWAP_TEST_THROW, read once at load; comma-separated): "write" makes the
// first write request throw inside its callback, "membership" the first three steps of the
// membership thread (tests/integration/test-exception-boundary.sh), "start" the start-up
// (after_fork) once the volume's and the membership's threads run (test-exception-boundary.sh).
// Unset in production.
std::atomic<int> g_throw_writes{0};
unsigned g_throw_steps = 0;
bool g_throw_start = false;

void read_test_hooks()
{
	const char *v = std::getenv("RDMASWAP_TEST_THROW");
	if (!v)
		return;
	const std::string s = std::string(",") + v + ",";
	if (s.find(",write,") != std::string::npos)
		g_throw_writes = 1;
	if (s.find(",membership,") != std::string::npos)
		g_throw_steps = 3;
	if (s.find(",start,") != std::string::npos)
		g_throw_start = true;
}

void rdmaswap_load()
{
	set_log_sink(std::make_shared<NbdkitSink>());
	// info (shown with nbdkit -v), or debug with -D rdmaswap.debug=1 (nbdkit sets the flag
	// before it calls .load).
	set_log_level(rdmaswap_debug_debug ? "debug" : "info");
	choose_log_destination();
	read_test_hooks();
}

// Stops every thread the plugin started and frees what they use, in that order. At unload,
// and when the start fails after threads were started: nbdkit then exits, and a thread still
// running while exit() destroys the globals and OpenSSL's state would crash it (finding S11).
void stop_threads()
{
	// Nothing is served any more: no wait of the teardown below (a repair thread's control
	// call) may hold up the exit.
	g_shutdown.reset();
	request_stop();
	g_status.reset();
	g_membership.reset(); // its threads use the volume
	g_volume.reset();
	g_rdma.reset();
}

void rdmaswap_unload()
{
	stop_threads();
	// A clean stop: the run file says when (rdmaswapctl state prune counts the lease from
	// it). Only here: nbdkit's parent process exits at its fork without calling .unload.
	if (g_run)
		g_run->stopped();
	g_run.reset();
}

void rdmaswap_dump_plugin()
{
	std::printf("rdmaswap_version=%s\n", RDMASWAP_VERSION);
	std::printf("rdmaswap_tcp=yes\n");
	std::printf("rdmaswap_rdma=yes\n"); // built with rdma-core
	std::printf("rdmaswap_rdma_devices=%d\n", rdma::device_count());
}

// A path parameter (`key`=`value`), made absolute (nbdkit changes directory): 0, or -1 after
// an error message.
static int config_path(const char *key, const char *value, std::string &out)
{
	if (!*value) {
		nbdkit_error("rdmaswap: %s= needs a path", key);
		return -1;
	}
	char *abs = nbdkit_absolute_path(value);
	if (!abs)
		return -1;
	out = abs;
	std::free(abs);
	return 0;
}

int rdmaswap_config(const char *key, const char *value)
{
	const std::string k = key;
	if (k == "server") {
		auto ep = parse_endpoint(value);
		if (!ep) {
			nbdkit_error("rdmaswap: server=%s: expected HOST[:PORT]", value);
			return -1;
		}
		g_cfg.servers.push_back(*ep);
	} else if (k == "etcd") {
		std::string why;
		auto eps = etcd::parse_endpoints(value, why);
		if (!eps) {
			nbdkit_error("rdmaswap: etcd=%s: %s", value, why.c_str());
			return -1;
		}
		g_cfg.etcd.insert(g_cfg.etcd.end(), eps->begin(), eps->end());
	} else if (k == "etcd-prefix") {
		if (!*value) {
			nbdkit_error("rdmaswap: etcd-prefix= must not be empty");
			return -1;
		}
		g_cfg.etcd_prefix = value;
		g_cfg.etcd_prefix_set = true;
	} else if (std::string why; set_etcd_security_key(g_cfg.etcd_security, k, value, why)) {
		if (!why.empty()) {
			nbdkit_error("rdmaswap: %s", why.c_str());
			return -1;
		}
	} else if (k == "donor-cache") {
		if (config_path(key, value, g_cfg.donor_cache) < 0)
			return -1;
	} else if (k == "backup") {
		if (config_path(key, value, g_cfg.backup) < 0)
			return -1;
	} else if (k == "backup-queue") {
		const int64_t s = nbdkit_parse_size(value);
		if (s < 0)
			return -1;
		if (s < (1 << 20) || s > (int64_t(1) << 32)) {
			nbdkit_error("rdmaswap: backup-queue=%s: must be between 1M and 4G", value);
			return -1;
		}
		g_cfg.backup_queue = uint64_t(s);
	} else if (k == "size") {
		const int64_t s = nbdkit_parse_size(value);
		if (s < 0)
			return -1;
		if (s == 0 || s % 4096 != 0) {
			nbdkit_error("rdmaswap: size=%s: must be a non-zero multiple of 4096", value);
			return -1;
		}
		g_cfg.size = uint64_t(s);
	} else if (k == "transport") {
		auto t = parse_transport(value);
		if (!t) {
			nbdkit_error("rdmaswap: transport=%s: expected tcp, rdma or auto", value);
			return -1;
		}
		g_cfg.transport = *t;
	} else if (k == "spread") {
		if (nbdkit_parse_unsigned("spread", value, &g_cfg.spread) < 0)
			return -1;
		if (g_cfg.spread > Volume::kMaxServers) {
			nbdkit_error("rdmaswap: spread=%s: at most %zu (0: every donor)", value,
				     Volume::kMaxServers);
			return -1;
		}
	} else if (k == "idle-disconnect") {
		if (nbdkit_parse_unsigned("idle-disconnect", value, &g_cfg.idle_disconnect) < 0)
			return -1;
		if (g_cfg.idle_disconnect > 86400) {
			nbdkit_error("rdmaswap: idle-disconnect=%s: at most 86400 seconds (0: never)",
				     value);
			return -1;
		}
	} else if (k == "channels") {
		if (nbdkit_parse_unsigned("channels", value, &g_cfg.channels) < 0)
			return -1;
		if (g_cfg.channels == 0 || g_cfg.channels > 1024) {
			nbdkit_error("rdmaswap: channels=%s: must be between 1 and 1024", value);
			return -1;
		}
	} else if (k == "paths") {
		if (nbdkit_parse_unsigned("paths", value, &g_cfg.paths) < 0)
			return -1;
		if (g_cfg.paths == 0 || g_cfg.paths > 1024) {
			nbdkit_error("rdmaswap: paths=%s: must be between 1 and 1024", value);
			return -1;
		}
	} else if (k == "statusfile") {
		if (config_path(key, value, g_statusfile) < 0)
			return -1;
	} else if (k == "metrics-file") {
		if (config_path(key, value, g_metricsfile) < 0)
			return -1;
	} else if (k == "replicas") {
		if (nbdkit_parse_unsigned("replicas", value, &g_cfg.replicas) < 0)
			return -1;
		if (g_cfg.replicas == 0 || g_cfg.replicas > Volume::kMaxReplicas) {
			nbdkit_error("rdmaswap: replicas=%s: must be between 1 and %u", value,
				     Volume::kMaxReplicas);
			return -1;
		}
	} else if (k == "timeout") {
		unsigned t = 0;
		if (nbdkit_parse_unsigned("timeout", value, &t) < 0)
			return -1;
		if (t == 0 || t > 3600) {
			nbdkit_error("rdmaswap: timeout=%s: seconds between 1 and 3600", value);
			return -1;
		}
		g_cfg.timeout = std::chrono::seconds(t);
	} else if (k == "donor-ca") {
		if (config_path(key, value, g_cfg.donor_ca) < 0)
			return -1;
	} else if (k == "donor-crl") {
		if (config_path(key, value, g_cfg.donor_crl) < 0)
			return -1;
	} else if (k == "auth-key") {
		try {
			g_cfg.auth_key = load_auth_key(value);
		} catch (const std::exception &e) {
			nbdkit_error("rdmaswap: auth-key=: %s", e.what());
			return -1;
		}
	} else if (k == "volume") {
		if (!proto::valid_volume_name(value)) {
			nbdkit_error("rdmaswap: volume=%s: 1 to %zu characters, each a printable "
				     "ASCII character other than space",
				     value, proto::kMaxVolumeName);
			return -1;
		}
		g_cfg.volume = value;
	} else if (k == "volume-key") {
		if (config_path(key, value, g_cfg.volume_key_path) < 0)
			return -1;
	} else if (k == "lease") {
		if (nbdkit_parse_unsigned("lease", value, &g_cfg.lease) < 0)
			return -1;
		if (g_cfg.lease > 7 * 86400) {
			nbdkit_error("rdmaswap: lease=%s: seconds between 0 and 604800", value);
			return -1;
		}
	} else if (k == "realtime") {
		if (nbdkit_parse_unsigned("realtime", value, &g_cfg.realtime) < 0)
			return -1;
		if (g_cfg.realtime > 99) {
			nbdkit_error("rdmaswap: realtime=%s: a SCHED_RR priority between 1 and 99, "
				     "or 0 to leave the scheduling alone", value);
			return -1;
		}
		g_cfg.realtime_set = true;
	} else if (k == "busy-poll") {
		if (std::strcmp(value, "auto") == 0) {
			g_cfg.busy_poll = -1;
		} else if (std::strcmp(value, "on") == 0 || std::strcmp(value, "off") == 0) {
			g_cfg.busy_poll = value[1] == 'n';
		} else {
			nbdkit_error("rdmaswap: busy-poll=%s: expected auto, on or off", value);
			return -1;
		}
	} else if (k == "insecure") {
		const int b = nbdkit_parse_bool(value);
		if (b < 0)
			return -1;
		g_cfg.insecure = b;
	} else {
		nbdkit_error("rdmaswap: unknown parameter '%s' (see nbdkit-rdmaswap-plugin(1))",
			     key);
		return -1;
	}
	return 0;
}

int rdmaswap_config_complete()
{
	const bool etcd = !g_cfg.etcd.empty();
	if (g_cfg.servers.empty() && !etcd) {
		nbdkit_error("rdmaswap: at least one server=HOST[:PORT] or etcd=URL[,URL...] is "
			     "required");
		return -1;
	}
	if (!etcd && (g_cfg.etcd_prefix_set || !g_cfg.donor_cache.empty())) {
		nbdkit_error("rdmaswap: %s= needs etcd=URL[,URL...]",
			     g_cfg.etcd_prefix_set ? "etcd-prefix" : "donor-cache");
		return -1;
	}
	if (const std::string why = check_etcd_security(g_cfg.etcd_security, g_cfg.etcd, "");
	    !why.empty()) {
		nbdkit_error("rdmaswap: %s", why.c_str());
		return -1;
	}
	if (g_cfg.etcd_security.any()) {
		try { // (read before nbdkit forks: every etcd client uses them)
			g_cfg.etcd_credentials =
				std::make_shared<const etcd::Credentials>(g_cfg.etcd_security);
		} catch (const std::exception &e) {
			nbdkit_error("rdmaswap: %s", e.what());
			return -1;
		}
	}
	if (g_cfg.size == 0) {
		nbdkit_error("rdmaswap: size=SIZE is required");
		return -1;
	}
	if (g_cfg.servers.size() > Volume::kMaxServers) {
		nbdkit_error("rdmaswap: at most %zu servers", Volume::kMaxServers);
		return -1;
	}
	if (!g_cfg.auth_key && !g_cfg.insecure) {
		nbdkit_error("rdmaswap: auth-key=FILE is required (the cluster key the memservers "
			     "were given with --auth-key), or insecure=true for memservers run with "
			     "--insecure");
		return -1;
	}
	if (g_cfg.auth_key && g_cfg.insecure) {
		nbdkit_error("rdmaswap: auth-key= and insecure=true exclude each other");
		return -1;
	}
	if (g_cfg.insecure)
		warn("insecure=true: memservers are not authenticated and do not authenticate us");
	// Donor certificates (docs/security.md, "Roles"): the check travels with the key to every
	// connection to a memserver (AuthKey::with_donor_check, connect_memserver).
	if (!g_cfg.donor_ca.empty() && g_cfg.insecure) {
		nbdkit_error("rdmaswap: donor-ca= needs auth-key= (it is checked in the handshake)");
		return -1;
	}
	if (!g_cfg.donor_crl.empty() && g_cfg.donor_ca.empty()) {
		nbdkit_error("rdmaswap: donor-crl= needs donor-ca=FILE");
		return -1;
	}
	if (!g_cfg.donor_ca.empty()) {
		try {
			g_cfg.donor_verifier =
				std::make_shared<DonorVerifier>(g_cfg.donor_ca, g_cfg.donor_crl);
			g_cfg.auth_key = g_cfg.auth_key->with_donor_check(g_cfg.donor_verifier);
		} catch (const std::exception &e) {
			nbdkit_error("rdmaswap: donor-ca=: %s", e.what());
			return -1;
		}
	} else if (!g_cfg.insecure) {
		warn("no donor-ca=: donors are not authenticated: any cluster-key holder can be a "
		     "donor and receive this host's swap pages (docs/security.md, \"Roles\")");
	}
	// With etcd=, the servers are known only once etcd was asked (get_ready).
	if (!etcd && g_cfg.replicas == 0)
		g_cfg.replicas = g_cfg.servers.size() >= 2 ? 2 : 1;
	if (!etcd && g_cfg.replicas > g_cfg.servers.size()) {
		nbdkit_error("rdmaswap: replicas=%u needs at least %u server= entries",
			     g_cfg.replicas, g_cfg.replicas);
		return -1;
	}
	if (g_cfg.volume.empty()) {
		char host[256] = {};
		if (gethostname(host, sizeof host - 1) != 0)
			std::strcpy(host, "localhost");
		g_cfg.volume = etcd ? default_volume_name(host, g_cfg.size, g_cfg.servers,
							  g_cfg.etcd_prefix)
				    : default_volume_name(host, g_cfg.size, g_cfg.servers);
	}
	// The volume key: read (or made) before the fork, once the volume's name is known.
	try {
		if (g_cfg.volume_key_path.empty())
			g_cfg.volume_key_path = default_volume_key_path();
		bool created = false;
		g_cfg.volume_key =
			VolumeKey::load_or_create(g_cfg.volume_key_path, g_cfg.volume, &created);
		if (created)
			logger("client")->info("volume key {} created (mode 0600): keep it; only this "
					       "host can reattach its volumes with it",
					       g_cfg.volume_key_path);
	} catch (const std::exception &e) {
		nbdkit_error("rdmaswap: volume-key=%s: %s", g_cfg.volume_key_path.c_str(), e.what());
		return -1;
	}
	// Files of this volume beside the volume key: VOLUME-KEY.<FNV-1a of the volume's
	// name>.SUFFIX (state_files.h).
	// The holders record (spread > 0; membership.h): which donors a restart contacts.
	g_cfg.holders_file = state::volume_file(g_cfg.volume_key_path, g_cfg.volume, "holders");
	// The run file: this run's id (a backup file closed cleanly is trusted only by the next
	// run, backup.h), locked while nbdkit runs, and when it stopped cleanly (what
	// rdmaswapctl state prune looks at). Written with or without backup=.
	try {
		g_run = std::make_unique<state::RunFile>(
			state::volume_file(g_cfg.volume_key_path, g_cfg.volume, "run"), g_cfg.volume,
			g_cfg.lease, g_cfg.backup);
		g_cfg.run_id = g_run->id();
		g_cfg.previous_run_id = g_run->previous();
	} catch (const std::exception &e) {
		if (!g_cfg.backup.empty()) {
			nbdkit_error("rdmaswap: backup=%s: %s", g_cfg.backup.c_str(), e.what());
			return -1;
		}
		nbdkit_debug("rdmaswap: %s", e.what());
	}
	if (g_cfg.backup.empty() && g_cfg.backup_queue != (32 << 20)) {
		nbdkit_error("rdmaswap: backup-queue= needs backup=");
		return -1;
	}
	// The donor cache: beside the default volume key (the state directory), whatever
	// volume-key= says.
	if (etcd && g_cfg.donor_cache.empty()) {
		try {
			g_cfg.donor_cache = discovery::default_cache_path(default_volume_key_path(),
									  g_cfg.volume);
		} catch (const std::exception &) {
			nbdkit_error("rdmaswap: etcd= needs donor-cache=FILE here: no state directory "
				     "for its default (STATE_DIRECTORY, XDG_STATE_HOME and HOME are "
				     "unset and we are not root)");
			return -1;
		}
	}
	nbdkit_debug("rdmaswap: volume=%s lease=%u volume-key=%s (public key %s)",
		     g_cfg.volume.c_str(), g_cfg.lease, g_cfg.volume_key_path.c_str(),
		     hex(g_cfg.volume_key->public_key()).c_str());
	return 0;
}

static discovery::ListOptions etcd_list_options()
{
	discovery::ListOptions o;
	o.endpoints = g_cfg.etcd;
	o.prefix = g_cfg.etcd_prefix;
	o.verifier = g_cfg.donor_verifier; // (donor-ca=: signed registrations only)
	o.timeout = g_cfg.timeout;
	o.credentials = g_cfg.etcd_credentials; // (etcd-cacert= ...: TLS and etcd's auth)
	return o;
}

// The hints etcd published at start (discovery), for donors the start does not probe.
std::vector<discovery::Donor> g_registered;
discovery::Ignored g_ignored; // the entries the start's listing left out
int64_t g_listed_revision = 0; // the start's listing's revision (0: none)
// The donors etcd's copy of the holders record names (read_holders): contacted at start, but on
// etcd's word alone none counts as missing or enters the local record (issue 26, S2).
std::vector<Endpoint> g_etcd_holders;
uint64_t g_holders_ignored = 0; // etcd's copy ignored: not signed by the volume key

// The holders record's unreachable times (holders::Unreachable): as the start read them
// (read_holders), and as this run keeps them (bound_holders), cleared for a donor as it is
// connected (holder_reached). The latter with the donors last recorded, under g_holders_mu:
// the membership thread writes the record too.
holders::Unreachable g_read_unreachable;
std::mutex g_holders_mu;
holders::Unreachable g_unreachable;
std::vector<Endpoint> g_recorded; // the record as last stored

// The holders record (spread > 0; common/cluster/membership.h): the donors that may hold slabs of
// the volume. The local file decides; without it (a first start, or a lost file) every donor
// may hold slabs and the start contacts them all. etcd's copy only adds donors to contact
// (g_etcd_holders), never to the record.
static std::optional<std::vector<Endpoint>> read_holders()
{
	std::optional<std::vector<Endpoint>> record;
	try {
		record = holders::read_file(g_cfg.holders_file, g_cfg.volume, &g_read_unreachable);
	} catch (const std::exception &e) {
		warn("%s: every donor is contacted at this start", e.what());
	}
	if (!g_cfg.etcd.empty()) {
		const auto got = holders::get_etcd(etcd_list_options(), g_cfg.volume,
						   &g_cfg.volume_key->public_key());
		if (got.status == holders::EtcdRecord::Status::Failed) {
			nbdkit_debug("rdmaswap: etcd: the holders record not read: %s",
				     got.why.c_str());
		} else if (got.status == holders::EtcdRecord::Status::Ignored) {
			g_holders_ignored++; // (issue 26: only a copy this volume's key signed)
			warn("etcd: the holders record ignored: %s", got.why.c_str());
		} else
			for (const auto &ep : got.donors) {
				// Not into the record: a donor named by etcd alone is contacted, kept
				// only if it hands slabs of the volume back (issue 26, S2).
				g_etcd_holders.push_back(ep);
				if (std::find(g_servers.begin(), g_servers.end(), ep) == g_servers.end())
					g_servers.push_back(ep); // contacted: it may hold slabs
			}
	}
	return record;
}

// Store the holders record (with g_unreachable's times of its donors): the file, then etcd's
// copy (best effort: the file decides). "" or why the file could not be written. Caller holds
// g_holders_mu.
static std::string store_holders(const std::vector<Endpoint> &donors)
{
	try {
		holders::write_file(g_cfg.holders_file, g_cfg.volume, donors, g_unreachable);
	} catch (const std::exception &e) {
		return e.what();
	}
	g_recorded = donors;
	if (!g_cfg.etcd.empty())
		if (const std::string why = holders::put_etcd(etcd_list_options(), g_cfg.volume,
							       donors, g_unreachable,
							       g_cfg.volume_key.get());
		    !why.empty())
			logger("membership")->debug("etcd: the holders record not stored: {}", why);
	return "";
}

static std::string write_holders(const std::vector<Endpoint> &donors)
{
	std::lock_guard lock(g_holders_mu);
	return store_holders(donors);
}

// A recorded donor that the start could not reach is connected now: the record no longer says
// it is unreachable, before the connection is made (so that a restart after this run does not
// drop a donor that may hold slabs of it). Throws std::runtime_error if the record cannot be
// stored (the donor is then not connected now: Membership retries it).
static void holder_reached(const Endpoint &ep)
{
	if (!g_recording)
		return;
	std::lock_guard lock(g_holders_mu);
	const auto it = g_unreachable.find(ep.str());
	if (it == g_unreachable.end())
		return;
	const auto since = *it;
	g_unreachable.erase(it);
	if (std::string why = store_holders(g_recorded); !why.empty()) {
		g_unreachable.insert(since);
		throw std::runtime_error("cannot record that " + ep.str() + " is reachable again: " +
					 why);
	}
}

// With etcd=: g_servers from server=, etcd and the donor cache (discovery::discover), and
// replicas= checked against them. 0, or -1 after an error message.
static int discover_donors()
{
	discovery::DiscoverOptions o;
	o.list = etcd_list_options();
	o.servers = g_cfg.servers;
	o.cache_path = g_cfg.donor_cache;
	std::string why;
	auto found = discovery::discover(o, why);
	if (!found) {
		nbdkit_error("rdmaswap: %s", why.c_str());
		return -1;
	}
	g_servers = std::move(found->servers); // (at most discovery::kMaxListed from etcd)
	g_registered = std::move(found->registered);
	g_ignored = std::move(found->ignored);
	g_listed_revision = found->revision;
	if (g_cfg.replicas == 0)
		g_cfg.replicas = g_servers.size() >= 2 ? 2 : 1;
	if (g_cfg.replicas > g_servers.size()) {
		nbdkit_error("rdmaswap: replicas=%u needs at least %u memservers, %zu known "
			     "(server= and etcd)",
			     g_cfg.replicas, g_cfg.replicas, g_servers.size());
		return -1;
	}
	return 0;
}

// Probes at start run this many at once (probe.h: threads of 256 KiB stacks, for the start).
static constexpr unsigned kStartProbeWorkers = 32;
// Donors that etcd's copy of the holders record alone names: contacted at start, this many at
// most (the record keeps the donor set's and 32 more: holders.h).
static constexpr size_t kMaxEtcdHolders = 64;

// A probe of memserver `ep` (probe.h): an authenticated STATS on a connection of its own, done
// by `deadline`. Its counts, or nullopt with `why` set. Throws std::runtime_error when the
// name does not resolve (a failure to probe_all).
static std::optional<DonorLoad> probe_donor(const Endpoint &ep, ProbeClock::time_point deadline,
					    std::string &why)
{
	const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
		deadline - ProbeClock::now());
	if (left.count() <= 0) {
		why = "no time left";
		return std::nullopt;
	}
	ControlClient cc(resolve(ep), left, g_cfg.auth_key);
	proto::StatsReply st;
	if (const int err = cc.stats(st)) {
		why = connect_error_text(err);
		return std::nullopt;
	}
	return DonorLoad{st.slabs_total - std::min(st.slabs_free, st.slabs_total), st.slabs_total,
			 true, st.sessions};
}

// Before nbdkit forks: find the donors in etcd (etcd=), then check which memservers answer,
// so that a typo or a dead donor is a clear startup error rather than EIO later. Unreachable
// donors are tolerated (with a warning) while at least `replicas` answer. Only plain sockets
// here: RDMA resources come after the fork.
int rdmaswap_get_ready()
{
	if (g_cfg.etcd.empty()) {
		g_servers = g_cfg.servers;
	} else {
		try {
			if (discover_donors() < 0)
				return -1;
		} catch (const std::exception &e) {
			nbdkit_error("rdmaswap: etcd: %s", e.what());
			return -1;
		}
	}
	g_recording = g_cfg.spread > 0;
	const size_t nlisted = g_servers.size(); // server=, and etcd's listing (or its cache)
	std::optional<std::vector<Endpoint>> record;
	if (g_recording)
		record = read_holders();
	if (record)
		for (const auto &ep : *record)
			if (std::find(g_servers.begin(), g_servers.end(), ep) == g_servers.end())
				g_servers.push_back(ep); // no longer listed: it may still hold slabs
	// Probed, in parallel under one deadline (timeout=): the donors that may hold slabs by
	// local knowledge (the record's; every listed one without a record) and the server=
	// entries (a typo is a clear error at start), each within the whole deadline; then those
	// etcd's copy of the record alone adds (at most kMaxEtcdHolders), and the other
	// registered donors, only candidates for the donor set, in a random order (an entry's
	// place in etcd buys nothing), each within min(timeout=, 2 s), until the first two kinds
	// are done and enough answered for the set. A donor not probed by the deadline is not
	// chosen now (Membership probes it later if the set needs it).
	std::unordered_map<std::string, const discovery::Donor *> registered;
	for (const auto &d : g_registered)
		registered.emplace(d.addr.str(), &d);
	std::set<std::string> recorded, etcd_holders, configured, listed;
	if (record)
		for (const auto &ep : *record)
			recorded.insert(ep.str());
	for (const auto &ep : g_etcd_holders)
		etcd_holders.insert(ep.str());
	for (const auto &ep : g_cfg.servers)
		configured.insert(ep.str());
	for (size_t k = 0; k < nlisted; k++)
		listed.insert(g_servers[k].str());
	std::vector<size_t> first, etcd_only, others; // indices into g_candidates
	g_candidates.resize(g_servers.size());
	for (size_t k = 0; k < g_servers.size(); k++) {
		Membership::Candidate &c = g_candidates[k];
		c.ep = g_servers[k];
		const std::string name = c.ep.str();
		const bool local = recorded.count(name) > 0;
		c.may_hold = !record || local || etcd_holders.count(name);
		// Counted as missing: the record's donors; without a record every donor listed (a
		// first start, or a lost file: the safe side), but none that etcd's copy of the
		// record alone names.
		c.may_miss = record ? local : listed.count(name) > 0;
		if (auto it = registered.find(name); it != registered.end())
			c.hint = DonorLoad{it->second->slabs_total -
						   std::min(it->second->slabs_free, it->second->slabs_total),
					   it->second->slabs_total, true, it->second->sessions};
		if ((c.may_hold && c.may_miss) || configured.count(name))
			first.push_back(k);
		else if (c.may_hold && etcd_only.size() < kMaxEtcdHolders)
			etcd_only.push_back(k);
		else if (c.may_hold)
			c.probed = c.reachable = false; // (beyond kMaxEtcdHolders: not contacted)
		else
			others.push_back(k);
	}
	std::shuffle(others.begin(), others.end(), std::minstd_rand(std::random_device{}()));
	std::vector<ProbeTarget> targets;
	std::vector<size_t> target_of;
	for (size_t k : first) {
		targets.push_back(ProbeTarget{g_candidates[k].ep, std::chrono::milliseconds(0)});
		target_of.push_back(k);
	}
	const auto side_bound = std::min(g_cfg.timeout, std::chrono::milliseconds(2000));
	for (size_t k : etcd_only) {
		targets.push_back(ProbeTarget{g_candidates[k].ep, side_bound});
		target_of.push_back(k);
	}
	for (size_t k : others) {
		targets.push_back(ProbeTarget{g_candidates[k].ep, side_bound});
		target_of.push_back(k);
	}
	// Enough: the first ones done, and as many answered as the set holds (every one that
	// answers with spread=0).
	const size_t want = g_cfg.spread ? std::max<size_t>(g_cfg.spread, g_cfg.replicas) : SIZE_MAX;
	const size_t nfirst = first.size() + etcd_only.size();
	auto enough = [&](std::span<const ProbeOutcome> o) {
		size_t ok = 0;
		for (size_t j = 0; j < o.size(); j++) {
			if (j < nfirst && o[j].state == ProbeOutcome::State::NotRun)
				return false;
			ok += o[j].state == ProbeOutcome::State::Ok;
		}
		return ok >= want;
	};
	const auto probe_started = ProbeClock::now();
	const std::vector<ProbeOutcome> outcomes =
		probe_all(targets, probe_donor, probe_started + g_cfg.timeout, kStartProbeWorkers,
			  enough);
	size_t usable = 0, not_probed = 0;
	std::vector<std::pair<std::string, std::string>> unreachable; // (name, why)
	for (size_t j = 0; j < targets.size(); j++) {
		Membership::Candidate &c = g_candidates[target_of[j]];
		const ProbeOutcome &o = outcomes[j];
		if (o.state == ProbeOutcome::State::Ok) {
			c.hint = o.load;
			// (spread=0 connects every donor that answered: no more than a volume takes.)
			if (g_cfg.spread == 0 && usable >= Volume::kMaxServers) {
				c.probed = c.reachable = false;
				continue;
			}
			g_reachable.push_back(c.ep);
			usable++;
		} else if (o.state == ProbeOutcome::State::NotRun) {
			c.probed = c.reachable = false;
			not_probed++;
		} else if (g_servers.size() == 1) {
			c.reachable = false;
			nbdkit_error("rdmaswap: memserver %s is not reachable: %s", c.ep.str().c_str(),
				     o.why.c_str());
		} else {
			c.reachable = false;
			unreachable.emplace_back(c.ep.str(), o.why);
		}
	}
	// One line for them all (a record may name many donors gone for good).
	if (unreachable.size() == 1)
		warn("memserver %s is not reachable: %s", unreachable[0].first.c_str(),
		     unreachable[0].second.c_str());
	else if (!unreachable.empty())
		warn("%zu memservers not reachable: %s", unreachable.size(),
		     log_summary(unreachable).c_str());
	nbdkit_debug("rdmaswap: %zu memservers probed in %lld ms: %zu answered, %zu did not, %zu "
		     "left unprobed",
		     targets.size() - not_probed,
		     (long long)std::chrono::duration_cast<std::chrono::milliseconds>(
			     ProbeClock::now() - probe_started)
			     .count(),
		     usable, unreachable.size(), not_probed);
	if (usable < g_cfg.replicas) {
		nbdkit_error("rdmaswap: %zu of %zu memservers reachable, replicas=%u needs %u",
			     usable, g_servers.size(), g_cfg.replicas, g_cfg.replicas);
		return -1;
	}
	if (g_cfg.transport == TransportKind::Rdma && !rdma::devices_present()) {
		nbdkit_error("rdmaswap: transport=rdma but this host has no RDMA device "
			     "(for Soft-RoCE: rdma link add rxe0 type rxe netdev ETH)");
		return -1;
	}
	return 0;
}

// The holders record stays bounded (issue 29): a host restarted many times over a day with new
// donors each time would otherwise name every donor it ever used, and contact (probe) each of
// them at every start. The record of this start keeps every donor of this run (plan.start);
// of the recorded donors that could not be contacted now (they hold nothing of this run) it
// drops (holders::age_record)
// - with lease=0 all: nothing of the volume outlives a run (a donor frees it when its session
//   ends), so they hold nothing of it;
// - otherwise those not reachable for longer than the lease (since a start first found them
//   so: the record keeps that time): whatever they held of an earlier run has expired;
// and keeps at most kMaxUncontacted of the others, the first by name (they may still hold
// slabs of an earlier run, which this run already counts as missing).
static constexpr size_t kMaxUncontacted = 32;

static void bound_holders(Membership::StartPlan &plan)
{
	std::vector<Endpoint> reached;
	for (const auto &s : plan.start)
		reached.push_back(s.ep);
	const auto now = std::chrono::duration_cast<std::chrono::seconds>(
				 std::chrono::system_clock::now().time_since_epoch())
				 .count();
	std::lock_guard lock(g_holders_mu);
	holders::AgedRecord aged = holders::age_record(plan.record, reached, g_read_unreachable,
						       now, g_cfg.lease, kMaxUncontacted);
	if (aged.dropped_lease)
		logger("plugin")->info("the holders record drops {} donor(s) not contacted now ({})",
				       aged.dropped_lease,
				       g_cfg.lease == 0
					       ? "lease=0: they hold nothing of the volume"
					       : fmt::format("not reachable for longer than lease={} s: "
							     "what they held of the volume has expired",
							     g_cfg.lease));
	if (aged.dropped_cap)
		logger("plugin")->info("the holders record drops {} donor(s) not contacted now (more "
				       "than {} such donors)",
				       aged.dropped_cap, kMaxUncontacted);
	plan.record = std::move(aged.donors);
	g_unreachable = std::move(aged.unreachable);
}

// A session with memserver `ep` for the volume, with the plugin's settings (after the fork:
// g_chosen and g_rdma are set). Throws std::runtime_error (VolumeProofRefused for a refused
// proof of the volume key).
static std::unique_ptr<Server> connect_donor(const Endpoint &ep)
{
	holder_reached(ep);
	RemoteServerOptions o;
	o.endpoint = ep;
	o.kind = g_chosen;
	o.timeout = g_cfg.timeout;
	o.rdma = g_rdma.get();
	o.auth_key = g_cfg.auth_key;
	o.volume = g_cfg.volume;
	o.lease_s = g_cfg.lease;
	o.volume_key = g_cfg.volume_key;
	return std::make_unique<RemoteServer>(o);
}

static int start_serving()
{
	log_destination_after_fork();
	// A swap server whose own pages can be swapped out deadlocks under pressure. nbdkit --swap
	// locks memory; if it did not (or the locks were not kept), lock it here.
	// (Only without a finite RLIMIT_MEMLOCK: under one, MCL_FUTURE would make later
	// allocations fail once the limit is reached.)
	rlimit rl{};
	getrlimit(RLIMIT_MEMLOCK, &rl);
	const bool unlimited = geteuid() == 0 || rl.rlim_cur == RLIM_INFINITY;
	if (locked_kib() == 0) {
		if (unlimited && mlockall(MCL_CURRENT | MCL_FUTURE) == 0)
			nbdkit_debug("rdmaswap: memory was not locked (nbdkit without --swap?): "
				     "locked it with mlockall");
		else
			warn("memory is not locked and mlockall failed (%s): run nbdkit with --swap "
			     "and a sufficient RLIMIT_MEMLOCK before using this device as swap",
			     unlimited ? err_text(errno) : "RLIMIT_MEMLOCK is limited");
	}
	// A swap device's server must not wait on memory reclaim that waits on it
	// (PR_SET_IO_FLUSHER, Linux >= 5.6, needs CAP_SYS_RESOURCE). Inherited by the worker
	// threads nbdkit starts after this.
	if (const auto why = set_io_flusher(); !why.empty())
		nbdkit_debug("rdmaswap: %s", why.c_str());
	// Real-time threads may take pages from the reserve below the min watermark: when the
	// whole host is short of memory, a reply to the kernel (a socket buffer) must not wait on
	// the reclaim that waits on that reply. Inherited by the threads nbdkit starts after this.
	if (g_cfg.realtime) {
		if (const auto why = set_realtime(int(g_cfg.realtime)); !why.empty()) {
			if (g_cfg.realtime_set)
				warn("realtime=%u: %s (needs CAP_SYS_NICE)", g_cfg.realtime,
				     why.c_str());
			else
				nbdkit_debug("rdmaswap: %s (needs CAP_SYS_NICE)", why.c_str());
		}
	}
	// Spin briefly before sleeping in data path waits only where a core is spare: decided
	// once, before any data path exists (common/transport/data_path_base.h).
	const unsigned cpus = affinity_cpus();
	set_busy_poll(g_cfg.busy_poll < 0 ? cpus >= kBusyPollMinCpus : g_cfg.busy_poll == 1);
	nbdkit_debug("rdmaswap: busy-poll=%s: %s (%u CPUs in the affinity set; auto needs %u)",
		     g_cfg.busy_poll < 0 ? "auto" : g_cfg.busy_poll ? "on" : "off",
		     busy_poll() ? "on" : "off", cpus, kBusyPollMinCpus);
	// Before anything below waits on the network (and after the settings above, which the
	// watcher's thread inherits: every thread of nbdkit's runs real-time).
	g_shutdown = std::make_unique<ShutdownWatcher>();
	try {
		g_chosen = g_cfg.transport;
		if (g_chosen == TransportKind::Auto) {
			std::string why = "no RDMA device";
			bool ok = rdma::devices_present();
			for (const auto &ep : g_reachable)
				ok = ok && rdma::can_reach(ep, g_cfg.timeout, why);
			if (g_reachable.empty()) // none probed (etcd's donors only): the first of them
				ok = ok && rdma::can_reach(g_candidates[0].ep, g_cfg.timeout, why);
			g_chosen = ok ? TransportKind::Rdma : TransportKind::Tcp;
			nbdkit_debug("rdmaswap: transport=auto chose %s%s%s", transport_name(g_chosen),
				     ok ? "" : ": ", ok ? "" : why.c_str());
		}
		if (g_chosen == TransportKind::Rdma)
			g_rdma = std::make_unique<rdma::ClientContext>(
				g_reachable.empty() ? g_candidates[0].ep : g_reachable[0], g_cfg.timeout);
		// The donors that may hold slabs of the volume, and the donor set's members.
		Membership::StartPlan plan =
			Membership::plan_start(g_cfg.spread, g_candidates, connect_donor);
		if (plan.servers.size() < g_cfg.replicas) {
			nbdkit_error("rdmaswap: %zu of %zu memservers usable for volume %s, replicas=%u "
				     "needs %u",
				     plan.servers.size(), g_servers.size(), g_cfg.volume.c_str(),
				     g_cfg.replicas, g_cfg.replicas);
			return -1;
		}
		bound_holders(plan);
		// The record before any slab or floor can go anywhere new.
		if (g_recording)
			if (const std::string why = write_holders(plan.record); !why.empty()) {
				nbdkit_error("rdmaswap: %s (a restart would not know where the volume's "
					     "slabs are)",
					     why.c_str());
				return -1;
			}
		VolumeOptions vo;
		vo.size = g_cfg.size;
		vo.channels = g_cfg.channels;
		vo.paths = g_cfg.paths;
		vo.timeout = g_cfg.timeout;
		vo.replicas = g_cfg.replicas;
		vo.missing_servers = plan.missing;
		vo.start_holders = plan.start_holders;
		vo.backup_path = g_cfg.backup;
		vo.backup_volume = g_cfg.volume;
		vo.backup_queue = g_cfg.backup_queue;
		vo.run_id = g_cfg.run_id;
		vo.previous_run_id = g_cfg.previous_run_id;
		g_volume = std::make_unique<Volume>(std::move(plan.servers), vo);
		// Donors that did not answer now, and (etcd=) those registered later, join while
		// the volume serves; with spread= only the donor set's members are connected.
		Membership::Options mo;
		mo.servers = g_cfg.servers;
		if (!g_cfg.etcd.empty())
			mo.registry = etcd_list_options();
		mo.spread = g_cfg.spread;
		mo.idle = std::chrono::seconds(g_cfg.idle_disconnect);
		if (g_recording)
			mo.record = write_holders;
		mo.recorded = plan.record;
		mo.holders_ignored = g_holders_ignored;
		// What the start learnt: etcd's listing (the watch goes on from its revision) and
		// the probes' answers; later registrations are probed before they are used.
		mo.registered = std::move(g_registered);
		mo.ignored = g_ignored;
		mo.revision = g_listed_revision;
		for (const auto &c : g_candidates)
			if (c.probed)
				mo.probed.push_back({c.ep, c.reachable, c.hint});
		mo.probe = probe_donor;
		mo.timeout = g_cfg.timeout;
		if (g_throw_steps)
			mo.fault = [left = g_throw_steps]() mutable {
				if (left > 0 && left--)
					throw std::out_of_range("test fault (RDMASWAP_TEST_THROW=membership)");
			};
		g_membership = std::make_unique<Membership>(*g_volume, connect_donor, std::move(mo),
							    plan.start);
		g_membership->start();
		if (g_throw_start)
			throw std::runtime_error("test fault (RDMASWAP_TEST_THROW=start)");
	} catch (const std::exception &e) {
		nbdkit_error("rdmaswap: %s", e.what());
		return -1;
	}
	if (!g_statusfile.empty() || !g_metricsfile.empty())
		g_status = std::make_unique<StatusWriter>();
	nbdkit_debug("rdmaswap: volume of %llu bytes over %zu memserver(s) via %s, slab size %llu, "
		     "%u replica(s)",
		     (unsigned long long)g_cfg.size, g_reachable.size(), transport_name(g_chosen),
		     (unsigned long long)g_volume->slab_size(), g_cfg.replicas);
	return 0;
}

int rdmaswap_after_fork()
{
	const int r = start_serving();
	if (r)
		stop_threads(); // before nbdkit exits (S11)
	return r;
}

void *rdmaswap_open(int)
{
	return g_volume.get(); // the volume is shared by every connection (multi-conn safe)
}

int64_t rdmaswap_get_size(void *)
{
	return int64_t(g_volume->size());
}

int rdmaswap_block_size(void *, uint32_t *minimum, uint32_t *preferred, uint32_t *maximum)
{
	*minimum = 1;
	*preferred = 4096;
	*maximum = 0xffffffff;
	return 0;
}

int rdmaswap_can_multi_conn(void *) { return 1; }
int rdmaswap_can_trim(void *) { return 1; }
int rdmaswap_can_zero(void *) { return 1; }
int rdmaswap_can_fast_zero(void *) { return 1; }
int rdmaswap_can_flush(void *) { return 1; }
int rdmaswap_is_rotational(void *) { return 0; }
// Writes return only once the memserver holds the bytes, so FUA needs no extra work.
int rdmaswap_can_fua(void *) { return NBDKIT_FUA_NATIVE; }

int rdmaswap_pread(void *, void *buf, uint32_t count, uint64_t offset, uint32_t)
{
	const int err = g_volume->pread(buf, count, offset);
	return err ? fail(err, "read") : 0;
}

int rdmaswap_pwrite(void *, const void *buf, uint32_t count, uint64_t offset, uint32_t)
{
	if (g_throw_writes.load(std::memory_order_relaxed) > 0 && g_throw_writes.fetch_sub(1) > 0)
		throw std::runtime_error("test fault (RDMASWAP_TEST_THROW=write)");
	const int err = g_volume->pwrite(buf, count, offset);
	return err ? fail(err, "write") : 0;
}

int rdmaswap_flush(void *, uint32_t)
{
	return 0; // every completed write is already on its memserver
}

int rdmaswap_trim(void *, uint32_t count, uint64_t offset, uint32_t)
{
	const int err = g_volume->trim(count, offset);
	return err ? fail(err, "trim") : 0;
}

int rdmaswap_zero(void *, uint32_t count, uint64_t offset, uint32_t flags)
{
	const bool fast = flags & NBDKIT_FLAG_FAST_ZERO;
	const int err = g_volume->zero(count, offset, fast);
	if (err == ENOTSUP && fast) {
		nbdkit_set_error(ENOTSUP); // not an error: the client falls back to writing
		return -1;
	}
	return err ? fail(err, "zero") : 0;
}

struct nbdkit_plugin make_plugin() noexcept
{
	struct nbdkit_plugin p = nbdkit_plugin();
	p.name = "rdmaswap";
	p.longname = "rdmaswap remote-memory swap";
	p.version = RDMASWAP_VERSION;
	p.description = "Block device backed by remote memory (memservers over RDMA or TCP)";
	p.load = Boundary<"load", rdmaswap_load>::call;
	p.unload = Boundary<"unload", rdmaswap_unload>::call;
	p.config = Boundary<"config", rdmaswap_config>::call;
	p.config_complete = Boundary<"config_complete", rdmaswap_config_complete>::call;
	p.config_help = "server=HOST[:PORT]  (repeatable) memserver address (server= or etcd=\n"
			"                    is required)\n"
			"etcd=URL[,URL...]   use the memservers registered in etcd, found at\n"
			"                    start and watched (http://HOST:PORT of its members)\n"
			"etcd-prefix=PREFIX  etcd key prefix (default /rdmaswap/)\n"
			"etcd-cacert=FILE    CA (PEM) of etcd's https:// certificate\n"
			"                    (default: the system's)\n"
			"etcd-cert=FILE      client certificate (PEM) for etcd, with etcd-key=\n"
			"etcd-key=FILE       its private key (PEM, mode 0600)\n"
			"etcd-user=NAME      etcd user, with etcd-password-file=\n"
			"etcd-password-file=FILE  its password (mode 0600)\n"
			"donor-cache=FILE    the donors of the last etcd listing, read when etcd\n"
			"                    is down (default: STATE/VOLUME.donors beside the\n"
			"                    default volume key)\n"
			"size=SIZE           (required) size of the device\n"
			"transport=tcp|rdma|auto  data path (default auto)\n"
			"channels=N          data channels (default 16)\n"
			"paths=N             data connections (RDMA: QPs) to each donor,\n"
			"                    shared by the channels (default 4)\n"
			"spread=N            donors the volume places new slabs on, and the\n"
			"                    only ones it connects to besides those holding its\n"
			"                    slabs (default 8; 0: every donor)\n"
			"idle-disconnect=SECONDS  disconnect a donor outside the set that held\n"
			"                    nothing of the volume this long (default 60; 0: never)\n"
			"replicas=N          copies of each slab on distinct servers\n"
			"                    (default 2 with two or more servers, else 1)\n"
			"timeout=SECONDS     bound on each network operation (default 10)\n"
			"statusfile=PATH     write the volume's status there every second\n"
			"metrics-file=PATH   write its metrics there every second (Prometheus\n"
			"                    text format, for node_exporter's textfile collector)\n"
			"backup=FILE         also write every write to this local file; it serves\n"
			"                    slabs no memserver holds any more (default: none)\n"
			"backup-queue=SIZE   writes queued for the backup file at most (default\n"
			"                    32M); when full, writes wait for the disk\n"
			"auth-key=FILE       the cluster's shared key (required unless insecure)\n"
			"donor-ca=FILE       use only donors certified by this CA (public key)\n"
			"donor-crl=FILE      the CA's revocation list (re-read when it changes)\n"
			"insecure=true       memservers run with --insecure (no authentication)\n"
			"volume=NAME         the volume's id on the memservers (default: derived\n"
			"                    from host name, size, server= and etcd-prefix=)\n"
			"volume-key=FILE     this host's secret that owns its volumes (created\n"
			"                    if missing; default $STATE_DIRECTORY/volume.key,\n"
			"                    /var/lib/rdmaswap/volume.key as root, else\n"
			"                    ~/.local/state/rdmaswap/volume.key)\n"
			"lease=SECONDS       keep the slabs this long after nbdkit exits, for a\n"
			"                    restarted nbdkit to reattach (default 60; 0: free them)\n"
			"realtime=PRIORITY   SCHED_RR priority of nbdkit's threads, so that they may\n"
			"                    use the kernel's reserve under memory pressure\n"
			"                    (default 1; 0: leave the scheduling alone)\n"
			"busy-poll=auto|on|off  spin up to 50 us before sleeping while waiting\n"
			"                    for a memserver (default auto: on with 8 or more\n"
			"                    CPUs in nbdkit's affinity set)";
	p.magic_config_key = "server";
	p.dump_plugin = Boundary<"dump_plugin", rdmaswap_dump_plugin>::call;
	p.get_ready = Boundary<"get_ready", rdmaswap_get_ready>::call;
	p.after_fork = Boundary<"after_fork", rdmaswap_after_fork>::call;
	p.open = Boundary<"open", rdmaswap_open>::call;
	p.get_size = Boundary<"get_size", rdmaswap_get_size>::call;
	p.block_size = Boundary<"block_size", rdmaswap_block_size>::call;
	p.can_multi_conn = Boundary<"can_multi_conn", rdmaswap_can_multi_conn>::call;
	p.can_trim = Boundary<"can_trim", rdmaswap_can_trim>::call;
	p.can_zero = Boundary<"can_zero", rdmaswap_can_zero>::call;
	p.can_fast_zero = Boundary<"can_fast_zero", rdmaswap_can_fast_zero>::call;
	p.can_flush = Boundary<"can_flush", rdmaswap_can_flush>::call;
	p.can_fua = Boundary<"can_fua", rdmaswap_can_fua>::call;
	p.is_rotational = Boundary<"is_rotational", rdmaswap_is_rotational>::call;
	p.pread = Boundary<"pread", rdmaswap_pread>::call;
	p.pwrite = Boundary<"pwrite", rdmaswap_pwrite>::call;
	p.flush = Boundary<"flush", rdmaswap_flush>::call;
	p.trim = Boundary<"trim", rdmaswap_trim>::call;
	p.zero = Boundary<"zero", rdmaswap_zero>::call;
	return p;
}

struct nbdkit_plugin plugin = make_plugin();

} // namespace

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
NBDKIT_REGISTER_PLUGIN(plugin)
