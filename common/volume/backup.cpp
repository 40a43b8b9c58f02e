// SPDX-License-Identifier: MIT
// The disk backup tier: see backup.h.
#include "common/volume/backup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "common/obs/guarded_main.h"
#include "common/obs/log.h"
#include "common/util/err_text.h"
#include "common/util/private_file.h"

namespace rdmaswap {

namespace {
constexpr char kMagic[16] = "rdmaswap-backup";
constexpr uint32_t kVersion = 1;
constexpr size_t kNameMax = 256;
constexpr uint64_t kMaxRanges = 65536; // read()'s ranges (Backup::range_seq_)
// The header: fixed fields, then the live bitmap; the volume's bytes start at the next 4 KiB.
struct HeaderFixed {
	char magic[16];
	uint32_t version;
	uint32_t clean;
	uint64_t size;
	uint64_t slab_size;
	uint64_t run_id;
	char volume[kNameMax];
};
static_assert(sizeof(HeaderFixed) == 16 + 8 + 24 + kNameMax);

std::runtime_error error(const std::string &path, const std::string &what, int err = 0)
{
	return std::runtime_error("backup=" + path + ": " + what +
				  (err ? std::string(": ") + err_text(err) : std::string()));
}

bool pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	const auto *p = static_cast<const std::byte *>(buf);
	while (len) {
		const ssize_t n = ::pwrite(fd, p, len, off_t(off));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n, len -= size_t(n), off += uint64_t(n);
	}
	return true;
}

bool pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	auto *p = static_cast<std::byte *>(buf);
	while (len) {
		const ssize_t n = ::pread(fd, p, len, off_t(off));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return false;
		if (n == 0) { // beyond the end: a sparse file's tail reads zeros
			std::memset(p, 0, len);
			return true;
		}
		p += n, len -= size_t(n), off += uint64_t(n);
	}
	return true;
}

// Open the backup file, or create it if it does not exist: O_EXCL, mode exactly 0600. An
// existing one is opened with O_NOFOLLOW (a symbolic link is refused: it may point anywhere)
// and O_NONBLOCK (a FIFO never blocks the open); the caller checks what it is. Throws.
int open_file(const std::string &path)
{
	for (int attempt = 0;; attempt++) {
		int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd >= 0) {
			if (::fchmod(fd, 0600) != 0) { // exactly 0600, whatever the umask
				const int e = errno;
				::close(fd);
				throw error(path, "fchmod", e);
			}
			return fd;
		}
		if (errno != EEXIST) // (a symbolic link, even a dangling one, is EEXIST)
			throw error(path, "cannot create", errno);
		fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
		if (fd >= 0)
			return fd;
		const int e = errno;
		struct stat lst {};
		if (e == ELOOP && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
			throw error(path, "is a symbolic link, which is not followed: name the file "
					  "itself");
		if (e != ENOENT || attempt == 2) // (ENOENT: removed meanwhile; try again)
			throw error(path, "cannot open", e);
	}
}
} // namespace

