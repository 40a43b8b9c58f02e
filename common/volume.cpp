// SPDX-License-Identifier: MIT
// Volume: slab map, lazy allocation, per-thread channels, chunked I/O.
#include "common/volume.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "common/log.h"

namespace rdmaswap {

namespace {
// At most this many slabs are touched by one chunk, so one chunk never posts more than
// kMaxBatch operations to one data path.
constexpr unsigned kMaxPieces = 8;
static_assert(kMaxPieces <= kMaxBatch);

std::atomic<unsigned> g_next_thread{0};
thread_local unsigned t_thread_index = g_next_thread.fetch_add(1);
} // namespace

Volume::Volume(std::vector<std::unique_ptr<Server>> servers, const VolumeOptions &opts)
	: servers_(std::move(servers)), size_(opts.size), buffer_size_(opts.buffer_size),
	  timeout_(opts.timeout)
{
	if (servers_.empty())
		throw std::runtime_error("a volume needs at least one memserver");
	if (servers_.size() > kMaxServers)
		throw std::runtime_error("at most " + std::to_string(kMaxServers) + " memservers");
	if (size_ == 0)
		throw std::runtime_error("volume size must be greater than 0");
	if (opts.channels == 0 || opts.channels > 1024)
		throw std::runtime_error("channels must be between 1 and 1024");
	slab_size_ = servers_[0]->info().slab_size;
	if (slab_size_ < 4096 || (slab_size_ & (slab_size_ - 1)) != 0)
		throw std::runtime_error("memserver " + servers_[0]->name() +
					 " reports a slab size that is not a power of two >= 4096");
	for (auto &s : servers_) {
		if (s->info().slab_size != slab_size_)
			throw std::runtime_error("memservers " + servers_[0]->name() + " and " +
						 s->name() + " use different slab sizes");
		if (s->info().max_io < buffer_size_)
			throw std::runtime_error("memserver " + s->name() +
						 " accepts smaller I/O than the channel buffer");
	}
	if (buffer_size_ == 0 || buffer_size_ % 4096 != 0 || buffer_size_ > proto::kMaxIo)
		throw std::runtime_error("channel buffer size must be a multiple of 4096 up to 1 MiB");
	nslabs_ = (size_ + slab_size_ - 1) / slab_size_;
	uint64_t capacity = 0;
	for (auto &s : servers_)
		capacity += uint64_t(s->info().slabs_total) * slab_size_;
	if (capacity < size_)
		logger("volume")->warn("volume of {} bytes is larger than the memservers' total "
				       "capacity of {} bytes: writes will fail with ENOSPC when it "
				       "is full",
				       size_, capacity);
	slabs_ = std::make_unique<Slab[]>(nslabs_);

	region_len_ = buffer_size_ * opts.channels;
	void *p = mmap(nullptr, region_len_, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (p == MAP_FAILED)
		throw std::runtime_error(std::string("cannot map channel buffers: ") +
					 std::strerror(errno));
	region_ = static_cast<std::byte *>(p);
	if (mlock(region_, region_len_) != 0)
		logger("volume")->warn("cannot lock {} bytes of channel buffers: {}", region_len_,
				       std::strerror(errno));
	std::span<std::byte> region(region_, region_len_);
	try {
		for (unsigned i = 0; i < opts.channels; i++) {
			auto ch = std::make_unique<Channel>();
			ch->buf = region_ + size_t(i) * buffer_size_;
			for (auto &s : servers_)
				ch->paths.push_back(s->open_data_path(region));
			channels_.push_back(std::move(ch));
		}
	} catch (...) {
		channels_.clear();
		munmap(region_, region_len_);
		throw;
	}
}

Volume::~Volume()
{
	channels_.clear(); // data paths reference the region: drop them first
	if (region_)
		munmap(region_, region_len_);
}

VolumeStats Volume::stats() const
{
	VolumeStats st;
	st.slabs = nslabs_;
	for (uint64_t i = 0; i < nslabs_; i++)
		if (slabs_[i].state.load(std::memory_order_relaxed) == Live)
			st.slabs_live++;
	return st;
}

Volume::Channel &Volume::channel()
{
	return *channels_[t_thread_index % channels_.size()];
}

int Volume::check_range(uint64_t count, uint64_t offset) const
{
	if (offset > size_ || size_ - offset < count)
		return EINVAL;
	return 0;
}

unsigned Volume::split(uint64_t offset, uint32_t len, Piece *out) const
{
	unsigned n = 0;
	uint32_t pos = 0;
	while (pos < len) {
		const uint64_t at = offset + pos;
		const uint64_t slab = at / slab_size_;
		const uint64_t off = at % slab_size_;
		const uint32_t piece = uint32_t(std::min<uint64_t>(len - pos, slab_size_ - off));
		out[n++] = Piece{slab, off, piece, pos, false};
		pos += piece;
	}
	return n;
}

int Volume::wait_state(Slab &s, uint8_t from)
{
	// Another thread is allocating or giving back this slab; that takes one control call,
	// itself bounded by the timeout.
	const auto deadline = std::chrono::steady_clock::now() + 2 * timeout_;
	while (s.state.load() == from) {
		if (std::chrono::steady_clock::now() > deadline)
			return EIO;
		std::this_thread::sleep_for(std::chrono::microseconds(50));
	}
	return 0;
}

Volume::Access Volume::acquire_read(uint64_t slab)
{
	Slab &s = slabs_[slab];
	for (;;) {
		s.inflight.fetch_add(1);
		const uint8_t st = s.state.load();
		if (st == Live) {
			if (!servers_[s.server]->session_alive()) {
				s.inflight.fetch_sub(1);
				return Access::Error;
			}
			return Access::Live;
		}
		s.inflight.fetch_sub(1);
		// Empty reads as zeros; so does a slab being given back (the trim that frees it is
		// concurrent with this read, and either order is a valid answer). A slab being
		// allocated holds zeros until the allocating write completes.
		if (st == Empty || st == Freeing || st == Allocating)
			return Access::Zeros;
	}
}

int Volume::allocate(Slab &s)
{
	const unsigned n = unsigned(servers_.size());
	const unsigned start = next_server_.fetch_add(1) % n;
	int err = ENOSPC;
	for (unsigned k = 0; k < n; k++) {
		const unsigned i = (start + k) % n;
		SlabGrant g;
		err = servers_[i]->alloc_slab(g);
		if (err == 0) {
			s.grant = g;
			s.server = uint16_t(i);
			return 0;
		}
	}
	return err;
}

int Volume::acquire_write(uint64_t slab)
{
	Slab &s = slabs_[slab];
	for (;;) {
		s.inflight.fetch_add(1);
		uint8_t st = s.state.load();
		if (st == Live) {
			if (!servers_[s.server]->session_alive()) {
				s.inflight.fetch_sub(1);
				return EIO;
			}
			return 0;
		}
		s.inflight.fetch_sub(1);
		if (st == Empty) {
			if (!s.state.compare_exchange_strong(st, Allocating))
				continue;
			const int err = allocate(s);
			s.state.store(err ? Empty : Live);
			if (err) {
				logger("volume")->error("cannot allocate slab {}: {}", slab,
							std::strerror(err));
				return err == ENOSPC ? ENOSPC : EIO;
			}
			continue;
		}
		if (int err = wait_state(s, st))
			return err;
	}
}

int Volume::give_back(uint64_t slab)
{
	Slab &s = slabs_[slab];
	for (;;) {
		uint8_t st = s.state.load();
		if (st == Empty)
			return 0;
		if (st == Live) {
			if (!s.state.compare_exchange_strong(st, Freeing))
				continue;
			// Wait for I/O that acquired the slab before we marked it.
			const auto deadline = std::chrono::steady_clock::now() + 2 * timeout_;
			while (s.inflight.load() != 0) {
				if (std::chrono::steady_clock::now() > deadline) {
					s.state.store(Live);
					return EIO;
				}
				std::this_thread::yield();
			}
			const int err = servers_[s.server]->free_slab(s.grant.id);
			if (err)
				logger("volume")->warn("memserver {} did not take back slab {}: {}",
						       servers_[s.server]->name(), s.grant.id,
						       std::strerror(err));
			// The content is discarded either way; a slab the server kept is reclaimed
			// when our session ends.
			s.grant = SlabGrant{};
			s.state.store(Empty);
			return 0;
		}
		if (int err = wait_state(s, st))
			return err;
	}
}

int Volume::pread(void *buf, uint32_t count, uint64_t offset)
{
	if (int r = check_range(count, offset))
		return r;
	Channel &ch = channel();
	std::lock_guard lock(ch.mu);
	auto *dst = static_cast<std::byte *>(buf);
	uint64_t done = 0;
	while (done < count) {
		const uint64_t at = offset + done;
		const uint64_t limit = (at / slab_size_ + kMaxPieces) * slab_size_ - at;
		const uint32_t len =
			uint32_t(std::min<uint64_t>({count - done, buffer_size_, limit}));
		Piece pieces[kMaxPieces];
		const unsigned n = split(at, len, pieces);
		uint64_t used = 0; // bit i: posted to server i
		int err = 0;
		unsigned acquired = 0;
		for (; acquired < n; acquired++) {
			Piece &p = pieces[acquired];
			const Access a = acquire_read(p.slab);
			if (a == Access::Error) {
				err = EIO;
				break;
			}
			if (a == Access::Zeros) {
				std::memset(ch.buf + p.pos, 0, p.len);
				continue;
			}
			p.live = true;
			const Slab &s = slabs_[p.slab];
			int r = ch.paths[s.server]->post_read(s.grant, p.off, p.len, ch.buf + p.pos);
			used |= uint64_t(1) << s.server;
			if (r) {
				err = r;
				acquired++;
				break;
			}
		}
		if (int r = finish(ch, used, pieces, acquired); r && !err)
			err = r;
		if (err) {
			logger("volume")->debug("read of {} bytes at {} failed: {}", len, at,
						std::strerror(err));
			return EIO; // whatever the transport said: the client gets EIO, never data
		}
		std::memcpy(dst + done, ch.buf, len);
		done += len;
	}
	return 0;
}

int Volume::finish(Channel &ch, uint64_t used, const Piece *pieces, unsigned n)
{
	int err = 0;
	for (size_t i = 0; i < servers_.size(); i++)
		if (used & (uint64_t(1) << i))
			if (int r = ch.paths[i]->complete(); r && !err)
				err = r;
	for (unsigned i = 0; i < n; i++)
		if (pieces[i].live)
			release(pieces[i].slab);
	return err;
}

int Volume::write_chunk(Channel &ch, const std::byte *src, uint64_t at, uint32_t len)
{
	Piece pieces[kMaxPieces];
	const unsigned n = split(at, len, pieces);
	if (src)
		std::memcpy(ch.buf, src, len);
	else
		std::memset(ch.buf, 0, len);
	uint64_t used = 0; // bit i: posted to server i
	int err = 0;
	unsigned acquired = 0;
	for (; acquired < n; acquired++) {
		Piece &p = pieces[acquired];
		if (int r = acquire_write(p.slab)) {
			err = r;
			break;
		}
		p.live = true;
		const Slab &s = slabs_[p.slab];
		used |= uint64_t(1) << s.server;
		if (int r = ch.paths[s.server]->post_write(s.grant, p.off, p.len, ch.buf + p.pos)) {
			err = r;
			acquired++;
			break;
		}
	}
	if (int r = finish(ch, used, pieces, acquired); r && !err)
		err = r;
	if (err) {
		logger("volume")->debug("write of {} bytes at {} failed: {}", len, at,
					std::strerror(err));
		return err == ENOSPC ? ENOSPC : EIO; // no room on any memserver, else EIO
	}
	return 0;
}

int Volume::pwrite(const void *buf, uint32_t count, uint64_t offset)
{
	if (int r = check_range(count, offset))
		return r;
	Channel &ch = channel();
	std::lock_guard lock(ch.mu);
	const auto *src = static_cast<const std::byte *>(buf);
	uint64_t done = 0;
	while (done < count) {
		const uint64_t at = offset + done;
		const uint64_t limit = (at / slab_size_ + kMaxPieces) * slab_size_ - at;
		const uint32_t len =
			uint32_t(std::min<uint64_t>({count - done, buffer_size_, limit}));
		if (int r = write_chunk(ch, src + done, at, len))
			return r;
		done += len;
	}
	return 0;
}

int Volume::trim(uint32_t count, uint64_t offset)
{
	if (int r = check_range(count, offset))
		return r;
	const uint64_t end = offset + count;
	// Whole slabs only; the volume's last slab counts as whole when the range reaches the end.
	uint64_t first = (offset + slab_size_ - 1) / slab_size_;
	uint64_t last = (end == size_) ? nslabs_ : end / slab_size_;
	int err = 0;
	for (uint64_t i = first; i < last; i++)
		if (int r = give_back(i); r && !err)
			err = r;
	return err;
}

int Volume::zero(uint32_t count, uint64_t offset, bool fast_only)
{
	if (int r = check_range(count, offset))
		return r;
	if (count == 0)
		return 0;
	const uint64_t end = offset + count;
	const uint64_t first = (offset + slab_size_ - 1) / slab_size_;
	const uint64_t last = (end == size_) ? nslabs_ : end / slab_size_;
	// The partial head and tail (if any) need zeros written where their slab holds data.
	struct Range { uint64_t at, len; } partial[2];
	unsigned np = 0;
	if (first >= last) {
		partial[np++] = {offset, count};
	} else {
		if (offset < first * slab_size_)
			partial[np++] = {offset, first * slab_size_ - offset};
		if (last * slab_size_ < end)
			partial[np++] = {last * slab_size_, end - last * slab_size_};
	}
	auto needs_write = [&](const Range &r) {
		for (uint64_t s = r.at / slab_size_; s <= (r.at + r.len - 1) / slab_size_; s++)
			if (slabs_[s].state.load() != Empty)
				return true;
		return false;
	};
	if (fast_only)
		for (unsigned i = 0; i < np; i++)
			if (needs_write(partial[i]))
				return ENOTSUP;
	int err = 0;
	if (first < last)
		if (int r = trim(uint32_t(std::min<uint64_t>(end, last * slab_size_) -
					  first * slab_size_),
				 first * slab_size_))
			err = r;
	Channel &ch = channel();
	std::lock_guard lock(ch.mu);
	for (unsigned i = 0; i < np && !err; i++) {
		if (!needs_write(partial[i]))
			continue;
		// Zeros go only to slabs that hold data: an empty slab already reads as zeros.
		uint64_t done = 0;
		while (done < partial[i].len && !err) {
			const uint64_t at = partial[i].at + done;
			const uint32_t len = uint32_t(std::min<uint64_t>(
				{partial[i].len - done, buffer_size_, slab_size_ - at % slab_size_}));
			if (slabs_[at / slab_size_].state.load() != Empty)
				err = write_chunk(ch, nullptr, at, len);
			done += len;
		}
	}
	return err;
}

} // namespace rdmaswap
