// SPDX-License-Identifier: MIT
// The TCP and RDMA data paths' shared checks, error latch and reconnect with backoff, and the
// busy-poll decision.
#include "common/transport/data_path_base.h"

#include <sched.h>

#include <cerrno>

#include "common/obs/log.h"
#include "common/util/deadline.h"

namespace rdmaswap {

namespace {
std::atomic<bool> g_busy_poll{false};
} // namespace

void set_busy_poll(bool on)
{
	g_busy_poll.store(on, std::memory_order_relaxed);
}

bool busy_poll()
{
	return g_busy_poll.load(std::memory_order_relaxed);
}

unsigned affinity_cpus()
{
	cpu_set_t set;
	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof set, &set) != 0)
		return 1;
	const int n = CPU_COUNT(&set);
	return n > 0 ? unsigned(n) : 1;
}

DataPathBase::DataPathBase(const char *log, std::string name, std::span<std::byte> region,
			   std::shared_ptr<std::atomic<bool>> session_lost)
	: log_(log), name_(std::move(name)), region_(region), session_lost_(std::move(session_lost))
{
}

int DataPathBase::admit(bool read, const SlabGrant &slab, uint64_t off, uint32_t len,
			const std::byte *local)
{
	if (len == 0 || len > proto::kMaxIo || off > slab.length || slab.length - off < len)
		return latch(EINVAL);
	if (local < region_.data() || local > region_.data() + region_.size() ||
	    size_t(region_.data() + region_.size() - local) < len)
		return latch(EINVAL);
	if (n_ == kMaxBatch)
		return latch(ENOBUFS);
	if (n_ && read != read_)
		return latch(EINVAL);
	if (error_)
		return error_;
	read_ = read;
	return 0;
}

int DataPathBase::ensure_connected(bool eager)
{
	if (connected())
		return 0;
	if (closed_ || session_lost_->load() || stop_requested())
		return EIO;
	const auto now = Backoff::clock::now();
	if (!eager && !backoff_.may_try(now))
		return EIO;
	const int err = reconnect();
	if (err == 0) {
		logger(log_)->warn("{} re-established", name_);
		backoff_.succeeded();
		return 0;
	}
	if (err == ENOENT) {
		logger(log_)->error("{}: the memserver no longer knows our session: its slabs are "
				    "lost",
				    name_);
		session_lost_->store(true);
	}
	disconnect();
	backoff_.failed(now);
	return EIO;
}

void DataPathBase::drop()
{
	disconnect();
	backoff_.failed(Backoff::clock::now());
}

} // namespace rdmaswap
