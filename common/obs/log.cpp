// SPDX-License-Identifier: MIT
// Named spdlog loggers in a fixed table (lock-free lookup), one sink and one level for all.
#include "common/obs/log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include <spdlog/sinks/sink.h>

namespace rdmaswap {
namespace {

// One logger. Written once, under g_create_mu, before g_count makes it visible (release);
// never changed afterwards, so readers that load g_count (acquire) need no lock.
struct Slot {
	char name[kMaxLoggerName + 1];
	size_t len;
	std::shared_ptr<spdlog::logger> logger;
};
Slot g_slots[kMaxLoggers + 1]; // the last one: "other", for names beyond kMaxLoggers
std::atomic<size_t> g_count{0}; // slots [0, g_count) are published
std::mutex g_create_mu;         // creating a logger, set_log_sink, set_log_level
spdlog::sink_ptr g_sink;        // under g_create_mu
spdlog::level::level_enum g_level = spdlog::level::info; // under g_create_mu

const std::shared_ptr<spdlog::logger> *find(std::string_view name, size_t count)
{
	for (size_t i = 0; i < count; i++)
		if (std::string_view(g_slots[i].name, g_slots[i].len) == name)
			return &g_slots[i].logger;
	return nullptr;
}

// Fills slot `i` with a new logger called `name`. Under g_create_mu.
const std::shared_ptr<spdlog::logger> &fill(size_t i, std::string_view name)
{
	if (!g_sink)
		g_sink = make_fd_sink(STDERR_FILENO);
	Slot &s = g_slots[i];
	std::memcpy(s.name, name.data(), name.size());
	s.name[name.size()] = '\0';
	s.len = name.size();
	s.logger = std::make_shared<spdlog::logger>(std::string(name), g_sink);
	s.logger->set_level(g_level);
	return s.logger;
}

const std::shared_ptr<spdlog::logger> &create(std::string_view name)
{
	std::lock_guard lock(g_create_mu);
	const size_t n = g_count.load(std::memory_order_relaxed);
	if (auto *l = find(name, n))
		return *l;
	if (n == kMaxLoggers) {
		if (!g_slots[kMaxLoggers].logger)
			fill(kMaxLoggers, "other");
		return g_slots[kMaxLoggers].logger;
	}
	const auto &l = fill(n, name);
	g_count.store(n + 1, std::memory_order_release);
	return l;
}

// The level's name as the default sink prints it, and its colour on a terminal.
struct LevelStyle {
	const char *color;
	std::string_view name;
};
LevelStyle style(spdlog::level::level_enum lvl)
{
	switch (lvl) {
	case spdlog::level::trace: return {"\033[37m", "trace"};
	case spdlog::level::debug: return {"\033[36m", "debug"};
	case spdlog::level::info: return {"\033[32m", "info"};
	case spdlog::level::warn: return {"\033[33m\033[1m", "warning"};
	case spdlog::level::err: return {"\033[31m\033[1m", "error"};
	case spdlog::level::critical: return {"\033[1m\033[41m", "critical"};
	default: return {"", "off"};
	}
}

class FdSink final : public spdlog::sinks::sink {
public:
	explicit FdSink(int fd) : fd_(fd), color_(isatty(fd) == 1) {}

	void log(const spdlog::details::log_msg &msg) override
	{
		const int saved_errno = errno;
		char buf[kMaxPayload + 160];
		size_t n = 0;
		auto put = [&](std::string_view s) {
			const size_t k = std::min(s.size(), sizeof buf - n);
			std::memcpy(buf + n, s.data(), k);
			n += k;
		};
		put(timestamp(msg.time));
		put(" ");
		const auto st = style(msg.level);
		if (color_)
			put(st.color);
		put(st.name);
		if (color_)
			put("\033[m");
		put(" [");
		put(std::string_view(msg.logger_name.data(), msg.logger_name.size()));
		put("] ");
		const std::string_view text(msg.payload.data(), msg.payload.size());
		put(text.substr(0, kMaxPayload));
		if (text.size() > kMaxPayload)
			put("...");
		put("\n");
		(void)write_fully(fd_, buf, n);
		errno = saved_errno;
	}
	void flush() override {}
	void set_pattern(const std::string &) override {}
	void set_formatter(std::unique_ptr<spdlog::formatter>) override {}

private:
	static constexpr size_t kMaxPayload = 1000;

	// "2025-01-31T12:00:00.123" in local time. localtime_r (which takes glibc's time zone
	// lock) runs at most once a second per thread.
	static std::string_view timestamp(spdlog::log_clock::time_point t)
	{
		thread_local std::time_t cached_sec = -1;
		thread_local char text[32];
		const auto since = t.time_since_epoch();
		const std::time_t sec = std::chrono::duration_cast<std::chrono::seconds>(since).count();
		const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(since).count() % 1000;
		if (sec != cached_sec) {
			std::tm tm{};
			localtime_r(&sec, &tm);
			std::strftime(text, 20, "%Y-%m-%dT%H:%M:%S", &tm);
			cached_sec = sec;
		}
		std::snprintf(text + 19, sizeof text - 19, ".%03d", int(ms));
		return {text, 23};
	}

	const int fd_;
	const bool color_;
};

} // namespace

const std::shared_ptr<spdlog::logger> &logger(std::string_view name)
{
	name = name.substr(0, kMaxLoggerName);
	if (auto *l = find(name, g_count.load(std::memory_order_acquire)))
		return *l;
	return create(name);
}

spdlog::sink_ptr make_fd_sink(int fd)
{
	return std::make_shared<FdSink>(fd);
}

void set_log_sink(spdlog::sink_ptr sink)
{
	std::lock_guard lock(g_create_mu);
	g_sink = std::move(sink);
}

bool set_log_level(const std::string &level)
{
	const auto lvl = spdlog::level::from_str(level);
	if (lvl == spdlog::level::off && level != "off")
		return false;
	std::lock_guard lock(g_create_mu);
	g_level = lvl;
	const size_t n = g_count.load(std::memory_order_relaxed);
	for (size_t i = 0; i < n; i++)
		g_slots[i].logger->set_level(lvl);
	if (g_slots[kMaxLoggers].logger)
		g_slots[kMaxLoggers].logger->set_level(lvl);
	return true;
}

std::string log_summary(std::span<const std::pair<std::string, std::string>> items, size_t max)
{
	std::string out;
	const size_t shown = std::min(items.size(), max);
	for (size_t i = 0; i < shown; i++) {
		if (i)
			out += i + 1 == shown && shown == items.size() ? " and " : ", ";
		out += items[i].first;
		if (!items[i].second.empty())
			out += " (" + items[i].second + ")";
	}
	if (shown < items.size())
		out += " and " + std::to_string(items.size() - shown) + " more";
	return out;
}

bool write_fully(int fd, const char *p, size_t n)
{
	for (size_t off = 0; off < n;) {
		const ssize_t w = ::write(fd, p + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		off += size_t(w);
	}
	return true;
}

bool LogLimiter::allow(uint64_t &suppressed)
{
	std::lock_guard lock(mu_);
	const auto now = std::chrono::steady_clock::now();
	if (now - window_ >= period_) {
		window_ = now;
		in_window_ = 0;
	}
	if (in_window_ >= burst_) {
		dropped_++;
		return false;
	}
	in_window_++;
	suppressed = dropped_;
	dropped_ = 0;
	return true;
}

} // namespace rdmaswap
