// SPDX-License-Identifier: MIT
// The disk backup tier (plugin backup=FILE): every write of the volume is also put into a
// local file, asynchronously through a bounded queue. The file serves the reads of slabs that
// have no valid replica left, is the source that repair copies them from onto another donor,
// and brings back, after a restart, the slabs that no donor kept.
//
// Contracts:
// - The file: a header (magic, the volume's name, size and slab size, whether it was closed
//   cleanly, which slabs held data then, and the run it was closed by), then the volume's
//   bytes, sparse, in plaintext. Created if missing (O_EXCL, mode exactly 0600). An existing
//   file is opened without following a symbolic link (O_NOFOLLOW: a link is refused) and must
//   be a regular file owned by the process's effective user with no group or other permission
//   bits: anything else (another user's file, even an empty one, a file others may read, a
//   FIFO) is refused, and so is a file made for another volume (name, size or slab size): the
//   constructor throws, naming the file and why (its owner and mode when they are wrong).
// - put(q, offset, data, len, until): queues `len` bytes (zeros if `data` is null) for
//   `offset`. Queue `q` (0..queues-1) is used by one thread at a time (the volume's channel
//   that holds it): the bytes are copied into a slot allocated at construction, with no lock
//   and no allocation. When the queue is full the caller waits, until `until` at most, for the
//   writer thread (then EIO: the write fails, and the volume has not changed).
// - punch(offset, len, until): queues "this range reads as zeros" (a trim); any thread.
// - The writer thread applies the entries in the order of the calls that queued them (one
//   sequence over all queues), so a later write of a range always wins.
// - read(buf, len, offset, until): waits until every entry queued before the call that
//   touches the range's bytes is in the file (the file is tracked in ranges of at least
//   `chunk` bytes: a read waits for the entries of its own ranges, and for what was queued
//   before them, but not for later entries of other ranges), then reads it. 0, or EIO (the
//   wait timed out, the file failed, or a slab it reads was distrusted meanwhile: a write to
//   it failed in the file).
// - trusted(slab): the file holds the slab's current bytes. True for every slab, except those
//   the file failed to store (a write error: logged, counted) and those restored at start
//   from the donors after a run whose file was not closed cleanly (distrust()). A slab
//   trimmed whole (punch) is trusted again.
// - The destructor writes out everything queued, then marks the file clean if every slab is
//   trusted, with the slabs that hold data (`live`, set by the owner before).
// - The writer thread is an exception boundary (guarded_thread, common/obs/guarded_main.h): if it
//   throws, the backup is failed for the rest of the run: every slab is distrusted (a read
//   that needs the file, or a repair from it, fails: EIO), nothing more is queued (put() and
//   punch() return at once: the writes go on to the donors, which do not need the file), a
//   waiting put() or read() is woken, and the file is not marked clean at the end.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/util/mapped_region.h"
#include "common/volume/slab_lock.h"

namespace rdmaswap {

struct BackupOptions {
	std::string path;
	std::string volume; // the volume's name (stored, checked at open)
	uint64_t size = 0;
	uint64_t slab_size = 0;
	size_t chunk = 256 * 1024; // largest put()
	unsigned queues = 1;       // put() queues (one per I/O channel)
	size_t queue_bytes = 32 << 20; // slots for all queues together (at least 2 per queue)
	// This run's id and the previous run's (the plugin's run file, common/volume/state_files.h):
	// the file is trusted after a restart only if the run that closed it cleanly is the
	// previous run (a run without backup= in between would have changed the volume behind
	// the file's back).
	uint64_t run_id = 0, previous_run_id = 0;
	// Test only: called by the writer thread before it applies each entry; what it throws
	// fails the backup like any exception of the writer (see the contracts above).
	std::function<void()> fault;
};

class Backup {
public:
	// Opens (or creates) the file and reads its header. Throws std::runtime_error.
	explicit Backup(const BackupOptions &opts);
	~Backup();
	Backup(const Backup &) = delete;
	Backup &operator=(const Backup &) = delete;

	// What the file held at open: closed cleanly by the previous run, for this volume.
	// Then live_at_close(slab) tells which slabs held data.
	bool clean() const { return clean_; }
	bool live_at_close(uint64_t slab) const;
	// Start serving (before the first put): `fresh`: the volume starts empty, the file is
	// emptied; else slabs for which `keep` is false and that are empty (`empty`) get zeros,
	// and those not kept and not empty are distrusted. Then the header says "in use" and the
	// writer starts. Throws std::runtime_error if the file cannot be prepared.
	template <typename Keep, typename Empty> void start(bool fresh, Keep keep, Empty empty)
	{
		if (!fresh)
			for (uint64_t s = 0; s < nslabs_; s++)
				if (!keep(s)) {
					if (empty(s))
						zero_now(s);
					else
						distrust(s);
				}
		begin(fresh);
	}