Backup::Backup(const BackupOptions &o)
	: path_(o.path), volume_(o.volume), size_(o.size), slab_size_(o.slab_size),
	  chunk_(o.chunk), run_id_(o.run_id), fault_(o.fault)
{
	if (size_ == 0 || slab_size_ == 0 || chunk_ == 0 || o.queues == 0)
		throw error(path_, "bad parameters");
	if (volume_.size() >= kNameMax)
		throw error(path_, "volume name too long");
	nslabs_ = (size_ + slab_size_ - 1) / slab_size_;
	const uint64_t bitmap = (nslabs_ + 7) / 8;
	data_off_ = (sizeof(HeaderFixed) + bitmap + 4095) / 4096 * 4096;
	live_at_close_.assign(bitmap, 0);
	live_.assign(bitmap, 0);
	untrusted_ = std::make_unique<std::atomic<uint64_t>[]>((nslabs_ + 63) / 64);
	// Ranges of at least a chunk (a put's largest), at most kMaxRanges of them (a 64 GiB
	// volume: 1 MiB ranges, 512 KiB of counters).
	while ((uint64_t(1) << range_shift_) < chunk_ ||
	       ((size_ - 1) >> range_shift_) + 1 > kMaxRanges)
		range_shift_++;
	range_seq_ = std::make_unique<std::atomic<uint64_t>[]>(((size_ - 1) >> range_shift_) + 1);
	fd_ = open_file(path_);
	try {
		struct stat st;
		if (fstat(fd_, &st) != 0)
			throw error(path_, "cannot stat", errno);
		if (!S_ISREG(st.st_mode))
			throw error(path_, std::string("not a regular file (") + file_kind(st.st_mode) +
						   ")");
		// The file holds swapped pages in plaintext: another user's file (they could read
		// it, or have put bytes in it) or one others may read is never used.
		if (std::string problem = private_file_problem(st); !problem.empty())
			throw error(path_, problem + ". The backup file holds swap pages in plaintext: "
						     "if it is this volume's backup file, chown it "
						     "to the user nbdkit runs as and chmod 600 it; "
						     "else remove it (a new one is made, mode "
						     "0600) or name another file");
		// (O_NONBLOCK only kept the open from blocking on a FIFO.)
		const int flags = fcntl(fd_, F_GETFL);
		if (flags < 0 || fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) != 0)
			throw error(path_, "fcntl", errno);
		if (st.st_size > 0) {
			HeaderFixed h{};
			if (!pread_all(fd_, &h, sizeof h, 0) ||
			    std::memcmp(h.magic, kMagic, sizeof kMagic) != 0)
				throw error(path_, "exists and is not an rdmaswap backup file (remove it, "
						   "or name another file)");
			h.volume[kNameMax - 1] = 0;
			if (h.version != kVersion)
				throw error(path_, "backup file version " + std::to_string(h.version) +
							   ", this plugin knows " +
							   std::to_string(kVersion));
			if (volume_ != h.volume || h.size != size_ || h.slab_size != slab_size_)
				throw error(path_, "made for volume '" + std::string(h.volume) + "' of " +
							   std::to_string(h.size) + " bytes in slabs of " +
							   std::to_string(h.slab_size) +
							   " (this is volume '" + volume_ + "' of " +
							   std::to_string(size_) + " bytes in slabs of " +
							   std::to_string(slab_size_) +
							   "); remove it, or name another file");
			clean_ = h.clean == 1 && h.run_id != 0 && h.run_id == o.previous_run_id;
			if (h.clean == 1 && !clean_)
				logger("backup")->warn("backup {}: closed cleanly, but by an earlier run "
						       "than the last one: not used for slabs no donor "
						       "kept",
						       path_);
			if (clean_ && !pread_all(fd_, live_at_close_.data(), bitmap, sizeof h))
				throw error(path_, "cannot read the header", errno);
		}
		// The slots of every queue: at least 2 per queue, `queue_bytes` in all.
		const unsigned per = unsigned(std::max<size_t>(2, o.queue_bytes / chunk_ / o.queues));
		if (const int err = region_.map(size_t(per) * o.queues * chunk_))
			throw error(path_, "cannot map the queue", err);
		if (const int err = region_.lock())
			logger("backup")->warn("cannot lock the backup queue's {} bytes: {}",
					       region_.size(), err_text(err));
		for (unsigned i = 0; i <= o.queues; i++) {
			auto q = std::make_unique<Queue>();
			q->cap = i < o.queues ? per : 64; // the last one: punch()'s (no data)
			q->ring = std::make_unique<Entry[]>(q->cap);
			if (i < o.queues)
				q->slots = region_.data() + size_t(i) * per * chunk_;
			queues_.push_back(std::move(q));
		}
	} catch (...) {
		::close(fd_); // (region_ unmaps itself)
		throw;
	}
}

