// SPDX-License-Identifier: MIT
// In-memory fakes of the Server / DataPath interfaces (common/transport/transport.h) for unit tests.
//
// A FakeBackend is the shared state of one fake memserver: its slabs, counters, injected
// failures and the list of contract violations its data paths saw. FakeServer (owned by the
// code under test) and FakeDataPath (one per channel) both point at it, so a test keeps a
// shared_ptr to the backend to inspect it after handing the server away.
#pragma once

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/transport/transport.h"
#include "common/util/counters.h"

namespace rdmaswap::test {

struct FakeBackend {
	explicit FakeBackend(std::string n, uint64_t slab_size, uint32_t nslabs,
			     uint32_t max_io = proto::kMaxIo)
		: name(std::move(n)), max_slabs(nslabs)
	{
		info.slab_size = slab_size;
		info.slabs_total = nslabs;
		info.slabs_free = nslabs;
		info.max_io = max_io;
	}

	const std::string name;
	ServerInfo info;
	uint32_t max_slabs;

	// Injected behaviour (may be flipped at any time).
	std::atomic<int> alloc_error{0};     // alloc_slab returns this when non-zero
	std::atomic<int> free_error{0};      // free_slab returns this (and keeps the slab)
	std::atomic<int> post_error{0};      // post_read/post_write return this
	std::atomic<int> complete_error{0};  // complete() returns this and drops the batch
	std::atomic<bool> lost{false};       // session lost: slabs gone, everything fails
	std::atomic<bool> closed{false};     // close_if_idle() closed the session
	std::atomic<uint64_t> paths_closed{0}; // data paths closed for good
	std::atomic<bool> fail_open{false};  // open_data_path throws
	std::atomic<int> alloc_delay_us{0};  // alloc_slab sleeps this long (widens races)
	// slabs_free() says what is free now, as a memserver's replies keep it (placement reads
	// it); otherwise it stays at the HELLO's count.
	std::atomic<bool> live_free{false};
	// Reattach: a server bound to a volume (tags and floors kept here, like a memserver's
	// detached session); `reattach`: a FakeServer made now hands the slabs back.
	std::atomic<bool> bound{false};
	std::atomic<bool> reattach{false};
	std::atomic<int> tag_error{0};       // set_tag / set_floor return this when non-zero
	std::atomic<int> wanted_error{0};    // wanted_slabs returns this (a hung donor: EAGAIN)
	std::atomic<int> floor_error{0};     // set_floor alone returns this when non-zero
	// Slow donors: complete() sleeps `complete_delay_us`; free_slab, set_tag and set_floor
	// sleep `control_delay_us` (a control call in flight).
	std::atomic<int> complete_delay_us{0};
	std::atomic<int> control_delay_us{0};
	// A read of slab `stall_id` (0: none) does not complete until stall_id changes (at most
	// 10 s); `stalled` counts the reads that started waiting.
	std::atomic<uint32_t> stall_id{0};
	std::atomic<uint64_t> stalled{0};
	std::atomic<uint64_t> floor_calls{0};
	std::atomic<uint64_t> wanted_polls{0};
	std::atomic<uint64_t> hint_refreshes{0}; // refresh_hint() calls

	// Counters.
	std::atomic<uint64_t> allocs{0}, frees{0}, free_calls{0};
	std::atomic<uint64_t> posted_reads{0}, posted_writes{0}, completes{0};
	std::atomic<uint64_t> bytes_read{0}, bytes_written{0};
	std::atomic<uint64_t> paths_opened{0};
	// Server::housekeeping calls (the repair thread's, every pass), and how many of the next
	// ones throw (a bug in the control path: the thread's exception boundary).
	std::atomic<unsigned> housekeepings{0};
	std::atomic<int> housekeeping_throws{0};
	// The data path opened as number `down_path` (0-based, -1: none) is down in a backoff:
	// not ready(), and its posts fail with EIO at once.
	std::atomic<int> down_path{-1};

	mutable std::mutex mu;
	std::map<uint32_t, std::vector<std::byte>> slabs; // id -> contents
	std::map<uint32_t, std::pair<uint64_t, uint64_t>> tags; // id -> (chunk, epoch)
	std::map<uint64_t, uint64_t> floors;                    // chunk -> epoch
	uint32_t next_id = 1000;
	std::set<uint32_t> wanted; // give-back: slabs this server wants back
	std::vector<std::string> violations;

	// Give-back: want every slab granted now back.
	void want_all()
	{
		std::lock_guard lock(mu);
		for (auto &[id, bytes] : slabs)
			wanted.insert(id);
	}

