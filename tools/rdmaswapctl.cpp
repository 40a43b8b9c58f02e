// SPDX-License-Identifier: MIT
// rdmaswapctl: ask memservers for their state; list and prune the plugin's state files.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/obs/guarded_main.h"
#include "common/transport/control_client.h"
#include "common/util/config.h"
#include "common/util/err_text.h"
#include "common/volume/state_files.h"
#include "common/wire/volume_key.h"
#include "tools/rdmaswapctl_cert.h"

namespace {

// `s` as a JSON string, quotes included.
std::string json_string(const std::string &s)
{
	std::string out = "\"";
	for (unsigned char c : s) {
		if (c == '"' || c == '\\') {
			out += '\\';
			out += char(c);
		} else if (c < 0x20) {
			char buf[8];
			std::snprintf(buf, sizeof buf, "\\u%04x", c);
			out += buf;
		} else {
			out += char(c);
		}
	}
	return out + "\"";
}

// A decimal number that JSON can carry as a number: digits only, no leading zero.
bool json_number(const std::string &s)
{
	return !s.empty() && s.size() <= 19 && s.find_first_not_of("0123456789") == std::string::npos &&
	       (s == "0" || s[0] != '0');
}

// The report on one server= or volume=: `key=value` lines (printed as they come), or with
// --json one JSON object on one line (printed by end()); numbers as numbers.
class Report {
public:
	explicit Report(bool json) : json_(json) {}
	void str(const std::string &k, const std::string &v)
	{
		if (json_)
			field(k, json_string(v));
		else
			std::printf("%s=%s\n", k.c_str(), v.c_str());
	}
	void num(const std::string &k, long long v)
	{
		if (json_)
			field(k, std::to_string(v));
		else
			std::printf("%s=%lld\n", k.c_str(), v);
	}
	// A value from a key=value line: a number if it looks like one.
	void value(const std::string &k, const std::string &v)
	{
		if (json_ && json_number(v))
			field(k, v);
		else
			str(k, v);
	}
	// JSON only: a value that is JSON already (an array, an object).
	void json(const std::string &k, const std::string &v) { field(k, v); }
	bool is_json() const { return json_; }
	void end()
	{
		if (json_)
			std::printf("{%s}\n", body_.c_str());
		else
			std::printf("\n");
	}

private:
	void field(const std::string &k, const std::string &v)
	{
		if (!body_.empty())
			body_ += ',';
		body_ += json_string(k) + ":" + v;
	}
	bool json_;
	std::string body_;
};

// "ADDR k=v k=v" (a status file's donor.N value) as a JSON object: {"address":ADDR,"k":v...}.
std::string donor_json(const std::string &v)
{
	std::string out = "{";
	size_t pos = 0;
	bool first = true;
	while (pos < v.size()) {
		size_t end = v.find(' ', pos);
		if (end == std::string::npos)
			end = v.size();
		const std::string tok = v.substr(pos, end - pos);
		pos = end + 1;
		if (tok.empty())
			continue;
		const size_t eq = tok.find('=');
		const std::string k = first || eq == std::string::npos ? "address" : tok.substr(0, eq);
		const std::string val = first || eq == std::string::npos ? tok : tok.substr(eq + 1);
		out += std::string(first ? "" : ",") + json_string(k) + ":" +
		       (json_number(val) ? val : json_string(val));
		first = false;
	}
	return out + "}";
}

int usage()
{
	std::fprintf(stderr, "usage: rdmaswapctl status [--json] [server=HOST[:PORT] ...] [volume=STATUSFILE]\n"
			     "       [timeout=SECONDS] [auth-key=FILE | admin-key=FILE | insecure=true]\n"
			     "       rdmaswapctl giveback|lend server=HOST[:PORT] size=SIZE\n"
			     "       [timeout=SECONDS] [admin-key=FILE | insecure=true]\n"
			     "       rdmaswapctl state list|prune [dir=DIR] [older-than=AGE]\n"
			     "       rdmaswapctl ca|donor-key|cert|crl ...  (donor certificates)\n"
			     "  server=  a memserver's capacity, free slabs, bytes served and the\n"
			     "           sessions of this host (auth-key=: the cluster key), or of\n"
			     "           every client (admin-key=: the memserver's --admin-key)\n"
			     "  volume=  a plugin's statusfile=: its slabs, replicas, degraded/lost\n"
			     "           slabs, re-replication progress and donors\n"
			     "  giveback  withdraw SIZE of a memserver's capacity: free slabs at\n"
			     "           once, used ones after their clients moved them (admin)\n"
			     "  lend     offer up to SIZE of withdrawn capacity again (admin)\n"
			     "  state list   the plugin's per-volume state files in DIR (default: the\n"
			     "           state directory, e.g. /var/lib/rdmaswap) and whether they\n"
			     "           may go\n"
			     "  state prune  remove those of volumes stopped for longer than their\n"
			     "           lease (never of a running nbdkit); older-than=AGE (e.g.\n"
			     "           7d) also those of volumes that did not stop cleanly\n"
			     "  --json   status as one JSON object per server= or volume=, one a line\n");
	return 2;
}

// GIVEBACK or LEND of `size` bytes of one memserver's capacity.
int change_capacity(const rdmaswap::Endpoint &ep, bool lend, uint64_t size,
		    std::chrono::milliseconds timeout,
		    const std::shared_ptr<const rdmaswap::AuthKey> &auth)
{
	using namespace rdmaswap;
	std::printf("server=%s\n", ep.str().c_str());
	proto::GiveBackReply r;
	int err;
	try {
		ControlClient c(resolve(ep), timeout, auth);
		err = lend ? c.lend(size, r) : c.give_back(size, r);
	} catch (const std::exception &e) {
		std::printf("error=%s\n", e.what());
		return 1;
	}
	if (err == EPERM) {
		std::printf("error=refused: %s needs the memserver's admin key (admin-key=FILE; "
			    "the memserver's --admin-key)\n",
			    lend ? "lend" : "giveback");
		return 1;
	}
	if (err) {
		std::printf("error=%s\n", connect_error_text(err).c_str());
		return 1;
	}
	if (lend)
		std::printf("lent_now=%u\nmoves_cancelled=%u\n", r.withdrawn_now, r.wanted_now);
	else
		std::printf("withdrawn_now=%u\npending_moves_now=%u\n", r.withdrawn_now,
			    r.wanted_now);
	std::printf("slabs_withdrawn=%u\npending_moves=%u\nslabs_total=%u\n", r.slabs_withdrawn,
		    r.slabs_wanted, r.slabs_total);
	return 0;
}

// Every session of the memserver (VOLUME_LIST sessions, page by page). 0 or errno.
int list_sessions(rdmaswap::ControlClient &c, std::vector<rdmaswap::proto::SessionEntry> &out)
{
	using namespace rdmaswap;
	for (;;) {
		std::vector<proto::SessionEntry> page;
		if (int err = c.sessions(out.size(), page))
			return err;
		out.insert(out.end(), page.begin(), page.end());
		if (page.size() < proto::kMaxSessionEntries)
			return 0;
	}
}

// One line per session: session.N=ID volume=NAME|- peer=ADDR slabs=N state=live|detached
// connections=N lease=S lease_left_ms=MS [rdma]. JSON: "session_list": an array of objects with
// those fields (volume and peer null when unknown, rdma true or false).
void print_sessions(Report &out, const std::vector<rdmaswap::proto::SessionEntry> &v)
{
	using namespace rdmaswap;
	uint32_t detached = 0;
	std::string arr = "[";
	for (size_t i = 0; i < v.size(); i++) {
		const auto &e = v[i];
		const std::string vol(e.volume.data(), strnlen(e.volume.data(), e.volume.size()));
		const std::string peer(e.peer.data(), strnlen(e.peer.data(), e.peer.size()));
		const bool det = e.flags & proto::kSessionDetached;
		detached += det;
		if (out.is_json()) {
			char id[17];
			std::snprintf(id, sizeof id, "%016llx", (unsigned long long)e.session);
			arr += std::string(i ? "," : "") + "{\"session\":" + json_string(id) +
			       ",\"volume\":" + (vol.empty() ? "null" : json_string(vol)) +
			       ",\"peer\":" + (peer.empty() ? "null" : json_string(peer)) +
			       ",\"slabs\":" + std::to_string(e.slabs) + ",\"state\":\"" +
			       (det ? "detached" : "live") +
			       "\",\"connections\":" + std::to_string(e.connections) +
			       ",\"lease\":" + std::to_string(e.lease_s) +
			       ",\"lease_left_ms\":" + std::to_string(e.lease_left_ms) +
			       ",\"rdma\":" + (e.flags & proto::kSessionRdma ? "true" : "false") + "}";
			continue;
		}
		std::printf("session.%zu=%016llx volume=%s peer=%s slabs=%u state=%s connections=%u "
			    "lease=%u lease_left_ms=%llu%s\n",
			    i, (unsigned long long)e.session, vol.empty() ? "-" : vol.c_str(),
			    peer.empty() ? "-" : peer.c_str(), e.slabs, det ? "detached" : "live",
			    e.connections, e.lease_s, (unsigned long long)e.lease_left_ms,
			    e.flags & proto::kSessionRdma ? " rdma" : "");
	}
	if (out.is_json())
		out.json("session_list", arr + "]");
	out.num("sessions_detached", detached);
}

// "90", "90s", "15m", "2h", "7d" in seconds; nullopt otherwise.
std::optional<int64_t> parse_age(const std::string &s)
{
	size_t digits = 0;
	while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9')
		digits++;
	if (digits == 0 || digits > 9 || s.size() > digits + 1)
		return std::nullopt;
	const int64_t n = std::stoll(s.substr(0, digits));
	const char unit = digits < s.size() ? s[digits] : 's';
	switch (unit) {
	case 's':
		return n;
	case 'm':
		return n * 60;
	case 'h':
		return n * 3600;
	case 'd':
		return n * 86400;
	default:
		return std::nullopt;
	}
}

const char *use_name(rdmaswap::state::VolumeFiles::Use u)
{
	using Use = rdmaswap::state::VolumeFiles::Use;
	switch (u) {
	case Use::Running:
		return "running";
	case Use::Stopped:
		return "stopped";
	case Use::Unclean:
		return "not-stopped-cleanly";
	case Use::NoRunFile:
		return "no-run-file";
	case Use::Unknown:
		break;
	}
	return "unknown";
}

// rdmaswapctl state list|prune [dir=DIR] [older-than=AGE] (docs/operations.md, "The state
// directory"): one block per volume, `key=value` lines ended by an empty line.
int state_command(int argc, char **argv)
{
	using namespace rdmaswap;
	if (argc < 3 || (std::strcmp(argv[2], "list") != 0 && std::strcmp(argv[2], "prune") != 0))
		return usage();
	const bool prune = std::strcmp(argv[2], "prune") == 0;
	std::string dir;
	std::optional<int64_t> older_than;
	for (int i = 3; i < argc; i++) {
		const std::string arg = argv[i];
		const size_t eq = arg.find('=');
		const std::string key = arg.substr(0, eq);
		const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
		if (key == "dir" && !value.empty()) {
			dir = value;
		} else if (key == "older-than") {
			older_than = parse_age(value);
			if (!older_than) {
				std::fprintf(stderr, "rdmaswapctl: bad older-than '%s' (examples: 3600, "
						     "90m, 12h, 7d)\n",
					     value.c_str());
				return 2;
			}
		} else {
			std::fprintf(stderr, "rdmaswapctl: unknown argument '%s'\n", arg.c_str());
			return usage();
		}
	}
	if (dir.empty()) {
		try {
			const std::string key = default_volume_key_path();
			const size_t slash = key.rfind('/');
			dir = slash == std::string::npos ? "." : key.substr(0, slash);
		} catch (const std::exception &e) {
			std::fprintf(stderr, "rdmaswapctl: no default state directory (%s): give dir=\n",
				     e.what());
			return 2;
		}
	}
	std::vector<state::VolumeFiles> volumes;
	try {
		volumes = state::scan(dir);
	} catch (const std::exception &e) {
		std::printf("dir=%s\nerror=%s\n\n", dir.c_str(), e.what());
		return 1;
	}
	const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
				    std::chrono::system_clock::now().time_since_epoch())
				    .count();
	int rc = 0;
	for (const auto &v : volumes) {
		std::printf("volume=%s\n", v.volume.empty() ? "-" : v.volume.c_str());
		if (prune) {
			const state::Pruned p = state::prune(v, now, older_than);
			for (const auto &f : p.removed)
				std::printf("removed=%s\n", f.c_str());
			if (!p.kept.empty())
				std::printf("kept=%s\n", p.kept.c_str());
			if (!p.error.empty()) {
				std::printf("error=%s\n", p.error.c_str());
				rc = 1;
			}
			std::printf("\n");
			continue;
		}
		std::printf("state=%s\n", use_name(v.use));
		if (v.info && v.info->described) {
			std::printf("lease=%u\nstarted=%lld\n", v.info->lease,
				    static_cast<long long>(v.info->started));
			if (v.info->stopped)
				std::printf("stopped=%lld\n", static_cast<long long>(v.info->stopped));
			if (!v.info->backup.empty())
				std::printf("backup=%s\n", v.info->backup.c_str());
		}
		if (v.use == state::VolumeFiles::Use::Stopped)
			std::printf("stopped_seconds=%lld\n",
				    static_cast<long long>(now - v.info->stopped));
		std::printf("newest_file_seconds=%lld\n", static_cast<long long>(now - v.newest));
		const std::string keep = state::keep_reason(v, now, older_than);
		std::printf("prunable=%s\n", keep.empty() ? "yes" : "no");
		if (!keep.empty())
			std::printf("kept=%s\n", keep.c_str());
		for (const auto &f : v.files)
			std::printf("file=%s\n", f.c_str());
		std::printf("\n");
	}
	return rc;
}

} // namespace