Backup::~Backup()
{
	// A destructor must not throw (joining or logging could): if closing fails so, the file
	// is simply not marked clean, which a restart treats as not to be trusted.
	try {
		if (writer_.joinable()) {
			stop_.store(true);
			published_.fetch_add(1);
			published_.notify_all();
			writer_.join(); // it applies everything queued first
			const bool ok = ::fdatasync(fd_) == 0 && untrusted_count() == 0 &&
					write_errors_ == 0;
			write_header(ok);
			if (ok)
				logger("backup")->info("backup {}: closed cleanly", path_);
			else
				logger("backup")->warn("backup {}: not marked clean ({} slabs not "
						       "backed, {} write errors): a restart will not "
						       "use it for slabs no donor kept",
						       path_, untrusted_count(), write_errors_.load());
		}
	} catch (...) {
	}
	::close(fd_);
}

bool Backup::live_at_close(uint64_t slab) const
{
	return live_at_close_[slab / 8] & (1u << (slab % 8));
}

void Backup::set_live(uint64_t slab, bool live)
{
	std::lock_guard lock(live_mu_);
	if (live)
		live_[slab / 8] |= uint8_t(1u << (slab % 8));
	else
		live_[slab / 8] &= uint8_t(~(1u << (slab % 8)));
}

void Backup::distrust(uint64_t slab)
{
	untrusted_[slab / 64].fetch_or(uint64_t(1) << (slab % 64));
}

uint64_t Backup::untrusted_count() const
{
	uint64_t n = 0;
	for (uint64_t w = 0; w < (nslabs_ + 63) / 64; w++)
		n += uint64_t(std::popcount(untrusted_[w].load()));
	return std::min(n, nslabs_); // (a failed writer sets the bits past the last slab too)
}

void Backup::zero_now(uint64_t slab)
{
	const uint64_t off = slab * slab_size_;
	const uint64_t len = std::min(slab_size_, size_ - off);
	if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(data_off_ + off),
		      off_t(len)) != 0)
		throw error(path_, "cannot zero slab " + std::to_string(slab), errno);
}

void Backup::write_header(bool clean)
{
	HeaderFixed h{};
	std::memcpy(h.magic, kMagic, sizeof kMagic);
	h.version = kVersion;
	h.clean = clean ? 1 : 0;
	h.size = size_;
	h.slab_size = slab_size_;
	h.run_id = run_id_;
	std::memcpy(h.volume, volume_.data(), volume_.size());
	std::vector<std::byte> buf(data_off_);
	std::memcpy(buf.data(), &h, sizeof h);
	{
		std::lock_guard lock(live_mu_);
		std::memcpy(buf.data() + sizeof h, live_.data(), live_.size());
	}
	if (!pwrite_all(fd_, buf.data(), buf.size(), 0) || ::fdatasync(fd_) != 0)
		throw error(path_, "cannot write the header", errno);
}

void Backup::begin(bool fresh)
{
	if (fresh) {
		// An empty volume: the file reads zeros everywhere.
		if (ftruncate(fd_, off_t(data_off_)) != 0)
			throw error(path_, "cannot empty", errno);
		std::fill(live_.begin(), live_.end(), 0);
	}
	if (ftruncate(fd_, off_t(data_off_ + size_)) != 0)
		throw error(path_, "cannot size", errno);
	write_header(false); // in use: a crash leaves it not clean
	writer_ = std::thread([this] {
		guarded_thread("backup", "the backup writer",
			       "the backup file is no longer written nor trusted (a read that needs "
			       "it fails with EIO; writes go on to the donors)",
			       [this] { writer_loop(); },
			       [this](const char *) {
				       writer_failed();
				       return AfterFailure::End;
			       });
	});
}

void Backup::writer_failed() noexcept
{
	// Every slab distrusted first: whoever sees failed_ finds none trusted.
	for (uint64_t w = 0; w < (nslabs_ + 63) / 64; w++)
		untrusted_[w].store(~uint64_t(0));
	failed_.store(true, std::memory_order_release);
	try {
		{
			std::lock_guard lock(mu_); // a waiter is either before its check or inside wait()
		}
		cv_.notify_all();
	} catch (...) { // (std::system_error from the mutex: the waiters end at their deadline)
	}
}

template <typename Done>
bool Backup::wait(Done done, std::chrono::steady_clock::time_point until)
{
	std::unique_lock lock(mu_);
	waiters_.fetch_add(1);
	const bool ok = cv_.wait_until(lock, until, done);
	waiters_.fetch_sub(1);
	return ok;
}