	void violation(const std::string &what)
	{
		std::lock_guard lock(mu);
		violations.push_back(name + ": " + what);
	}
	std::vector<std::string> take_violations() const
	{
		std::lock_guard lock(mu);
		return violations;
	}
	size_t live_slabs() const
	{
		std::lock_guard lock(mu);
		return slabs.size();
	}
	// Lose the session: like a restarted memserver, every slab is gone.
	void lose_session()
	{
		std::lock_guard lock(mu);
		lost = true;
		slabs.clear();
	}
	// Copy of a slab's bytes (empty if the slab does not exist).
	std::vector<std::byte> slab_copy(uint32_t id) const
	{
		std::lock_guard lock(mu);
		auto it = slabs.find(id);
		return it == slabs.end() ? std::vector<std::byte>() : it->second;
	}
	// Fake RDMA-style addressing so a data path can check it got back the grant we made.
	static uint64_t addr_of(uint32_t id) { return 0x7f0000000000ull + uint64_t(id) * 0x100000000ull; }
	static uint32_t rkey_of(uint32_t id) { return id ^ 0x5a5a0000u; }
};

class FakeDataPath final : public DataPath {
public:
	FakeDataPath(std::shared_ptr<FakeBackend> b, std::span<std::byte> region, int index = -2)
		: b_(std::move(b)), region_(region), index_(index)
	{
	}
	bool ready() const override { return index_ != b_->down_path.load(); }
	~FakeDataPath() override
	{
		if (!batch_.empty())
			b_->violation("data path destroyed with " + std::to_string(batch_.size()) +
				      " posted operations never completed");
	}

	int post_read(const SlabGrant &slab, uint64_t off, uint32_t len, std::byte *local) override
	{
		Busy busy(this);
		b_->posted_reads++;
		return post(false, slab, off, len, local);
	}
	int post_write(const SlabGrant &slab, uint64_t off, uint32_t len,
		       const std::byte *local) override
	{
		Busy busy(this);
		b_->posted_writes++;
		return post(true, slab, off, len, const_cast<std::byte *>(local));
	}
	int complete() override
	{
		Busy busy(this);
		b_->completes++;
		batches_.add();
		if (!batch_.empty() && owner_ != std::this_thread::get_id())
			b_->violation("complete() of a batch another thread posted");
		std::vector<Op> batch;
		batch.swap(batch_);
		if (int us = b_->complete_delay_us.load())
			std::this_thread::sleep_for(std::chrono::microseconds(us));
		for (const Op &op : batch)
			if (!op.write && op.id == b_->stall_id.load()) {
				b_->stalled++;
				for (int i = 0; i < 10000 && op.id == b_->stall_id.load(); i++)
					std::this_thread::sleep_for(std::chrono::milliseconds(1));
				break;
			}
		if (int e = b_->complete_error.load())
			return e; // the batch is discarded
		if (b_->lost.load())
			return EIO;
		// Operations take effect at completion, not at post: the caller may not assume
		// anything is done before complete() returns 0.
		std::lock_guard lock(b_->mu);
		if (b_->lost.load())
			return EIO; // lost since the check above (lose_session clears the slabs)
		for (const Op &op : batch) {
			auto it = b_->slabs.find(op.id);
			if (it == b_->slabs.end()) {
				// The slab was freed between post and complete: the caller released a
				// slab with I/O in flight (or the session died).
				b_->violations.push_back(b_->name + ": I/O completed on slab " +
							 std::to_string(op.id) +
							 " that is no longer granted");
				return EACCES;
			}
			std::byte *remote = it->second.data() + op.off;
			if (op.write) {
				std::memcpy(remote, op.local, op.len);
				b_->bytes_written += op.len;
			} else {
				std::memcpy(op.local, remote, op.len);
				b_->bytes_read += op.len;
			}
		}
		return 0;
	}
	// posts: operations accepted; batches: complete() calls (what status_text sums).
	DataPathCounters counters() const override
	{
		DataPathCounters c;
		c.posts = posts_.get();
		c.batches = batches_.get();
		return c;
	}
	void close_for_good() override
	{
		Busy busy(this); // the closer must be the only user (it holds the channel)
		if (!closed_)
			b_->paths_closed++;
		closed_ = true;
	}

private:
	struct Op {
		bool write;
		uint32_t id;
		uint64_t off;
		uint32_t len;
		std::byte *local;
	};
	// The DataPath is not thread-safe: flag concurrent use.
	struct Busy {
		explicit Busy(FakeDataPath *p) : p_(p)
		{
			if (p_->busy_.exchange(true))
				p_->b_->violation("data path used by two threads at once");
		}
		~Busy() { p_->busy_.store(false); }
		FakeDataPath *p_;
	};

