// SPDX-License-Identifier: MIT
// The plugin's keys (plugin.h): .config reads one key into g_cfg by a table, one row per key;
// .config_complete checks them together, reads the files they name (keys, certificates, etcd
// credentials) and names the volume's files. A new key: a row in keys() below, a line in
// kConfigHelp, and docs/man/nbdkit-rdmaswap-plugin.1.in.
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/obs/log.h"
#include "common/volume/reattach.h"
#include "common/util/encoding.h"
#include "common/wire/protocol.h"
#include "nbdkit-plugin/plugin.h"

namespace rdmaswap::plugin {

Config g_cfg; // NOLINT(cert-err58-cpp): its defaults allocate nothing; made at dlopen
std::unique_ptr<state::RunFile> g_run;

namespace {

// A path parameter (`key`=`value`), made absolute (nbdkit changes directory): 0, or -1 after
// an error message.
int config_path(const char *key, const char *value, std::string &out)
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

// How one key is read: 0, or -1 after an error message (nbdkit's parsers write their own).
using Setter = std::function<int(const char *key, const char *value)>;

// A path, made absolute.
Setter path(std::string &out)
{
	return [&out](const char *key, const char *value) { return config_path(key, value, out); };
}

// An unsigned number in [min, max]; outside it, "KEY=VALUE: `range`". Sets *given if non-null.
Setter number(unsigned &out, unsigned min, unsigned max, std::string range, bool *given = nullptr)
{
	return [&out, min, max, range = std::move(range), given](const char *key, const char *value) {
		if (nbdkit_parse_unsigned(key, value, &out) < 0)
			return -1;
		if (out < min || out > max) {
			nbdkit_error("rdmaswap: %s=%s: %s", key, value, range.c_str());
			return -1;
		}
		if (given)
			*given = true;
		return 0;
	};
}

// A size (nbdkit_parse_size) that `check` accepts ("" if it does; else why, after "KEY=VALUE: ").
Setter size(uint64_t &out, std::function<std::string(int64_t)> check)
{
	return [&out, check = std::move(check)](const char *key, const char *value) {
		const int64_t s = nbdkit_parse_size(value);
		if (s < 0)
			return -1;
		if (const std::string why = check(s); !why.empty()) {
			nbdkit_error("rdmaswap: %s=%s: %s", key, value, why.c_str());
			return -1;
		}
		out = uint64_t(s);
		return 0;
	};
}

struct Key {
	std::string_view name;
	Setter set;
};

// Every key but the etcd-* security keys (set_etcd_security_key, common/util/config.h).
const std::vector<Key> &keys()
{
	static const std::vector<Key> table = {
		{"server",
		 [](const char *, const char *value) {
			 auto ep = parse_endpoint(value);
			 if (!ep) {
				 nbdkit_error("rdmaswap: server=%s: expected HOST[:PORT]", value);
				 return -1;
			 }
			 g_cfg.servers.push_back(*ep);
			 return 0;
		 }},
		{"etcd",
		 [](const char *, const char *value) {
			 auto eps = etcd::parse_endpoints(value);
			 if (!eps) {
				 nbdkit_error("rdmaswap: etcd=%s: %s", value, eps.error.c_str());
				 return -1;
			 }
			 g_cfg.etcd.insert(g_cfg.etcd.end(), eps->begin(), eps->end());
			 return 0;
		 }},
		{"etcd-prefix",
		 [](const char *, const char *value) {
			 if (!*value) {
				 nbdkit_error("rdmaswap: etcd-prefix= must not be empty");
				 return -1;
			 }
			 g_cfg.etcd_prefix = value;
			 g_cfg.etcd_prefix_set = true;
			 return 0;
		 }},
		{"donor-cache", path(g_cfg.donor_cache)},
		{"backup", path(g_cfg.backup)},
		{"backup-queue", size(g_cfg.backup_queue,
				      [](int64_t s) {
					      return s < (1 << 20) || s > (int64_t(1) << 32)
							     ? "must be between 1M and 4G"
							     : "";
				      })},
		{"size", size(g_cfg.size,
			      [](int64_t s) {
				      return s == 0 || s % 4096 != 0
						     ? "must be a non-zero multiple of 4096"
						     : "";
			      })},
		{"transport",
		 [](const char *, const char *value) {
			 auto t = parse_transport(value);
			 if (!t) {
				 nbdkit_error("rdmaswap: transport=%s: expected tcp, rdma or auto",
					      value);
				 return -1;
			 }
			 g_cfg.transport = *t;
			 return 0;
		 }},
		{"spread", number(g_cfg.spread, 0, unsigned(Volume::kMaxServers),
				  fmt::format("at most {} (0: every donor)", Volume::kMaxServers))},
		{"idle-disconnect",
		 number(g_cfg.idle_disconnect, 0, 86400, "at most 86400 seconds (0: never)")},
		{"channels", number(g_cfg.channels, 1, 1024, "must be between 1 and 1024")},
		{"paths", number(g_cfg.paths, 0, 1024, "must be between 0 (one per channel) and 1024")},
		{"statusfile", path(g_cfg.statusfile)},
		{"metrics-file", path(g_cfg.metricsfile)},
		{"replicas", number(g_cfg.replicas, 1, Volume::kMaxReplicas,
				    fmt::format("must be between 1 and {}", Volume::kMaxReplicas))},
		{"timeout",
		 [](const char *key, const char *value) {
			 unsigned t = 0;
			 if (number(t, 1, 3600, "seconds between 1 and 3600")(key, value) < 0)
				 return -1;
			 g_cfg.timeout = std::chrono::seconds(t);
			 return 0;
		 }},
		{"donor-ca", path(g_cfg.donor_ca)},
		{"donor-crl", path(g_cfg.donor_crl)},
		{"auth-key",
		 [](const char *, const char *value) {
			 try {
				 g_cfg.auth_key = load_auth_key(value);
			 } catch (const std::exception &e) {
				 nbdkit_error("rdmaswap: auth-key=: %s", e.what());
				 return -1;
			 }
			 return 0;
		 }},
		{"volume",
		 [](const char *, const char *value) {
			 if (!proto::valid_volume_name(value)) {
				 nbdkit_error("rdmaswap: volume=%s: 1 to %zu characters, each a "
					      "printable ASCII character other than space",
					      value, proto::kMaxVolumeName);
				 return -1;
			 }
			 g_cfg.volume = value;
			 return 0;
		 }},
		{"volume-key", path(g_cfg.volume_key_path)},
		{"lease", number(g_cfg.lease, 0, 7 * 86400, "seconds between 0 and 604800")},
		{"realtime", number(g_cfg.realtime, 0, 99,
				    "a SCHED_RR priority between 1 and 99, or 0 to leave the "
				    "scheduling alone",
				    &g_cfg.realtime_set)},
		{"busy-poll",
		 [](const char *, const char *value) {
			 if (std::strcmp(value, "auto") == 0) {
				 g_cfg.busy_poll = -1;
			 } else if (std::strcmp(value, "on") == 0 || std::strcmp(value, "off") == 0) {
				 g_cfg.busy_poll = value[1] == 'n';
			 } else {
				 nbdkit_error("rdmaswap: busy-poll=%s: expected auto, on or off", value);
				 return -1;
			 }
			 return 0;
		 }},
		{"insecure",
		 [](const char *, const char *value) {
			 const int b = nbdkit_parse_bool(value);
			 if (b < 0)
				 return -1;
			 g_cfg.insecure = b;
			 return 0;
		 }},
	};
	return table;
}

} // namespace

int config(const char *key, const char *value)
{
	for (const Key &k : keys())
		if (k.name == key)
			return k.set(key, value);
	if (std::string why; set_etcd_security_key(g_cfg.etcd_security, key, value, why)) {
		if (!why.empty()) {
			nbdkit_error("rdmaswap: %s", why.c_str());
			return -1;
		}
		return 0;
	}
	nbdkit_error("rdmaswap: unknown parameter '%s' (see nbdkit-rdmaswap-plugin(1))", key);
	return -1;
}

int config_complete()
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

const char kConfigHelp[] = "server=HOST[:PORT]  (repeatable) memserver address (server= or etcd=\n"
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
	"paths=N             data connections (RDMA: QPs) to each donor\n"
	"                    (default 0: one per channel; fewer are shared)\n"
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

} // namespace rdmaswap::plugin
