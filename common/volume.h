// SPDX-License-Identifier: MIT
// A volume: `size` bytes cut into slabs that live on memservers, with the block-device
// operations the nbdkit plugin needs. All thread-safe; no allocation and no lock shared by all
// threads on the I/O path (each worker uses its own channel; a slab's first write allocates it
// through the owning server's control connection).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/transport.h"

namespace rdmaswap {

struct VolumeOptions {
	uint64_t size = 0;
	// Data channels (each with its own connection to every server and its own registered
	// buffer). Worker threads map onto them; more threads than channels share with a
	// per-channel lock.
	unsigned channels = 16;
	// Registered bounce buffer per channel; requests larger than this are split.
	size_t buffer_size = 256 * 1024;
	// Bound on waiting for another thread's allocation or release of a slab.
	std::chrono::milliseconds timeout{10000};
};

struct VolumeStats {
	uint64_t slabs = 0;        // slabs the volume is cut into
	uint64_t slabs_live = 0;   // slabs currently granted by a memserver
};

class Volume {
public:
	static constexpr size_t kMaxServers = 64;

	// Takes ownership of connected servers (at least one; all must report the same slab size)
	// and opens every channel's data paths. Throws std::runtime_error with a clear message.
	Volume(std::vector<std::unique_ptr<Server>> servers, const VolumeOptions &opts);
	~Volume();
	Volume(const Volume &) = delete;
	Volume &operator=(const Volume &) = delete;

	uint64_t size() const { return size_; }
	uint64_t slab_size() const { return slab_size_; }

	// Each returns 0 or an errno for the client. Ranges must lie inside the volume (EINVAL).
	// pread: never-written (or trimmed) ranges read as zeros without a network round trip; a
	// range on a server that lost our session, or any failed transfer, is EIO, never zeros.
	int pread(void *buf, uint32_t count, uint64_t offset);
	// pwrite: allocates slabs on first write; complete when every byte is on the memserver.
	int pwrite(const void *buf, uint32_t count, uint64_t offset);
	// trim: whole slabs inside the range are given back to their memservers and read as zeros
	// afterwards; partial slabs are left as they are (trim is advisory).
	int trim(uint32_t count, uint64_t offset);
	// zero: whole slabs are given back; partial ranges of written slabs get zeros written. With
	// `fast_only`, returns ENOTSUP (changing nothing) if zeros would have to be written.
	int zero(uint32_t count, uint64_t offset, bool fast_only);

	VolumeStats stats() const;

private:
	enum State : uint8_t { Empty, Allocating, Live, Freeing };
	struct Slab {
		std::atomic<uint8_t> state{Empty};
		std::atomic<uint32_t> inflight{0};
		uint16_t server = 0; // written before state becomes Live, read after
		SlabGrant grant;
	};
	struct Channel {
		std::mutex mu;
		std::byte *buf = nullptr;
		std::vector<std::unique_ptr<DataPath>> paths; // one per server
	};
	struct Piece {
		uint64_t slab;
		uint64_t off;   // within the slab
		uint32_t len;
		uint32_t pos;   // within the chunk / channel buffer
		bool live;
	};
	enum class Access { Zeros, Live, Error };

	Channel &channel();
	int check_range(uint64_t count, uint64_t offset) const;
	// Split [offset, offset+len) (len <= buffer_size) into per-slab pieces. Returns count.
	unsigned split(uint64_t offset, uint32_t len, Piece *out) const;
	Access acquire_read(uint64_t slab);
	int acquire_write(uint64_t slab);
	void release(uint64_t slab) { slabs_[slab].inflight.fetch_sub(1); }
	int allocate(Slab &s);
	int give_back(uint64_t slab);
	// Write `src` (or zeros if null) to [offset, offset+len), len <= buffer_size.
	int write_chunk(Channel &ch, const std::byte *src, uint64_t offset, uint32_t len);
	int wait_state(Slab &s, uint8_t from);
	// Complete the batch on every server in `used`, then release the live pieces' slabs.
	int finish(Channel &ch, uint64_t used, const Piece *pieces, unsigned n);

	std::vector<std::unique_ptr<Server>> servers_;
	const uint64_t size_;
	uint64_t slab_size_ = 0;
	const size_t buffer_size_;
	const std::chrono::milliseconds timeout_;
	std::unique_ptr<Slab[]> slabs_;
	uint64_t nslabs_ = 0;
	std::byte *region_ = nullptr;
	size_t region_len_ = 0;
	std::vector<std::unique_ptr<Channel>> channels_;
	std::atomic<unsigned> next_server_{0};
};

} // namespace rdmaswap