	int post(bool write, const SlabGrant &g, uint64_t off, uint32_t len, std::byte *local)
	{
		if (closed_) {
			b_->violation("post on a data path closed for good");
			return EIO;
		}
		if (int e = b_->post_error.load())
			return e;
		if (!ready())
			return EIO;
		if (b_->lost.load())
			return EIO;
		const std::string what = std::string(write ? "write" : "read") + " slab " +
					 std::to_string(g.id) + " off " + std::to_string(off) +
					 " len " + std::to_string(len);
		if (len == 0 || len > proto::kMaxIo) {
			b_->violation(what + ": length outside 1..kMaxIo");
			return EINVAL;
		}
		if (g.length != b_->info.slab_size || off > g.length || g.length - off < len) {
			b_->violation(what + ": outside the slab");
			return EINVAL;
		}
		if (g.addr != FakeBackend::addr_of(g.id) || g.rkey != FakeBackend::rkey_of(g.id)) {
			b_->violation(what + ": grant is not one this server made");
			return EINVAL;
		}
		{
			std::lock_guard lock(b_->mu);
			if (b_->lost.load())
				return EIO; // lost since the check above: like it, not a violation
			if (!b_->slabs.count(g.id)) {
				b_->violations.push_back(b_->name + ": " + what +
							 ": slab not granted");
				return EINVAL;
			}
		}
		if (local < region_.data() || local > region_.data() + region_.size() ||
		    size_t(region_.data() + region_.size() - local) < len) {
			b_->violation(what + ": local buffer outside the registered region");
			return EINVAL;
		}
		if (batch_.size() >= kMaxBatch) {
			b_->violation(what + ": more than kMaxBatch operations posted");
			return ENOBUFS;
		}
		if (!batch_.empty() && batch_.front().write != write) {
			b_->violation(what + ": reads and writes mixed in one batch");
			return EINVAL;
		}
		if (batch_.empty())
			owner_ = std::this_thread::get_id();
		else if (owner_ != std::this_thread::get_id())
			b_->violation(what + ": posted to a batch another thread started");
		batch_.push_back(Op{write, g.id, off, len, local});
		posts_.add();
		return 0;
	}

	std::shared_ptr<FakeBackend> b_;
	std::span<std::byte> region_;
	const int index_; // its number among the backend's paths (FakeBackend::down_path)
	std::vector<Op> batch_;
	std::thread::id owner_; // the thread that posted batch_'s first operation
	std::atomic<bool> busy_{false};
	bool closed_ = false;
	SoloCounter posts_, batches_;
};

class FakeServer : public Server { // not final: bench/cpu_per_request.cpp swaps its data path
public:
	explicit FakeServer(std::shared_ptr<FakeBackend> b) : b_(std::move(b))
	{
		std::lock_guard lock(b_->mu);
		// As the memserver: a kept session is taken over (BIND says reattached) whatever it
		// holds, slabs or only floors; a donor with neither stands for one that kept nothing.
		reattached_ = b_->reattach.load() && (!b_->slabs.empty() || !b_->floors.empty());
	}

	const ServerInfo &info() const override { return b_->info; }
	const std::string &name() const override { return b_->name; }
	uint32_t slabs_free() const override
	{
		if (!b_->live_free.load())
			return b_->info.slabs_free;
		std::lock_guard lock(b_->mu);
		return b_->max_slabs - std::min(b_->max_slabs, uint32_t(b_->slabs.size()));
	}

