// SPDX-License-Identifier: MIT
// rdmaswapctl: ask memservers for their state.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/tcp/rpc.h"

namespace {

int usage()
{
	std::fprintf(stderr, "usage: rdmaswapctl status [server=HOST[:PORT] ...] [volume=STATUSFILE]\n"
			     "       [timeout=SECONDS] [auth-key=FILE | admin-key=FILE | insecure=true]\n"
			     "       rdmaswapctl giveback|lend server=HOST[:PORT] size=SIZE\n"
			     "       [timeout=SECONDS] [admin-key=FILE | insecure=true]\n"
			     "  server=  a memserver's capacity, free slabs, bytes served and the\n"
			     "           sessions of this host (auth-key=: the cluster key), or of\n"
			     "           every client (admin-key=: the memserver's --admin-key)\n"
			     "  volume=  a plugin's statusfile=: its slabs, replicas, degraded/lost\n"
			     "           slabs, re-replication progress and donors\n"
			     "  giveback  withdraw SIZE of a memserver's capacity: free slabs at\n"
			     "           once, used ones after their clients moved them (admin)\n"
			     "  lend     offer up to SIZE of withdrawn capacity again (admin)\n");
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
// connections=N lease=S lease_left_ms=MS [rdma]
void print_sessions(const std::vector<rdmaswap::proto::SessionEntry> &v)
{
	using namespace rdmaswap;
	uint32_t detached = 0;
	for (size_t i = 0; i < v.size(); i++) {
		const auto &e = v[i];
		const std::string vol(e.volume.data(), strnlen(e.volume.data(), e.volume.size()));
		const std::string peer(e.peer.data(), strnlen(e.peer.data(), e.peer.size()));
		const bool det = e.flags & proto::kSessionDetached;
		detached += det;
		std::printf("session.%zu=%016llx volume=%s peer=%s slabs=%u state=%s connections=%u "
			    "lease=%u lease_left_ms=%llu%s\n",
			    i, (unsigned long long)e.session, vol.empty() ? "-" : vol.c_str(),
			    peer.empty() ? "-" : peer.c_str(), e.slabs, det ? "detached" : "live",
			    e.connections, e.lease_s, (unsigned long long)e.lease_left_ms,
			    e.flags & proto::kSessionRdma ? " rdma" : "");
	}
	std::printf("sessions_detached=%u\n", detached);
}

} // namespace

int main(int argc, char **argv)
{
	using namespace rdmaswap;
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
	bool insecure = false;
	for (int i = 2; i < argc; i++) {
		const std::string arg = argv[i];
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
		std::printf("volume=%s\n", path.c_str());
		struct stat st {};
		FILE *f = std::fopen(path.c_str(), "r");
		if (!f || fstat(fileno(f), &st) != 0) {
			std::printf("error=%s\n\n", std::strerror(errno));
			if (f)
				std::fclose(f);
			rc = 1;
			continue;
		}
		const long age = long(time(nullptr) - st.st_mtime);
		char line[512];
		while (std::fgets(line, sizeof line, f))
			std::fputs(line, stdout);
		std::fclose(f);
		std::printf("age_seconds=%ld\n", age);
		if (age > 5) {
			std::printf("error=status is %ld s old: is nbdkit running?\n", age);
			rc = 1;
		}
		std::printf("\n");
	}
	for (const auto &ep : servers) {
		std::printf("server=%s\n", ep.str().c_str());
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
			std::printf("error=%s\n\n", e.what());
			rc = 1;
			continue;
		}
		if (err) {
			std::printf("error=%s\n\n", connect_error_text(err).c_str());
			rc = 1;
			continue;
		}
		// Withdrawn slabs are given back to the host: neither free nor used.
		std::printf("capacity=%llu\nslab_size=%llu\nslabs_total=%u\nslabs_free=%u\n"
			    "slabs_used=%u\nslabs_withdrawn=%u\nbytes_withdrawn=%llu\n"
			    "pending_moves=%u\nsessions=%u\nconnections=%u\n"
			    "tcp_read_ops=%llu\ntcp_read_bytes=%llu\n"
			    "tcp_write_ops=%llu\ntcp_write_bytes=%llu\nrdma_qps=%u\n"
			    "rdma_sessions=%u\n",
			    (unsigned long long)s.capacity, (unsigned long long)s.slab_size,
			    s.slabs_total, s.slabs_free,
			    s.slabs_total - std::min(s.slabs_total, s.slabs_free + g.slabs_withdrawn),
			    g.slabs_withdrawn, (unsigned long long)(g.slabs_withdrawn * s.slab_size),
			    g.slabs_wanted, s.sessions,
			    s.connections, (unsigned long long)s.tcp_read_ops,
			    (unsigned long long)s.tcp_read_bytes, (unsigned long long)s.tcp_write_ops,
			    (unsigned long long)s.tcp_write_bytes, s.rdma_qps, s.rdma_sessions);
		std::printf("sessions_listed=%s\n", admin || insecure ? "all" : "this-host");
		print_sessions(sessions);
		std::printf("\n");
	}
	return rc;
}
