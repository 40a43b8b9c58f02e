// SPDX-License-Identifier: MIT
// Named spdlog loggers sharing one sink and one level.
#include "common/log.h"

#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace rdmaswap {
namespace {

std::mutex g_mu;
spdlog::sink_ptr g_sink;
spdlog::level::level_enum g_level = spdlog::level::info;

} // namespace

std::shared_ptr<spdlog::logger> logger(const std::string &name)
{
	std::lock_guard lock(g_mu);
	if (auto l = spdlog::get(name))
		return l;
	if (!g_sink)
		g_sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
	auto l = std::make_shared<spdlog::logger>(name, g_sink);
	l->set_level(g_level);
	l->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
	spdlog::register_logger(l);
	return l;
}

void set_log_sink(spdlog::sink_ptr sink)
{
	std::lock_guard lock(g_mu);
	g_sink = std::move(sink);
}

bool set_log_level(const std::string &level)
{
	const auto lvl = spdlog::level::from_str(level);
	if (lvl == spdlog::level::off && level != "off")
		return false;
	std::lock_guard lock(g_mu);
	g_level = lvl;
	spdlog::apply_all([lvl](std::shared_ptr<spdlog::logger> l) { l->set_level(lvl); });
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