void Backup::wake_waiters()
{
	if (waiters_.load() == 0)
		return;
	{
		std::lock_guard lock(mu_); // a waiter is either before its check or inside wait()
	}
	cv_.notify_all();
}

Backup::Entry *Backup::reserve(Queue &q, std::chrono::steady_clock::time_point until)
{
	const uint64_t h = q.head.load(std::memory_order_relaxed);
	if (h - q.tail.load(std::memory_order_acquire) >= q.cap) {
		full_waits_.fetch_add(1, std::memory_order_relaxed);
		if (!wait([&] { return broken() || h - q.tail.load(std::memory_order_acquire) < q.cap; },
			  until) ||
		    broken())
			return nullptr;
	}
	return &q.ring[h % q.cap];
}

void Backup::publish(Queue &q, Entry &e)
{
	// The sequence number is taken last: everything queued before it (by any thread) has a
	// lower one, and the writer applies them in that order.
	e.seq = seq_.fetch_add(1) + 1;
	note_queued(e.offset, e.len, e.seq);
	q.head.store(q.head.load(std::memory_order_relaxed) + 1, std::memory_order_release);
	published_.fetch_add(1);
	if (writer_sleeping_.load())
		published_.notify_one();
}

int Backup::put(unsigned qi, uint64_t offset, const std::byte *data, uint32_t len,
		std::chrono::steady_clock::time_point until)
{
	Queue &q = *queues_[qi];
	if (len > chunk_)
		return EINVAL;
	if (broken())
		return 0; // the file is trusted for no slab any more: the write needs it no longer
	Entry *e = reserve(q, until);
	if (!e && broken())
		return 0;
	if (!e) {
		logger("backup")->debug("backup: no room in the queue within the timeout");
		return EIO;
	}
	const uint64_t slot = q.head.load(std::memory_order_relaxed) % q.cap;
	e->offset = offset;
	e->len = len;
	e->kind = data ? Kind::Data : Kind::Zeros;
	if (data)
		std::memcpy(q.slots + slot * chunk_, data, len);
	queued_bytes_.fetch_add(len, std::memory_order_relaxed);
	publish(q, *e);
	return 0;
}

int Backup::punch(uint64_t offset, uint64_t len, std::chrono::steady_clock::time_point until)
{
	if (broken() || !punch_mu_.try_lock_until(until))
		return EIO;
	std::unique_lock lock(punch_mu_, std::adopt_lock);
	Queue &q = *queues_.back();
	Entry *e = reserve(q, until);
	if (!e)
		return EIO;
	e->offset = offset;
	e->len = len;
	e->kind = Kind::Hole;
	publish(q, *e);
	return 0;
}

std::pair<uint64_t, uint64_t> Backup::ranges_of(uint64_t offset, uint64_t len) const
{
	return {offset >> range_shift_, std::min(size_ - 1, offset + len - 1) >> range_shift_};
}

std::pair<uint64_t, uint64_t> Backup::slabs_of(uint64_t offset, uint64_t len) const
{
	return {offset / slab_size_, std::min(nslabs_ - 1, (offset + len - 1) / slab_size_)};
}

void Backup::note_queued(uint64_t offset, uint64_t len, uint64_t seq)
{
	if (len == 0 || offset >= size_)
		return;
	const auto [first, last] = ranges_of(offset, len);
	for (uint64_t r = first; r <= last; r++) {
		// (entries of several threads may note the same range in either order: keep the
		// highest)
		uint64_t cur = range_seq_[r].load();
		while (cur < seq && !range_seq_[r].compare_exchange_weak(cur, seq)) {
		}
	}
}

uint64_t Backup::last_queued(uint64_t offset, uint64_t len) const
{
	uint64_t seq = 0;
	if (len == 0 || offset >= size_)
		return 0;
	const auto [first, last] = ranges_of(offset, len);
	for (uint64_t r = first; r <= last; r++)
		seq = std::max(seq, range_seq_[r].load());
	return seq;
}

