// SPDX-License-Identifier: MIT
// rdmaswap-memserver: donate this host's memory as slabs to rdmaswap clients.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/net/etcd.h"
#include "common/obs/guarded_main.h"
#include "common/obs/log.h"
#include "common/util/config.h"
#include "common/util/swap_safety.h"
#include "common/wire/auth.h"
#include "common/wire/donor_cert.h"
#include "memserver/metrics_http.h"
#include "memserver/registry.h"
#include "memserver/server.h"

namespace {
// Read by the signal handler, which may run on any thread (the Memserver's own threads start
// before g_server is set): atomics, lock-free, so no data race and async-signal-safe. A signal
// before the server exists is remembered and stops it once it does.
std::atomic<rdmaswap::Memserver *> g_server{nullptr};
std::atomic<bool> g_stop_signalled{false};
static_assert(std::atomic<rdmaswap::Memserver *>::is_always_lock_free);
static_assert(std::atomic<bool>::is_always_lock_free);

void on_signal(int)
{
	g_stop_signalled.store(true);
	if (auto *server = g_server.load())
		server->stop();
}
// --donor-key and --donor-cert: both or neither; the certificate must be for that key and not
// expired. Returns 0, or the exit status after logging why.
int load_donor_credentials(const std::string &key_file, const std::string &cert_file,
			   rdmaswap::MemserverOptions &opts)
{
	using namespace rdmaswap;
	const auto &log = logger("memserver");
	if (key_file.empty() != cert_file.empty()) {
		log->error("--donor-key and --donor-cert go together (the certificate certifies the "
			   "key)");
		return 2;
	}
	if (key_file.empty()) {
		if (!opts.insecure)
			log->info("no --donor-cert: plugins with donor-ca= will refuse this memserver");
		return 0;
	}
	if (opts.insecure) {
		log->error("--donor-cert needs authentication, which --insecure turns off");
		return 2;
	}
	try {
		opts.donor_key = SigningKey::load(key_file, "donor key");
		opts.donor_cert = read_cert_file(cert_file, kMaxCertSize, "donor certificate");
	} catch (const std::exception &e) {
		log->error("{}", e.what());
		return 2;
	}
	std::string err;
	const auto cert = parse_cert(opts.donor_cert, err);
	if (!cert) {
		log->error("--donor-cert {}: not a donor certificate: {}", cert_file, err);
		return 2;
	}
	if (cert->donor != opts.donor_key->public_key()) {
		log->error("--donor-cert {} certifies another key than --donor-key {} (issue it for "
			   "this key: rdmaswapctl cert issue donor-key=...)",
			   cert_file, key_file);
		return 2;
	}
	const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
				    std::chrono::system_clock::now().time_since_epoch())
				    .count();
	if (now >= cert->not_after) {
		log->error("--donor-cert {} expired (serial {}): ask the operator for a new one",
			   cert_file, cert->serial);
		return 2;
	}
	if (now < cert->not_before)
		log->warn("--donor-cert {} is not valid yet: plugins refuse it until then",
			  cert_file);
	const std::string port = ":" + std::to_string(opts.port);
	if (opts.port != 0 &&
	    std::none_of(cert->addresses.begin(), cert->addresses.end(), [&](const auto &a) {
		    return a.size() > port.size() && a.ends_with(port);
	    }))
		log->warn("--donor-cert {} lists no address with port {}: plugins dialling this "
			  "memserver will refuse it",
			  cert_file, opts.port);
	log->info("donor certificate '{}' serial {} for {} address(es)", cert->name, cert->serial,
		  cert->addresses.size());
	return 0;
}

