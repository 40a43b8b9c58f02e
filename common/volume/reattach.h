// SPDX-License-Identifier: MIT
// The pure logic of reattaching a volume after a plugin restart: its default id, and which of
// the slabs the memservers kept a restarted volume may trust (docs/replication.md, "Restart").
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/config.h"

namespace rdmaswap {

// The default volume id: "<host>-<size>-<hash>", where <host> is the host name (at most 32
// characters, anything but 0x21-0x7e replaced by '_'), <size> the device size in bytes and
// <hash> 8 hex digits of FNV-1a over the sorted, comma-joined "host:port" of the servers.
// With an `etcd_prefix` (the plugin's etcd=), the servers are the server= entries only (not
// the donors etcd lists, which come and go) and one more item "etcd:<prefix>" is sorted in
// with them, so the id stays the same whatever etcd lists; without it the id is what it always
// was (volumes made before etcd= existed reattach after an upgrade).
// Two devices of one host differ in size or in server list; give them volume= otherwise.
std::string default_volume_name(const std::string &host, uint64_t size,
				std::span<const Endpoint> servers,
				std::optional<std::string_view> etcd_prefix = std::nullopt);

// A tagged slab a memserver kept for the volume.
struct FoundSlab {
	uint16_t server = 0;
	uint32_t slab_id = 0;
	uint32_t rkey = 0;
	uint64_t addr = 0;
	uint64_t chunk = 0;
	uint64_t epoch = 0;
};
// A chunk's epoch floor recorded on a memserver: some replica of `chunk` reached `epoch`.
struct FoundFloor {
	uint64_t chunk = 0;
	uint64_t epoch = 0;
};

struct ReattachInput {
	uint64_t nchunks = 0;        // chunks (slabs) the volume is cut into now
	unsigned replicas = 1;       // replicas= of the volume
	unsigned max_replicas = 3;   // at most this many replicas per chunk are kept
	// Servers of the volume that did not hand back a detached session (unreachable, restarted,
	// lease expired, or never bound). With at least `replicas` of them, a chunk with no
	// replica found may have had all its replicas there: it is lost, not empty. The caller
	// passes 0 when no server handed anything back (a fresh start: the volume starts empty).
	unsigned missing = 0;
	std::span<const FoundSlab> slabs;
	std::span<const FoundFloor> floors;
};

struct ReattachPlan {
	struct Chunk {
		uint64_t chunk = 0;
		uint64_t epoch = 0;          // the epoch of the replicas used (0 when lost)
		std::vector<size_t> use;     // indices into input.slabs, distinct servers
	};
	std::vector<Chunk> chunks;           // chunks with replicas to use, by chunk
	std::vector<uint64_t> lost;          // chunks that must read EIO (sorted)
	bool all_empty_lost = false;         // every chunk without replicas is lost
	std::vector<size_t> discard;         // slabs to give back (stale, incomplete, extra)
	uint64_t stale = 0;                  // replicas older than their chunk's epoch
	uint64_t incomplete = 0;             // epoch 0: a repair copy never finished
	uint64_t out_of_range = 0;           // chunk beyond the volume's size
};

// Decide. Rules (each protects against reading bytes that may be stale):
// - epoch 0 is never trusted (a replica being copied by the repair thread);
// - per chunk only the replicas with the highest epoch are used, one per server;
// - a chunk whose highest replica epoch is below its floor is lost (its newest replica is
//   gone and what is left missed writes), as is a chunk with a floor and no replica;
// - with input.missing >= input.replicas, every chunk without a replica is lost (all_empty_lost).
ReattachPlan plan_reattach(const ReattachInput &in);

} // namespace rdmaswap
