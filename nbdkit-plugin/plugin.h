// SPDX-License-Identifier: MIT
// What the plugin's files share (as nbdkit's curl plugin shares curldefs.h): its configuration,
// the state the start builds, and the functions the files call one another by. One concern per
// file:
//   rdmaswap.cpp  load and unload, the I/O callbacks, struct nbdkit_plugin, the exception
//                 boundary of every callback;
//   config.cpp    .config (one table of keys) and .config_complete: the per-volume files, keys;
//   startup.cpp   .get_ready (donors found and probed: common/cluster/start.h) and .after_fork
//                 (process hardening, the transport, the Volume and its Membership), the
//                 holders record;
//   log_sink.cpp  the project's loggers into nbdkit's log, warnings without "error:";
//   threads.cpp   the status writer and the shutdown watcher.
// The work is done in common/: this folder is glue.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/sinks/sink.h>

#include "common/cluster/discovery.h"
#include "common/cluster/donor_set.h"
#include "common/cluster/membership.h"
#include "common/net/etcd.h"
#include "common/util/config.h"
#include "common/volume/state_files.h"
#include "common/volume/volume.h"
#include "common/wire/auth.h"
#include "common/wire/donor_cert.h"
#include "common/wire/volume_key.h"

namespace rdmaswap::plugin {

// The plugin's keys (config.cpp), as given, with what config_complete derives from them.
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
	unsigned paths = 0; // paths=: data connections per donor (0: one per channel; fewer: shared)
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
	std::string statusfile;   // statusfile=: where the status thread writes
	std::string metricsfile;  // metrics-file=: the same, in the Prometheus text format
};
extern Config g_cfg;
// This run's run file (state_files.h), locked from config_complete to the process's end.
extern std::unique_ptr<state::RunFile> g_run;
// After the start (after_fork): the volume, its membership thread and the transport chosen.
extern std::unique_ptr<Volume> g_volume;
extern std::unique_ptr<Membership> g_membership;
extern TransportKind g_chosen;

// ---- config.cpp ----
int config(const char *key, const char *value);
int config_complete();
extern const char kConfigHelp[];

// ---- startup.cpp ----
int get_ready();
int after_fork();
// Stops every thread the plugin started and frees what they use, in that order. At unload,
// and when the start fails after threads were started: nbdkit then exits, and a thread still
// running while exit() destroys the globals and OpenSSL's state would crash it (finding S11).
void stop_threads();

// ---- log_sink.cpp ----
// Where nbdkit logs (its --log=), read once at load; again after the fork (a daemon's stderr).
void choose_log_destination();
void log_destination_after_fork();
// The sink that routes the project's spdlog loggers into nbdkit's log.
std::shared_ptr<spdlog::sinks::sink> make_nbdkit_sink();
// A warning of the plugin itself (printf-style, control path only).
[[gnu::format(printf, 1, 2)]] void warn(const char *fmt, ...);

// ---- threads.cpp ----
class StatusWriter;
class ShutdownWatcher;
struct ThreadDeleter {
	void operator()(StatusWriter *p) const;
	void operator()(ShutdownWatcher *p) const;
};
// Writes g_cfg.statusfile and g_cfg.metricsfile every second (each if set).
std::unique_ptr<StatusWriter, ThreadDeleter> start_status_writer();
// Stops the process's network waits when nbdkit is told to quit (made in after_fork).
std::unique_ptr<ShutdownWatcher, ThreadDeleter> start_shutdown_watcher();

// ---- rdmaswap.cpp: test hooks (RDMASWAP_TEST_THROW, read at load; unset in production) ----
extern std::atomic<int> g_throw_writes; // write requests that throw
extern unsigned g_throw_steps;          // membership steps that throw
extern bool g_throw_start;              // the start throws once its threads run

} // namespace rdmaswap::plugin
