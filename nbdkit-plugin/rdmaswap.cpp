// SPDX-License-Identifier: MIT
// nbdkit-rdmaswap-plugin: a block device whose bytes live in rdmaswap memservers. Thin glue: the
// nbdkit callbacks, each behind one exception boundary; the work is done by rdmaswap::Volume
// (common/volume/). The other files of the plugin: plugin.h.
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/net/verbs.h"
#include "common/obs/log.h"
#include "common/util/err_text.h"
#include "nbdkit-plugin/plugin.h"

// nbdkit -D rdmaswap.debug=1: the plugin's loggers log at debug level (default: info). nbdkit
// prints debug and info messages only with -v. A debug flag (see nbdkit-plugin(3), "Debug
// Flags"): nbdkit finds it by this name and sets it when it loads the plugin.
extern "C" NBDKIT_DLL_PUBLIC int rdmaswap_debug_debug;
int rdmaswap_debug_debug = 0;

namespace rdmaswap::plugin {

std::atomic<int> g_throw_writes{0};
unsigned g_throw_steps = 0;
bool g_throw_start = false;

} // namespace rdmaswap::plugin

namespace {

using namespace rdmaswap;
using namespace rdmaswap::plugin;

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
	set_log_sink(make_nbdkit_sink());
	// info (shown with nbdkit -v), or debug with -D rdmaswap.debug=1 (nbdkit sets the flag
	// before it calls .load).
	set_log_level(rdmaswap_debug_debug ? "debug" : "info");
	choose_log_destination();
	read_test_hooks();
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
	p.config = Boundary<"config", config>::call;
	p.config_complete = Boundary<"config_complete", config_complete>::call;
	p.config_help = kConfigHelp;
	p.magic_config_key = "server";
	p.dump_plugin = Boundary<"dump_plugin", rdmaswap_dump_plugin>::call;
	p.get_ready = Boundary<"get_ready", get_ready>::call;
	p.after_fork = Boundary<"after_fork", after_fork>::call;
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

struct nbdkit_plugin the_plugin = make_plugin();

} // namespace

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
NBDKIT_REGISTER_PLUGIN(the_plugin)
