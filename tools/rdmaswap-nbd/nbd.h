// SPDX-License-Identifier: MIT
// rdmaswap-nbd (main.cpp says what it does): what its parts share. handshake.cpp: the NBD
// handshake on a Unix socket (fixed newstyle, NBD_OPT_GO); netlink.h: the generic-netlink "nbd"
// family; main.cpp: the device commands and the command line.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/util/fd.h"

namespace rdmaswap::nbd {

inline constexpr const char *kProg = "rdmaswap-nbd";

// An error that names the step; caught in main, never escapes it.
struct Failure {
	std::string what;
};

[[noreturn]] inline void fail(const std::string &step, int err = 0)
{
	std::string m = step;
	if (err)
		m += ": " + std::string(strerrordesc_np(err) ? strerrordesc_np(err) : "unknown error") + " (errno " + std::to_string(err) + ")";
	throw Failure{m};
}

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

// ---- handshake.cpp ----
// Connect to the server's Unix socket `path`, waiting up to `wait_s` seconds for it to appear.
Fd connect_unix(const std::string &path, unsigned wait_s);
// The NBD handshake on `fd` for `exportname`: what NBD_OPT_GO says about the export.
Export handshake(int fd, const std::string &exportname);
// Refuse an export the device cannot use with `o` (flags, block size).
void check_export(const Export &ex, const Options &o);
// o.connections sockets, each through the handshake; the export in `ex`.
std::vector<Fd> open_sockets(const Options &o, unsigned wait_s, Export &ex);

} // namespace rdmaswap::nbd
