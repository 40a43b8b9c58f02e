// SPDX-License-Identifier: MIT
// Logging: one named spdlog logger per component ("memserver", "volume", "tcp", "rdma", ...).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <spdlog/spdlog.h>

namespace rdmaswap {

// Returns the logger called `name` (at most kMaxLoggerName characters; longer names are cut),
// creating it on first use with the sink installed by set_log_sink (default: stderr) and the
// level of set_log_level. Safe from any thread. Once a name has been seen, the lookup takes no
// lock and allocates nothing: the loggers live in a fixed table that is only appended to (under
// a mutex) and published with an atomic count. The logger lives until the process exits. After
// kMaxLoggers distinct names, further new names share one logger called "other".
// The reference stays valid until exit: `logger("x")->warn(...)` costs no reference count;
// `auto log = logger("x")` copies the shared_ptr (one atomic increment, no lock).
// Never log at info level on a data path.
const std::shared_ptr<spdlog::logger> &logger(std::string_view name);
inline constexpr size_t kMaxLoggers = 32;
inline constexpr size_t kMaxLoggerName = 31;

// Replace the sink used by loggers created from now on (the plugin routes to nbdkit's log);
// null restores the default. The sink's log() is called from many threads at once: it must be
// thread-safe.
void set_log_sink(spdlog::sink_ptr sink);

// "trace", "debug", "info", "warn", "error", "off": the level of every logger, existing and
// future. False if unknown. The default is "info".
bool set_log_level(const std::string &level);

// The default sink: writes each message as one line, "2025-01-31T12:00:00.123 warning [name]
// text" (the level name coloured when `fd` is a terminal), formatted on the stack and written
// with a single write(2), so concurrent lines do not interleave and no lock is taken. A message
// longer than about 1000 bytes is cut and ends in "...".
spdlog::sink_ptr make_fd_sink(int fd);

// Many similar failures as one log line: "A (why), B (why) and 3 more", the first `max` of
// `items` (name, why) and how many are left out. Control path only (allocates).
std::string log_summary(std::span<const std::pair<std::string, std::string>> items,
			size_t max = 8);

// Write all `n` bytes at `p` to `fd`, retrying after EINTR and short writes; false if a write
// failed (errno says why). No allocation (log sinks use it).
bool write_fully(int fd, const char *p, size_t n);

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