int run(int argc, char **argv)
{
	using namespace rdmaswap;
	CLI::App app{"rdmaswap-memserver: serve this host's memory to rdmaswap clients as swap"};
	MemserverOptions opts;
	std::string capacity = "1G", slab_size = "256M", transport = "auto", level = "info";
	std::string reserve;
	bool realtime = false;
	std::vector<std::string> key_files, admin_files;
	std::string donor_key_file, donor_cert_file;
	unsigned handshake_ms = 5000;
	unsigned message_s = 10;
	app.add_option("--listen", opts.listen, "address to listen on (default 0.0.0.0)");
	app.add_option("--port", opts.port, "TCP and RDMA-CM port (default 7471)");
	app.add_option("--capacity", capacity, "memory to donate, e.g. 4G (default 1G)");
	app.add_option("--slab-size", slab_size, "slab size, a power of two >= 64K (default 256M)");
	app.add_option("--transport", transport, "tcp, rdma or auto (default auto)");
	app.add_option("--max-connections", opts.max_connections,
		       "connections served at once; more are closed at once (default 1024)");
	app.add_option("--threads", opts.threads,
		       "event loops serving TCP connections (default 8; 0: one per CPU, at most 16)");
	app.add_option("--workers", opts.workers,
		       "threads for blocking requests: registration, session changes (default 4; "
		       "one more serves handshakes only, and one zeroes freed slabs)");
	app.add_option("--auth-key", key_files,
		       "file with the cluster's shared key (mode 600); give it twice to accept "
		       "an old and a new key during a rotation");
	app.add_option("--admin-key", admin_files,
		       "file with the admin key (mode 600, not the cluster key): needed for "
		       "GIVEBACK, LEND and listing other clients' sessions; give it twice "
		       "during a rotation");
	app.add_option("--donor-key", donor_key_file,
		       "this donor's signing key (mode 600; rdmaswapctl donor-key create)");
	app.add_option("--donor-cert", donor_cert_file,
		       "this donor's certificate from the operator's CA (rdmaswapctl cert issue): "
		       "plugins with donor-ca= use only certified donors");
	app.add_flag("--insecure", opts.insecure,
		     "run WITHOUT authentication (trusted networks only)");
	app.add_option("--handshake-timeout", handshake_ms,
		       "milliseconds a new connection has to authenticate and say HELLO "
		       "(default 5000)");
	app.add_option("--message-timeout", message_s,
		       "seconds a peer has to send a message whole once it has started it, and to "
		       "take a reply whole; slower peers are disconnected (default 10)");
	app.add_option("--reserve", reserve,
		       "give slabs back to this host while its MemAvailable is below SIZE, "
		       "e.g. 2G (default: off)");
	app.add_flag("--realtime", realtime,
		     "run at SCHED_RR priority 1, for a host that swaps into this memserver "
		     "itself (see rdmaswap-memserver(8))");
	app.add_option("--max-lease", opts.max_lease_s,
		       "longest lease= a client may bind a volume with, in seconds; a longer one "
		       "is refused (default 86400)");
	app.add_option("--max-floors", opts.max_floors,
		       "epoch floors per session; more are refused (default 65536)");
	app.add_option("--max-owner-share", opts.max_owner_share,
		       "percent of the slabs one owner (a volume key) may hold; more ALLOCs are "
		       "refused with ENOSPC (default 100: no quota; set it on donors that "
		       "several hosts share)");
	app.add_option("--max-owner-slabs", opts.max_owner_slabs,
		       "slabs one owner (a volume key) may hold at most (default 0: only "
		       "--max-owner-share applies)");
	int64_t max_peer_owners = -1; // (unset: 16 with a quota, else none)
	app.add_option("--max-peer-owners", max_peer_owners,
		       "distinct volume keys one address may bind within the last --max-lease "
		       "(at least an hour); more BINDs are refused with EUSERS (0: no bound; "
		       "default 16 when --max-owner-share or --max-owner-slabs sets a quota, "
		       "else 0)");
	app.add_option("--max-peer-sessions", opts.max_peer_sessions,
		       "sessions (live or detached) created from one address; more are refused "
		       "(default 64)");
	app.add_option("--connect-rate", opts.connect_rate,
		       "new connections per second from one address, in bursts of twice that; "
		       "more are closed at once (default 150; 0: no limit)");
	app.add_option("--max-peer-connections", opts.max_peer_connections,
		       "connections open at once from one address (at most --max-connections); "
		       "more are closed at once (default 384)");
	app.add_option("--metrics-listen", opts.metrics_listen,
		       "serve Prometheus metrics at http://ADDR:PORT/metrics, e.g. "
		       "127.0.0.1:9471 (default: off)");
	std::string etcd_urls, advertise, etcd_prefix = "/rdmaswap/";
	app.add_option("--etcd", etcd_urls,
		       "register this memserver in etcd at these client URLs "
		       "(http://HOST:PORT[,...]); needs --advertise");
	app.add_option("--advertise", advertise,
		       "HOST:PORT that clients dial to reach this memserver, published in etcd");
	app.add_option("--etcd-prefix", etcd_prefix,
		       "etcd key prefix; the key is PREFIX donors/HOST:PORT (default /rdmaswap/)");
	EtcdSecurity etcd_security; // https:// and etcd's auth (docs/deployment.md)
	app.add_option("--etcd-cacert", etcd_security.cacert,
		       "CA certificates (PEM) that etcd's certificate must chain to (default: the "
		       "system's)");
	app.add_option("--etcd-cert", etcd_security.cert,
		       "client certificate (PEM) presented to etcd; needs --etcd-key");
	app.add_option("--etcd-key", etcd_security.key,
		       "its private key (PEM; mode 0600, owned by this user)");
	app.add_option("--etcd-user", etcd_security.user,
		       "etcd user to authenticate as; needs --etcd-password-file");
	app.add_option("--etcd-password-file", etcd_security.password_file,
		       "file holding that user's password (mode 0600, owned by this user)");
	app.add_option("--log-level", level, "trace, debug, info, warn, error (default info)");
	CLI11_PARSE(app, argc, argv);

	auto log = logger("memserver");
	if (!set_log_level(level)) {
		log->error("unknown --log-level '{}'", level);
		return 2;
	}
	const auto cap = parse_size(capacity);
	const auto slab = parse_size(slab_size);
	const auto kind = parse_transport(transport);
	if (!cap) {
		log->error("--capacity '{}' is not a size (examples: 512M, 4G)", capacity);
		return 2;
	}
	if (!slab) {
		log->error("--slab-size '{}' is not a size (examples: 64M, 256M)", slab_size);
		return 2;
	}
	if (!kind) {
		log->error("--transport must be tcp, rdma or auto, not '{}'", transport);
		return 2;
	}
	if (!reserve.empty()) {
		const auto r = parse_size(reserve);
		if (!r || *r == 0) {
			log->error("--reserve '{}' is not a size (examples: 512M, 2G)", reserve);
			return 2;
		}
		opts.reserve = *r;
	}
	RegistryOptions reg;
	if (etcd_urls.empty() != advertise.empty()) {
		log->error("--etcd and --advertise go together: give both or neither");
		return 2;
	}
	if (!etcd_urls.empty()) {
		auto eps = etcd::parse_endpoints(etcd_urls);
		if (!eps) {
			log->error("--etcd: {}", eps.error);
			return 2;
		}
		const auto adv = parse_endpoint(advertise, 0);
		if (!adv || adv->port == 0) {
			log->error("--advertise '{}' is not HOST:PORT (what clients dial)", advertise);
			return 2;
		}
		if (etcd_prefix.empty()) {
			log->error("--etcd-prefix must not be empty");
			return 2;
		}
		reg.endpoints = std::move(*eps);
		reg.advertise = adv->str();
		reg.prefix = etcd_prefix;
	}
	if (const std::string why = check_etcd_security(etcd_security, reg.endpoints, "--");
	    !why.empty()) {
		log->error("{}", why);
		return 2;
	}
	if (etcd_security.any()) {
		try { // (read now: the files need not stay readable)
			reg.credentials = std::make_shared<const etcd::Credentials>(etcd_security);
		} catch (const std::exception &e) {
			log->error("{}", e.what());
			return 2;
		}
	}
	// Test hook: read MemAvailable from another file than /proc/meminfo.
	if (const char *m = getenv("RDMASWAP_MEMINFO"); m && *m)
		opts.meminfo = m;
	opts.capacity = *cap;
	opts.slab_size = *slab;
	opts.transport = *kind;
	if (opts.max_connections == 0) {
		log->error("--max-connections must be at least 1");
		return 2;
	}
	if (opts.threads > 256 || opts.workers == 0 || opts.workers > 256) {
		log->error("--threads must be 0 (one per CPU) to 256, --workers 1 to 256");
		return 2;
	}
	if (opts.max_owner_share == 0 || opts.max_owner_share > 100 || max_peer_owners < -1 ||
	    max_peer_owners > 1000000) {
		log->error("--max-owner-share must be 1 to 100 (percent), --max-peer-owners 0 to "
			   "1000000");
		return 2;
	}
	// Volume keys are free to mint: a quota per key is worth something only if the keys one
	// address may bind are bounded too.
	const bool quota = opts.max_owner_share < 100 || opts.max_owner_slabs > 0;
	opts.max_peer_owners = max_peer_owners >= 0 ? unsigned(max_peer_owners) : quota ? 16 : 0;
	if (opts.max_floors == 0 || opts.max_peer_sessions == 0 || opts.max_peer_connections == 0) {
		log->error("--max-floors, --max-peer-sessions and --max-peer-connections must be at "
			   "least 1");
		return 2;
	}
	if (handshake_ms == 0 || handshake_ms > 600000) {
		log->error("--handshake-timeout must be between 1 and 600000 ms");
		return 2;
	}
	opts.handshake_timeout = std::chrono::milliseconds(handshake_ms);
	if (!opts.metrics_listen.empty() && !parse_listen_addr(opts.metrics_listen)) {
		log->error("--metrics-listen '{}' is not ADDR:PORT with a numeric address "
			   "(examples: 127.0.0.1:9471, [::1]:9471, 0.0.0.0:9471)",
			   opts.metrics_listen);
		return 2;
	}
	if (message_s == 0 || message_s > 3600) {
		log->error("--message-timeout must be between 1 and 3600 seconds");
		return 2;
	}
	opts.message_timeout = std::chrono::seconds(message_s);
	// Test hook: pause inside each session transition (tests/integration/test-lifecycle-race.sh).
	if (const char *p = getenv("RDMASWAP_TEST_LIFECYCLE_PAUSE_MS"); p && *p)
		opts.test_lifecycle_pause = std::chrono::milliseconds(std::strtoul(p, nullptr, 10));
	try { // the Memserver checks that there is a key or --insecure, not both
		for (const auto &f : key_files)
			opts.auth_keys.push_back(load_auth_key(f));
		for (const auto &f : admin_files)
			opts.admin_keys.push_back(load_auth_key(f, "admin key"));
	} catch (const std::exception &e) {
		log->error("{}", e.what());
		return 2;
	}
	if (int r = load_donor_credentials(donor_key_file, donor_cert_file, opts))
		return r;

	struct sigaction sa {};
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, nullptr);
	sigaction(SIGTERM, &sa, nullptr);
	signal(SIGPIPE, SIG_IGN);

	// A memserver on a host that swaps into it (or into another memserver on it) must not wait
	// on reclaim while serving: its threads do no I/O in reclaim (PR_SET_IO_FLUSHER, set
	// before any thread starts so all inherit it) and its pages cannot be swapped out. In
	// particular RDMA registration of a slab at ALLOC (ibv_reg_mr) allocates kernel memory
	// while a page-out waits for that ALLOC.
	if (opts.lock_memory) {
		if (auto r = set_io_flusher(); !r)
			log->warn("{} (needs CAP_SYS_RESOURCE): a page-out on this host that waits "
				  "for this memserver may deadlock under memory pressure", r.error);
		if (auto r = lock_memory_onfault(); !r)
			log->warn("{}: the memserver's own pages may be swapped out", r.error);
	}
	// On a host that swaps into this memserver, its socket buffers and its memory-region
	// registrations must not wait on reclaim either: real-time threads may allocate below
	// the min watermark. Before any thread starts, so all inherit it.
	if (realtime) {
		if (auto r = set_realtime(1); !r) {
			log->error("--realtime: {} (needs CAP_SYS_NICE)", r.error);
			return 1;
		}
	}
	try {
		Memserver server(opts);
		// the signal handler's pointer, unset before `server` is destroyed however this
		// block ends
		struct Published {
			explicit Published(Memserver &s) { g_server.store(&s); }
			~Published() { g_server.store(nullptr); }
			Published(const Published &) = delete;
			Published &operator=(const Published &) = delete;
		} published(server);
		if (g_stop_signalled.load())
			server.stop();
		std::unique_ptr<Registry> registry; // before `server` goes: it reads its counts
		if (!reg.endpoints.empty()) {
			reg.transport = opts.transport == TransportKind::Auto && !server.rdma_enabled()
						? "tcp"
						: transport_name(opts.transport);
			reg.auth = !opts.insecure;
			reg.slab_size = server.slab_size();
			reg.slabs_total = server.slabs_total();
			reg.boot_id = make_boot_id();
			reg.donor_key = opts.donor_key; // (signed registrations: registry.h)
			reg.donor_cert = opts.donor_cert;
			registry = std::make_unique<Registry>(reg, [&server] {
				return RegistryHints{server.slabs_free(), server.sessions()};
			});
		}
		server.run();
		if (registry)
			registry->stop(); // deregister (bounded) before the process goes
	} catch (const std::exception &e) {
		log->error("{}", e.what());
		return 1;
	}
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	return rdmaswap::guarded_main("rdmaswap-memserver", run, argc, argv);
}