	int alloc_slab(SlabGrant &out) override
	{
		if (b_->lost.load())
			return EIO;
		if (int e = b_->alloc_error.load())
			return e;
		if (int us = b_->alloc_delay_us.load())
			std::this_thread::sleep_for(std::chrono::microseconds(us));
		std::lock_guard lock(b_->mu);
		if (b_->closed.load()) { // (checked under mu, as RemoteServer does)
			b_->violations.push_back(b_->name + ": ALLOC on a session closed for being idle");
			return ENOTCONN;
		}
		if (b_->slabs.size() >= b_->max_slabs)
			return ENOSPC;
		const uint32_t id = b_->next_id++;
		b_->slabs.emplace(id, std::vector<std::byte>(b_->info.slab_size));
		b_->allocs++;
		out.id = id;
		out.length = b_->info.slab_size;
		out.addr = FakeBackend::addr_of(id);
		out.rkey = FakeBackend::rkey_of(id);
		return 0;
	}
	int free_slab(uint32_t id) override
	{
		b_->free_calls++;
		control_delay();
		if (b_->lost.load())
			return EIO;
		if (int e = b_->free_error.load())
			return e;
		std::lock_guard lock(b_->mu);
		b_->tags.erase(id);
		b_->wanted.erase(id);
		if (!b_->slabs.erase(id)) {
			b_->violations.push_back(b_->name + ": free of slab " + std::to_string(id) +
						 " that is not granted");
			return EINVAL;
		}
		b_->frees++;
		return 0;
	}
	int wanted_slabs(std::vector<uint32_t> &ids) override
	{
		b_->wanted_polls++;
		if (b_->lost.load())
			return EIO;
		if (int e = b_->wanted_error.load())
			return e;
		std::lock_guard lock(b_->mu);
		ids.assign(b_->wanted.begin(), b_->wanted.end());
		return 0;
	}
	int refresh_hint() override
	{
		b_->hint_refreshes++;
		return b_->lost.load() ? EIO : b_->wanted_error.load();
	}
	int stats(proto::StatsReply &out) override
	{
		std::lock_guard lock(b_->mu);
		out = proto::StatsReply{};
		out.slab_size = b_->info.slab_size;
		out.capacity = b_->info.slab_size * b_->max_slabs;
		out.slabs_total = b_->max_slabs;
		out.slabs_free = b_->max_slabs - uint32_t(b_->slabs.size());
		return 0;
	}
	std::unique_ptr<DataPath> open_data_path(std::span<std::byte> region) override
	{
		if (b_->fail_open.load())
			throw std::runtime_error("fake: cannot open data path");
		const int index = int(b_->paths_opened++);
		return std::make_unique<FakeDataPath>(b_, region, index);
	}
	bool session_alive() const override { return !b_->lost.load() && !b_->closed.load(); }
	void housekeeping() override
	{
		b_->housekeepings++;
		if (b_->housekeeping_throws.fetch_sub(1) > 0)
			throw std::runtime_error("fake: housekeeping throws");
	}
	bool close_if_idle() override
	{
		std::lock_guard lock(b_->mu);
		if (!b_->slabs.empty() || !b_->floors.empty())
			return false;
		b_->closed = true;
		return true;
	}

	bool bound() const override { return b_->bound.load(); }
	bool reattached() const override { return reattached_; }
	int alloc_tagged(uint64_t chunk, uint64_t epoch, SlabGrant &out) override
	{
		if (int e = alloc_slab(out))
			return e;
		std::lock_guard lock(b_->mu);
		b_->tags[out.id] = {chunk, epoch};
		return 0;
	}
	int set_tag(uint32_t id, uint64_t chunk, uint64_t epoch) override
	{
		control_delay();
		if (b_->lost.load())
			return EIO;
		if (int e = b_->tag_error.load())
			return e;
		std::lock_guard lock(b_->mu);
		if (!b_->slabs.count(id))
			return EACCES;
		b_->tags[id] = {chunk, epoch};
		return 0;
	}
	int set_floor(uint64_t chunk, uint64_t epoch) override
	{
		b_->floor_calls++;
		control_delay();
		if (b_->lost.load())
			return EIO;
		if (int e = b_->tag_error.load())
			return e;
		if (int e = b_->floor_error.load())
			return e;
		std::lock_guard lock(b_->mu);
		if (b_->closed.load())
			return ENOTCONN; // (a witness closed just after record_floor chose it)
		b_->floors[chunk] = epoch;
		return 0;
	}
	int list_volume(std::vector<proto::VolumeEntry> &slabs,
			std::vector<proto::VolumeEntry> &floors) override
	{
		std::lock_guard lock(b_->mu);
		slabs.clear();
		floors.clear();
		for (const auto &[id, data] : b_->slabs) {
			const auto t = b_->tags.count(id) ? b_->tags[id] : std::pair<uint64_t, uint64_t>{};
			slabs.push_back({id, FakeBackend::rkey_of(id), FakeBackend::addr_of(id), t.first,
					 t.second});
		}
		for (const auto &[chunk, epoch] : b_->floors)
			floors.push_back({proto::kNoSlab, 0, 0, chunk, epoch});
		return 0;
	}

private:
	void control_delay() const
	{
		if (int us = b_->control_delay_us.load())
			std::this_thread::sleep_for(std::chrono::microseconds(us));
	}
	std::shared_ptr<FakeBackend> b_;
	bool reattached_ = false;
};

} // namespace rdmaswap::test