static int run(int argc, char **argv)
{
	using namespace rdmaswap;
	if (argc >= 2 && std::strcmp(argv[1], "state") == 0)
		return state_command(argc, argv);
	if (argc >= 2 && is_cert_command(argv[1])) // tools/rdmaswapctl_cert.cpp
		return cert_command(argc, argv);
	if (argc < 2 || (std::strcmp(argv[1], "status") != 0 && std::strcmp(argv[1], "giveback") != 0 &&
			 std::strcmp(argv[1], "lend") != 0))
		return usage();
	const std::string cmd = argv[1];
	const bool giveback = cmd != "status"; // giveback or lend: one server, a size, admin
	uint64_t giveback_size = 0;
	std::vector<Endpoint> servers;
	std::vector<std::string> volumes;
	std::chrono::milliseconds timeout{5000};
	std::shared_ptr<const AuthKey> auth, admin;
	bool insecure = false, json = false;
	for (int i = 2; i < argc; i++) {
		const std::string arg = argv[i];
		if (arg == "--json" && !giveback) {
			json = true;
			continue;
		}
		const size_t eq = arg.find('=');
		const std::string key = arg.substr(0, eq);
		const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
		if (key == "server") {
			auto ep = parse_endpoint(value);
			if (!ep) {
				std::fprintf(stderr, "rdmaswapctl: bad server '%s'\n", value.c_str());
				return 2;
			}
			servers.push_back(*ep);
		} else if (key == "size" && giveback) {
			const auto sz = parse_size(value);
			if (!sz || *sz == 0) {
				std::fprintf(stderr, "rdmaswapctl: bad size '%s' (examples: 512M, 2G)\n",
					     value.c_str());
				return 2;
			}
			giveback_size = *sz;
		} else if (key == "volume" && !giveback) {
			volumes.push_back(value);
		} else if (key == "auth-key" || key == "admin-key") {
			try {
				(key == "auth-key" ? auth : admin) = load_auth_key(value);
			} catch (const std::exception &e) {
				std::fprintf(stderr, "rdmaswapctl: %s=: %s\n", key.c_str(), e.what());
				return 2;
			}
		} else if (key == "insecure") {
			if (value != "true" && value != "false") {
				std::fprintf(stderr, "rdmaswapctl: insecure= must be true or false\n");
				return 2;
			}
			insecure = value == "true";
		} else if (key == "timeout") {
			const int s = std::atoi(value.c_str());
			if (s <= 0) {
				std::fprintf(stderr, "rdmaswapctl: bad timeout '%s'\n", value.c_str());
				return 2;
			}
			timeout = std::chrono::seconds(s);
		} else {
			std::fprintf(stderr, "rdmaswapctl: unknown argument '%s'\n", arg.c_str());
			return usage();
		}
	}
	if (servers.empty() && volumes.empty())
		return usage();
	if (giveback && (servers.size() != 1 || giveback_size == 0)) {
		std::fprintf(stderr, "rdmaswapctl: %s needs one server= and size=\n", cmd.c_str());
		return 2;
	}
	if ((admin || auth) && insecure) {
		std::fprintf(stderr, "rdmaswapctl: insecure=true and a key exclude each other\n");
		return 2;
	}
	if (giveback && !admin && !insecure) {
		std::fprintf(stderr, "rdmaswapctl: %s needs admin-key=FILE (the key the memserver "
				     "was given with --admin-key), or insecure=true for a memserver run "
				     "with --insecure\n",
			     cmd.c_str());
		return 2;
	}
	if (!servers.empty() && !auth && !admin && !insecure) {
		std::fprintf(stderr, "rdmaswapctl: server= needs auth-key=FILE (the cluster key) or "
				     "admin-key=FILE, or insecure=true for a memserver run with "
				     "--insecure\n");
		return 2;
	}
	// The admin key, when given, is the one this tool authenticates with.
	if (admin)
		auth = admin;
	if (giveback)
		return change_capacity(servers[0], cmd == "lend", giveback_size, timeout, auth);
	int rc = 0;
	for (const auto &path : volumes) {
		Report out(json);
		out.str("volume", path);
		struct stat st {};
		FILE *f = std::fopen(path.c_str(), "r");
		if (!f || fstat(fileno(f), &st) != 0) {
			out.str("error", err_text(errno));
			out.end();
			if (f)
				std::fclose(f);
			rc = 1;
			continue;
		}
		const long age = long(time(nullptr) - st.st_mtime);
		char line[512];
		std::string donors = "[";
		while (std::fgets(line, sizeof line, f)) {
			std::string l(line);
			while (!l.empty() && l.back() == '\n')
				l.pop_back();
			const size_t eq = l.find('=');
			if (eq == std::string::npos)
				continue;
			const std::string k = l.substr(0, eq), v = l.substr(eq + 1);
			if (json && k.rfind("donor.", 0) == 0)
				donors += (donors.size() > 1 ? "," : "") + donor_json(v);
			else
				out.value(k, v);
		}
		std::fclose(f);
		if (json)
			out.json("donors", donors + "]");
		out.num("age_seconds", age);
		if (age > 5) {
			out.str("error", "status is " + std::to_string(age) + " s old: is nbdkit running?");
			rc = 1;
		}
		out.end();
	}
	for (const auto &ep : servers) {
		Report out(json);
		out.str("server", ep.str());
		proto::StatsReply s;
		proto::GiveBackReply g;
		std::vector<proto::SessionEntry> sessions;
		int err;
		try {
			ControlClient c(resolve(ep), timeout, auth);
			err = c.stats(s);
			if (!err)
				err = c.give_back_status(g);
			if (!err)
				err = list_sessions(c, sessions);
		} catch (const std::exception &e) {
			out.str("error", e.what());
			out.end();
			rc = 1;
			continue;
		}
		if (err) {
			out.str("error", connect_error_text(err));
			out.end();
			rc = 1;
			continue;
		}
		out.num("capacity", (long long)s.capacity);
		out.num("slab_size", (long long)s.slab_size);
		out.num("slabs_total", s.slabs_total);
		out.num("slabs_free", s.slabs_free);
		// Withdrawn slabs are given back to the host: neither free nor used.
		out.num("slabs_used",
			s.slabs_total - std::min(s.slabs_total, s.slabs_free + g.slabs_withdrawn));
		out.num("slabs_withdrawn", g.slabs_withdrawn);
		out.num("bytes_withdrawn", (long long)(uint64_t(g.slabs_withdrawn) * s.slab_size));
		out.num("pending_moves", g.slabs_wanted);
		out.num("sessions", s.sessions);
		out.num("connections", s.connections);
		out.num("tcp_read_ops", (long long)s.tcp_read_ops);
		out.num("tcp_read_bytes", (long long)s.tcp_read_bytes);
		out.num("tcp_write_ops", (long long)s.tcp_write_ops);
		out.num("tcp_write_bytes", (long long)s.tcp_write_bytes);
		out.num("rdma_qps", s.rdma_qps);
		out.num("rdma_sessions", s.rdma_sessions);
		out.str("sessions_listed", admin || insecure ? "all" : "this-host");
		print_sessions(out, sessions);
		out.end();
	}
	return rc;
}

int main(int argc, char **argv)
{
	return rdmaswap::guarded_main("rdmaswapctl", run, argc, argv);
}