	int put(unsigned q, uint64_t offset, const std::byte *data, uint32_t len,
		std::chrono::steady_clock::time_point until);
	int punch(uint64_t offset, uint64_t len, std::chrono::steady_clock::time_point until);
	int read(std::byte *buf, uint32_t len, uint64_t offset,
		 std::chrono::steady_clock::time_point until);
	bool trusted(uint64_t slab) const
	{
		return !(untrusted_[slab / 64].load(std::memory_order_acquire) &
			 (uint64_t(1) << (slab % 64)));
	}
	void distrust(uint64_t slab);
	// The slabs holding data, recorded in the header at a clean close.
	void set_live(uint64_t slab, bool live);

	const std::string &path() const { return path_; }
	uint64_t untrusted_count() const;
	// The writer thread failed (see the contracts above).
	bool broken() const { return failed_.load(std::memory_order_acquire); }
	uint64_t write_errors() const { return write_errors_.load(); }
	uint64_t full_waits() const { return full_waits_.load(); }
	uint64_t queued_bytes() const { return queued_bytes_.load(); }

private:
	enum class Kind : uint8_t { Data, Zeros, Hole };
	struct Entry {
		uint64_t seq = 0;
		uint64_t offset = 0;
		uint64_t len = 0;
		Kind kind = Kind::Data;
	};
	struct Queue {
		std::unique_ptr<Entry[]> ring;
		std::byte *slots = nullptr; // cap x chunk bytes (Data entries)
		unsigned cap = 0;
		std::atomic<uint64_t> head{0}; // next entry to fill (its producer)
		std::atomic<uint64_t> tail{0}; // next entry to apply (the writer)
	};
	// Reserve an entry of queue q (waiting for room until `until`). Null on timeout.
	Entry *reserve(Queue &q, std::chrono::steady_clock::time_point until);
	void publish(Queue &q, Entry &e);
	void writer_loop();
	// The writer's boundary gave up on it: distrust every slab, then fail (failed_), wake
	// every waiter.
	void writer_failed() noexcept;
	void apply(const Queue &q, const Entry &e);
	// The first and last range (range_seq_) that [offset, offset+len) touches: len > 0,
	// offset < size_.
	std::pair<uint64_t, uint64_t> ranges_of(uint64_t offset, uint64_t len) const;
	// The first and last slab that [offset, offset+len) touches (none past the volume's last:
	// first > last when it starts beyond it); len > 0.
	std::pair<uint64_t, uint64_t> slabs_of(uint64_t offset, uint64_t len) const;
	// The sequence number `seq` is the latest queued for [offset, offset+len) (range_seq_).
	void note_queued(uint64_t offset, uint64_t len, uint64_t seq);
	// The latest sequence number queued for [offset, offset+len) so far.
	uint64_t last_queued(uint64_t offset, uint64_t len) const;
	void begin(bool fresh);
	void zero_now(uint64_t slab);
	void write_header(bool clean);
	// Wait, under mu_, until `done()` or `until`.
	template <typename Done> bool wait(Done done, std::chrono::steady_clock::time_point until);
	void wake_waiters();
	// Record a failed file operation on [offset, offset+len): its slabs are distrusted.
	void failed(const char *what, uint64_t offset, uint64_t len, int err);

	std::string path_, volume_;
	int fd_ = -1;
	uint64_t size_ = 0, slab_size_ = 0, nslabs_ = 0;
	uint64_t data_off_ = 0; // where the volume's bytes start in the file
	size_t chunk_ = 0;
	uint64_t run_id_ = 0;
	bool clean_ = false;
	std::vector<uint8_t> live_at_close_, live_; // bitmaps (the header's)
	std::mutex live_mu_;
	std::unique_ptr<std::atomic<uint64_t>[]> untrusted_;
	MappedRegion region_; // every queue's slots (before the queues, which point into it)
	std::vector<std::unique_ptr<Queue>> queues_; // put() queues, then punch()'s
	TimedMutex punch_mu_;                        // punch()'s queue (slab_lock.h)
	// The last sequence number queued for each range of 2^range_shift_ bytes of the volume
	// (a read waits until the writer has applied it; at most kMaxRanges ranges).
	unsigned range_shift_ = 0;
	std::unique_ptr<std::atomic<uint64_t>[]> range_seq_;
	std::atomic<uint64_t> seq_{0};               // last sequence number handed out
	std::atomic<uint64_t> written_{0};           // every entry up to this one is applied
	std::atomic<uint64_t> published_{0};         // bumped at each publish (writer wakes)
	std::atomic<bool> writer_sleeping_{false};
	std::atomic<bool> stop_{false};
	std::atomic<bool> failed_{false}; // the writer thread failed: nothing more is written
	std::function<void()> fault_;      // BackupOptions::fault
	std::mutex mu_; // waiters for room or for written_
	std::condition_variable cv_;
	std::atomic<unsigned> waiters_{0};
	std::atomic<uint64_t> write_errors_{0}, full_waits_{0}, queued_bytes_{0};
	std::thread writer_;
};

} // namespace rdmaswap
