// SPDX-License-Identifier: MIT
// Logging: one named spdlog logger per component ("memserver", "volume", "tcp", "rdma", ...).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <spdlog/spdlog.h>

namespace rdmaswap {

// Returns the logger called `name`, creating it (stderr sink, or the sink installed with
// set_log_sink) on first use. Safe from any thread. Never call at info level on a data path.
std::shared_ptr<spdlog::logger> logger(const std::string &name);

// Replace the sink used by loggers created from now on (the plugin routes to nbdkit's log).
void set_log_sink(spdlog::sink_ptr sink);

// "trace", "debug", "info", "warn", "error", "off". False if unknown.
bool set_log_level(const std::string &level);

// Lets through at most `burst` messages per `period` and counts the rest, so that what a
// hostile peer provokes (failed logins, connection floods) cannot flood the log. Thread-safe.
class LogLimiter {
public:
	LogLimiter(unsigned burst, std::chrono::seconds period) : burst_(burst), period_(period) {}
	// True if a message may be logged now; then `suppressed` is how many were dropped since
	// the last one that was let through.
	bool allow(uint64_t &suppressed);

private:
	const unsigned burst_;
	const std::chrono::seconds period_;
	std::mutex mu_;
	std::chrono::steady_clock::time_point window_{};
	unsigned in_window_ = 0;
	uint64_t dropped_ = 0;
};

} // namespace rdmaswap