int Backup::read(std::byte *buf, uint32_t len, uint64_t offset,
		 std::chrono::steady_clock::time_point until)
{
	// A write acknowledged before this read noted its range before put() returned; what is
	// queued for other ranges (under swap, the queue keeps growing) is not waited for.
	const uint64_t target = last_queued(offset, len);
	if (broken())
		return EIO;
	if (written_.load() < target &&
	    (!wait([&] { return broken() || written_.load() >= target; }, until) || broken())) {
		logger("backup")->debug("backup: a read waited for the queue beyond the timeout");
		return EIO;
	}
	// A write that failed in the file (applied while this read waited) left its slabs with
	// older bytes there: those are never returned.
	if (len) {
		const auto [first, last] = slabs_of(offset, len);
		for (uint64_t s = first; s <= last; s++)
			if (!trusted(s)) {
				logger("backup")->debug("backup: slab {} is no longer backed: its read "
							"fails",
							s);
				return EIO;
			}
	}
	if (!pread_all(fd_, buf, len, data_off_ + offset)) {
		logger("backup")->error("backup {}: read of {} bytes at {} failed: {}", path_, len,
					offset, err_text(errno));
		return EIO;
	}
	return 0;
}

void Backup::failed(const char *what, uint64_t offset, uint64_t len, int err)
{
	const uint64_t n = write_errors_.fetch_add(1);
	if (n < 10 || n % 1000 == 0)
		logger("backup")->error("backup {}: {} of {} bytes at {} failed: {}; its slabs are no "
					"longer backed ({} errors so far)",
					path_, what, len, offset, err_text(err), n + 1);
	const auto [first, last] = slabs_of(offset, len);
	for (uint64_t s = first; s <= last; s++)
		distrust(s);
}

void Backup::apply(const Queue &q, const Entry &e)
{
	const uint64_t at = data_off_ + e.offset;
	if (e.kind == Kind::Data) {
		const std::byte *src = q.slots + (&e - q.ring.get()) * chunk_;
		if (!pwrite_all(fd_, src, e.len, at))
			failed("write", e.offset, e.len, errno);
		return;
	}
	// Zeros and holes: deallocate the range (it reads zeros).
	if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(at), off_t(e.len)) != 0) {
		failed("zeroing", e.offset, e.len, errno);
		return;
	}
	if (e.kind == Kind::Hole) // whole slabs: their content is known again (zeros)
		for (uint64_t s = e.offset / slab_size_; s < (e.offset + e.len) / slab_size_; s++)
			untrusted_[s / 64].fetch_and(~(uint64_t(1) << (s % 64)));
}

void Backup::writer_loop()
{
	for (;;) {
		const uint64_t next = written_.load() + 1;
		Queue *found = nullptr;
		for (auto &q : queues_) {
			const uint64_t t = q->tail.load(std::memory_order_relaxed);
			if (t != q->head.load(std::memory_order_acquire) &&
			    q->ring[t % q->cap].seq == next) {
				found = q.get();
				break;
			}
		}
		if (found) {
			const uint64_t t = found->tail.load(std::memory_order_relaxed);
			const Entry &e = found->ring[t % found->cap];
			if (fault_)
				fault_();
			apply(*found, e);
			if (e.kind != Kind::Hole)
				queued_bytes_.fetch_sub(e.len, std::memory_order_relaxed);
			found->tail.store(t + 1, std::memory_order_release);
			written_.store(next);
			wake_waiters();
			continue;
		}
		if (stop_.load() && written_.load() == seq_.load())
			return;
		// Nothing with the next number yet: sleep until something is published.
		writer_sleeping_.store(true);
		const uint64_t seen = published_.load();
		bool ready = false;
		for (auto &q : queues_) {
			const uint64_t t = q->tail.load(std::memory_order_relaxed);
			ready = ready || (t != q->head.load(std::memory_order_acquire) &&
					  q->ring[t % q->cap].seq == next);
		}
		if (!ready && !stop_.load())
			published_.wait(seen);
		writer_sleeping_.store(false);
	}
}

} // namespace rdmaswap
