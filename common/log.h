// SPDX-License-Identifier: MIT
// Logging: one named spdlog logger per component ("memserver", "volume", "tcp", "rdma", ...).
#pragma once

#include <memory>
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

} // namespace rdmaswap
