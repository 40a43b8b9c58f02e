// SPDX-License-Identifier: MIT
// The plugin's own threads besides the volume's and the membership's (plugin.h): the status
// writer and the shutdown watcher.
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/obs/log.h"
#include "common/obs/metrics_text.h"
#include "common/util/deadline.h"
#include "common/util/err_text.h"
#include "common/util/private_file.h"
#include "nbdkit-plugin/plugin.h"

namespace rdmaswap::plugin {

// Writes the volume's status to g_cfg.statusfile and its metrics to g_cfg.metricsfile (each if
// set)
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
		if (!g_cfg.statusfile.empty())
			replace_file(g_cfg.statusfile, std::string("transport=") +
							   transport_name(g_chosen) + "\n" +
							   g_volume->status_text() +
							   g_membership->status_text());
		if (!g_cfg.metricsfile.empty()) {
			MetricsText info;
			info.family("rdmaswap_volume_info", "gauge",
				    "Always 1: the plugin's version and the transport it chose.");
			info.sample("rdmaswap_volume_info",
				    {{"version", RDMASWAP_VERSION},
				     {"transport", transport_name(g_chosen)}},
				    uint64_t(1));
			replace_file(g_cfg.metricsfile, info.take() + g_volume->metrics_text() +
							    g_membership->metrics_text());
		}
	}
	// `path` holds `text`, or is left as it was (replace_file: a temporary file in the same
	// directory renamed over it, created new and never through a symbolic link, so a link
	// planted in the directory cannot make this process, root often, write anywhere else).
	// Mode 0644, for the metrics collector (node_exporter's textfile collector reads only
	// *.prom files, so it never sees the temporary one); not synced: it is written again
	// every second, and a swap server does no disk I/O it does not need.
	static void replace_file(const std::string &path, const std::string &text)
	{
		(void)rdmaswap::replace_file(path, text, FileMode{0644, false});
	}
	std::mutex mu_;
	std::condition_variable cv_;
	bool stop_ = false;
	std::thread thread_;
};

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

void ThreadDeleter::operator()(StatusWriter *p) const { delete p; }
void ThreadDeleter::operator()(ShutdownWatcher *p) const { delete p; }

std::unique_ptr<StatusWriter, ThreadDeleter> start_status_writer()
{
	return std::unique_ptr<StatusWriter, ThreadDeleter>(new StatusWriter);
}

std::unique_ptr<ShutdownWatcher, ThreadDeleter> start_shutdown_watcher()
{
	return std::unique_ptr<ShutdownWatcher, ThreadDeleter>(new ShutdownWatcher);
}

} // namespace rdmaswap::plugin
