// SPDX-License-Identifier: MIT
// The plugin's log: the project's spdlog loggers into nbdkit's log (plugin.h).
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>

#include "common/obs/log.h"
#include "nbdkit-plugin/plugin.h"

namespace rdmaswap::plugin {

namespace {

// Where a warning goes (nbdkit 1.32 has no warning level, and nbdkit_error prefixes "error:",
// which an operator's log watcher alerts on): the destination of nbdkit's own messages, as
// --log= chose it (/proc/self/cmdline, read once at load): stderr, syslog or nowhere. With
// --log=default (or none), stderr, unless nbdkit forked into the background and its stderr
// became /dev/null (decided again in after_fork): then syslog, as nbdkit does.
enum class LogTo { Stderr, Syslog, Null };
std::atomic<LogTo> g_log_to{LogTo::Stderr};
bool g_log_explicit = false; // --log= named a destination other than default

// One warning line, "nbdkit: rdmaswap: warning: NAME: TEXT", written to where nbdkit logs:
// formatted on the stack (cut at about 2000 bytes), one write(2) or syslog(3) call, errno kept.
void log_warning(std::string_view name, std::string_view text)
{
	const int saved_errno = errno;
	switch (g_log_to.load(std::memory_order_relaxed)) {
	case LogTo::Null:
		break;
	case LogTo::Syslog:
		syslog(LOG_WARNING, "rdmaswap: warning: %.*s: %.*s", int(name.size()), name.data(),
		       int(text.size()), text.data());
		break;
	case LogTo::Stderr: {
		char buf[2048];
		size_t n = 0;
		auto put = [&](std::string_view s) {
			const size_t k = std::min(s.size(), sizeof buf - 1 - n);
			std::memcpy(buf + n, s.data(), k);
			n += k;
		};
		put("nbdkit: rdmaswap: warning: ");
		put(name);
		put(": ");
		put(text);
		buf[n++] = '\n';
		(void)write_fully(STDERR_FILENO, buf, n);
		break;
	}
	}
	errno = saved_errno;
}

// Routes the project's spdlog loggers into nbdkit's log: errors always (nbdkit_error),
// warnings always without "error:" (log_warning), info and debug only with nbdkit -v
// (nbdkit_debug). Formats nothing itself and allocates nothing: the message is already formatted
// by spdlog on the stack. Thread-safe without a lock of its own, as nbdkit_error, nbdkit_debug
// and log_warning are.
class NbdkitSink final : public spdlog::sinks::sink {
public:
	void log(const spdlog::details::log_msg &msg) override
	{
		const std::string_view name(msg.logger_name.data(), msg.logger_name.size());
		const std::string_view text(msg.payload.data(), msg.payload.size());
		if (msg.level == spdlog::level::warn)
			log_warning(name, text);
		else if (msg.level > spdlog::level::warn)
			nbdkit_error("%.*s: %.*s", int(name.size()), name.data(), int(text.size()),
				     text.data());
		else
			nbdkit_debug("%.*s: %.*s", int(name.size()), name.data(), int(text.size()),
				     text.data());
	}
	void flush() override {}
	void set_pattern(const std::string &) override {}
	void set_formatter(std::unique_ptr<spdlog::formatter>) override {}
};

} // namespace

void choose_log_destination()
{
	FILE *f = std::fopen("/proc/self/cmdline", "re");
	if (!f)
		return;
	char buf[8192];
	const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
	std::fclose(f);
	buf[n] = '\0';
	std::string_view prev;
	for (size_t off = 0; off < n;) {
		const std::string_view arg(buf + off);
		off += arg.size() + 1;
		std::string_view v;
		if (arg.substr(0, 6) == "--log=")
			v = arg.substr(6);
		else if (prev == "--log")
			v = arg;
		prev = arg;
		if (arg == "--")
			break; // (nbdkit's own options end here)
		if (v.empty())
			continue;
		g_log_explicit = v != "default";
		g_log_to = v == "syslog" ? LogTo::Syslog : v == "null" ? LogTo::Null : LogTo::Stderr;
	}
}

// After the fork: nbdkit in the background without -v points stderr at /dev/null and logs to
// syslog (its --log=default).
void log_destination_after_fork()
{
	if (g_log_explicit)
		return;
	struct stat err{}, null{};
	if (fstat(STDERR_FILENO, &err) == 0 && stat("/dev/null", &null) == 0 &&
	    S_ISCHR(err.st_mode) && err.st_rdev == null.st_rdev)
		g_log_to = LogTo::Syslog;
}

std::shared_ptr<spdlog::sinks::sink> make_nbdkit_sink()
{
	return std::make_shared<NbdkitSink>();
}

void warn(const char *fmt, ...)
{
	char text[2048];
	va_list ap;
	va_start(ap, fmt);
	const int n = std::vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	log_warning("plugin", std::string_view(text, n < 0 ? 0 : std::min(size_t(n), sizeof text - 1)));
}

} // namespace rdmaswap::plugin
