// SPDX-License-Identifier: MIT
// The rdmaswap wire protocol: a fixed 32-byte header plus a fixed body per op, all little-endian.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace rdmaswap::proto {

inline constexpr uint32_t kMagic = 0x57534452; // "RDSW" on the wire
// 2: HELLO replies carry a challenge and BIND requests a volume key's proof (volume_key.h);
// a peer of another version is refused at its first message ("unsupported protocol version").
inline constexpr uint8_t kVersion = 2;
inline constexpr size_t kHeaderSize = 32;
// Largest READ/WRITE payload in one message. The plugin splits larger requests.
inline constexpr uint32_t kMaxIo = 1u << 20;

enum class Op : uint8_t {
	Hello = 1,
	Alloc = 2,
	Free = 3,
	Read = 4,
	Write = 5,
	Stats = 6,
	List = 7, // the slabs this session holds (reply: u32 count, then count u32 slab ids)
	// Reattach (docs/interfaces.md "Volumes and reattach"): bind the session to a volume id,
	// allocate a slab with its tag, change a tag (or a chunk's epoch floor), list tags.
	Bind = 8,
	AllocTagged = 9,
	SetTag = 10,
	VolumeList = 11,
	// Donor memory give-back (ops 12-15; 8-11 belong to reattach).
	GiveBack = 12,       // admin: withdraw `bytes` of capacity (GiveBackRequest/Reply)
	Wanted = 13,         // this session's slabs wanted back (reply as LIST)
	GiveBackStatus = 14, // withdrawn and pending counts (reply GiveBackReply)
	Lend = 15,           // admin: re-offer `bytes` of withdrawn capacity (GiveBackRequest/Reply)
	// Authentication (common/wire/auth.h), before anything else on a connection. Numbered apart
	// from the session ops.
	Auth = 16,
	AuthProof = 17,
	// Donor certificates (common/wire/donor_cert.h): after AUTH_PROOF and before HELLO, a plugin
	// with donor-ca= asks the memserver to prove it is a certified donor. Optional: a plugin
	// without donor-ca= never sends it.
	DonorProof = 18,
};

inline constexpr uint16_t kFlagResponse = 1;

// Every message starts with this header. `body_len` counts all bytes after the header (fixed
// body plus payload). `status` is 0 or a positive errno in responses, 0 in requests.
struct Header {
	Op op{};
	uint16_t flags = 0;
	uint32_t status = 0, body_len = 0;
	uint64_t request_id = 0;

	bool is_response() const { return flags & kFlagResponse; }
};

// Result of decoding: ok, or why not. Decoders never read outside the span they are given.
struct Status {
	bool ok = true;
	const char *error = nullptr; // static string when !ok
	static Status fail(const char *why) { return {false, why}; }
};

// Fixed bodies. A message's fields are declared once, as the struct's members: the wire layout
// is their order (each an unsigned integer or enum, little-endian on the wire, or an array of
// bytes or chars, copied as is). `kWire` says how many members there are (the compiler checks
// it: a structured binding of another count does not compile) and decode's error for a body of
// another size; encode(), decode() and the k*Size constants (wire_size) are derived from the
// members. What a decoder checks beyond the size is the message's check() (protocol.cpp), if it
// has one.
struct WireInfo {
	int fields;             // the struct's members, all of them on the wire
	const char *wrong_size; // decode's error for a body of another size
};
struct HelloRequest {                 // 32 bytes
	uint32_t client_version = kVersion;
	uint32_t want_rdma = 0;       // 1: the client will attach RDMA data QPs to this session
	uint64_t session_id = 0;      // 0: create a new session; else join it (token must match)
	uint64_t token = 0;
	// Non-zero: the id of this session's connection that this one replaces (a reconnect).
	// The server fences it (it applies no further request from it) before answering, so
	// that nothing the old connection still had buffered can land after what follows.
	uint64_t replaces = 0;
	static constexpr WireInfo kWire{5, "HELLO body has the wrong size"};
	Status check() const;
};
struct HelloReply {                   // 80 bytes
	uint64_t session_id = 0, token = 0, slab_size = 0;
	uint32_t slabs_total = 0, slabs_free = 0, max_io = 0;
	uint32_t server_flags = 0;    // bit 0: RDMA data path available
	uint64_t conn_id = 0;         // this connection's id (for a later `replaces`)
	// Fresh random bytes for this connection (never all zero): a BIND on it signs them.
	std::array<std::byte, 32> challenge{};
	static constexpr WireInfo kWire{9, "HELLO reply has the wrong size"};
	Status check() const;
};
inline constexpr uint32_t kServerRdma = 1;

struct AllocReply {                   // 32 bytes
	uint32_t slab_id = 0;
	uint32_t rkey = 0;            // RDMA: rkey of the slab's MR in this session's PD; TCP: 0
	uint64_t addr = 0;            // RDMA: remote virtual address of the slab; TCP: 0
	uint64_t length = 0;
	uint32_t slabs_free = 0;      // free slabs left on the server after this grant
	uint32_t reserved = 0;
	static constexpr WireInfo kWire{6, "ALLOC reply has the wrong size"};
	Status check() const;
};
struct FreeRequest {                  // 8 bytes
	uint32_t slab_id = 0, reserved = 0;
	static constexpr WireInfo kWire{2, "FREE body has the wrong size"};
	Status check() const;
};
struct IoRequest {                    // 16 bytes; READ: reply payload is `length` bytes;
	uint32_t slab_id = 0;         // WRITE: `length` payload bytes follow the body
	uint32_t length = 0;
	uint64_t offset = 0;
	static constexpr WireInfo kWire{3, "I/O body has the wrong size"};
	Status check() const;
};
struct StatsReply {                   // 80 bytes
	uint64_t capacity = 0, slab_size = 0;
	uint32_t slabs_total = 0, slabs_free = 0, sessions = 0, rdma_qps = 0;
	uint64_t tcp_read_ops = 0, tcp_read_bytes = 0, tcp_write_ops = 0, tcp_write_bytes = 0;
	uint32_t rdma_sessions = 0, connections = 0;
	uint64_t reserved = 0;
	static constexpr WireInfo kWire{13, "STATS reply has the wrong size"};
	Status check() const;
};

// BIND: after HELLO, bind this session to volume `name` of the volume key `pubkey` (the
// server's volume id is "<cluster key id>/<name>/<hex of pubkey>": another cluster key or
// another volume key never matches it). `proof` is the Ed25519 signature under `pubkey` of
// bind_proof_message(challenge of this connection's HELLO reply, session id, name, lease_s,
// pubkey) (common/wire/volume_key.h). If a detached session of the same volume exists, this session
// takes over its slabs, tags and floors. EPERM: the proof is wrong (nothing is bound). EBUSY: a
// session with live connections holds the volume. EINVAL: the session is already bound to
// another volume.
inline constexpr size_t kMaxVolumeName = 64;
struct BindRequest {                  // 168 bytes
	std::array<char, kMaxVolumeName> name{}; // 1..64 graphic ASCII characters, NUL-padded
	uint32_t lease_s = 0;         // kept detached this long after the last connection; 0: freed
	uint32_t reserved = 0;
	std::array<std::byte, 32> pubkey{}; // the volume's Ed25519 public key
	std::array<std::byte, 64> proof{};  // Ed25519 signature (see above)
	static constexpr WireInfo kWire{5, "BIND body has the wrong size"};
	Status check() const;
};
struct BindReply {                    // 16 bytes
	uint32_t reattached = 0;      // 1: took over a detached session of this volume
	uint32_t slabs = 0;           // slabs taken over
	uint64_t detached_ms = 0;     // how long that session had been detached
	static constexpr WireInfo kWire{3, "BIND reply has the wrong size"};
	Status check() const;
};
// ALLOC_TAGGED: ALLOC, with the slab's tag set in the same exchange (reply: AllocReply).
struct AllocTaggedRequest {           // 16 bytes
	uint64_t chunk = 0;           // which chunk of the volume the slab holds
	uint64_t epoch = 0;           // replica freshness (0: incomplete, never trusted)
	static constexpr WireInfo kWire{2, "ALLOC_TAGGED body has the wrong size"};
};
// SET_TAG: set the tag of a slab this session holds; with slab_id == kNoSlab, set the epoch
// floor of `chunk` in the session's volume instead (epoch 0 removes it). Reply: no body.
inline constexpr uint32_t kNoSlab = 0xffffffffu;
struct SetTagRequest {                // 24 bytes
	uint32_t slab_id = 0, reserved = 0;
	uint64_t chunk = 0, epoch = 0;
	static constexpr WireInfo kWire{4, "SET_TAG body has the wrong size"};
	Status check() const;
};
// VOLUME_LIST: what=0: this session's tagged slabs with id >= start (RDMA sessions: each is
// registered in the session's PD, addr/rkey valid for its QPs); what=1: this session's floors
// with chunk >= start; what=2 (needs no session): the server's sessions from index `start` (on
// an admin connection every session; on any other, those created from the caller's address).
// Reply: u32 count, then count entries (VolumeEntry or SessionEntry), at most kMaxIo bytes;
// a reply with fewer than the maximum entries is the last page.
enum class ListWhat : uint32_t { Slabs = 0, Floors = 1, Sessions = 2 };
struct VolumeListRequest {            // 16 bytes
	ListWhat what = ListWhat::Slabs;
	uint32_t reserved = 0;
	uint64_t start = 0;
	static constexpr WireInfo kWire{3, "VOLUME_LIST body has the wrong size"};
	Status check() const;
};
struct VolumeEntry {                  // 32 bytes
	uint32_t slab_id = 0;         // kNoSlab in a floor entry
	uint32_t rkey = 0;
	uint64_t addr = 0, chunk = 0, epoch = 0;
	static constexpr WireInfo kWire{5, "VOLUME_LIST entry has the wrong size"};
};
inline constexpr uint32_t kSessionDetached = 1, kSessionRdma = 2, kSessionBound = 4;
struct SessionEntry {                 // 160 bytes
	uint64_t session = 0;
	uint32_t slabs = 0;
	uint32_t flags = 0;           // kSession*
	uint64_t lease_left_ms = 0;   // detached sessions: time until their slabs are freed
	uint32_t lease_s = 0, connections = 0;
	std::array<char, 64> volume{}; // NUL-padded ("" when not bound)
	std::array<char, 64> peer{};   // the address of the client that created or bound it
	static constexpr WireInfo kWire{8, "VOLUME_LIST session entry has the wrong size"};
	Status check() const;
};
// True if `name` is a valid volume id: 1..kMaxVolumeName graphic ASCII characters (0x21-0x7e).
bool valid_volume_name(std::string_view name);
// VOLUME_LIST reply bodies: encode count + entries into `out` (4 + n * entry size bytes);
// decode into `out` (capacity out.size()), returning the count or -1 if malformed.
void encode_entries(std::span<const VolumeEntry> in, std::span<std::byte> out);
void encode_entries(std::span<const SessionEntry> in, std::span<std::byte> out);
long decode_entries(std::span<const std::byte> in, std::span<VolumeEntry> out);
long decode_entries(std::span<const std::byte> in, std::span<SessionEntry> out);
// GIVEBACK: withdraw `bytes` (rounded up to whole slabs) of the memserver's capacity: free
// slabs at once, granted ones once their owners have moved them (see Op::Wanted).
struct GiveBackRequest {              // 8 bytes
	uint64_t bytes = 0;
	static constexpr WireInfo kWire{1, "GIVEBACK body has the wrong size"};
	Status check() const;
};
// LEND: the reverse, for an admin: cancel pending moves, then put withdrawn slabs back in the
// pool, up to `bytes` (rounded up to whole slabs) in all. Its reply is a GiveBackReply whose
// `withdrawn_now` counts the slabs re-offered now and `wanted_now` the pending moves
// cancelled.
struct GiveBackReply {                // 24 bytes (also the GIVEBACK_STATUS and LEND reply)
	uint32_t withdrawn_now = 0;   // free slabs withdrawn by this request (status: 0)
	uint32_t wanted_now = 0;      // granted slabs this request asked their owners to move
	uint32_t slabs_withdrawn = 0; // total withdrawn (capacity given back)
	uint32_t slabs_wanted = 0;    // total pending moves
	uint32_t slabs_total = 0, reserved = 0;
	static constexpr WireInfo kWire{6, "GIVEBACK reply has the wrong size"};
	Status check() const;
};

struct AuthRequest {                  // 48 bytes
	std::array<std::byte, 32> client_nonce{};
	uint64_t key_id = 0;          // AuthKey::id() of the key the client holds
	uint64_t reserved = 0;
	static constexpr WireInfo kWire{3, "AUTH body has the wrong size"};
	Status check() const;
};
struct AuthReply {                    // 64 bytes
	std::array<std::byte, 32> server_nonce{};
	std::array<std::byte, 32> server_mac{};
	static constexpr WireInfo kWire{2, "AUTH reply has the wrong size"};
};
struct AuthProofRequest {             // 32 bytes; the reply has no body
	std::array<std::byte, 32> client_mac{};
	static constexpr WireInfo kWire{1, "AUTH_PROOF body has the wrong size"};
};

// DONOR_PROOF (needs authentication): the reply is the memserver's donor certificate
// (donor_cert.h's encoding) followed by the 64-byte Ed25519 signature under the certified key
// of donor_proof_message(client nonce, server nonce of this connection's AUTH, `dialled`).
// ENOENT: the memserver has no certificate (run without --donor-cert).
struct DonorProofRequest {            // 64 bytes
	std::array<char, 64> dialled{}; // the address the client connected to (SockAddr::str())
	static constexpr WireInfo kWire{1, "DONOR_PROOF body has the wrong size"};
};
inline constexpr size_t kDonorProofSigSize = 64;
inline constexpr size_t kMaxDonorProofReply = 2048; // certificate + signature
// The address text of a DonorProofRequest (up to its first NUL).
std::string_view dialled_text(const DonorProofRequest &m);

// LIST reply: a u32 count followed by that many u32 slab ids, at most kMaxIo bytes in all.
inline constexpr uint32_t kMaxListIds = (kMaxIo - 4) / 4;
// Decode a LIST reply body into `ids` (capacity ids.size()); returns the count or -1 if the
// body is malformed (size not 4 + 4*count, or more ids than fit).
long decode_list(std::span<const std::byte> in, std::span<uint32_t> ids);
// Encode count + ids into `out` (which must hold 4 + 4*ids.size() bytes).
void encode_list(std::span<const uint32_t> ids, std::span<std::byte> out);


// Header: encode into exactly kHeaderSize bytes.
void encode_header(const Header &h, std::span<std::byte, kHeaderSize> out);
// Decode and validate magic, version, op, flags, reserved bits, and that body_len fits the op:
// requests must carry exactly their fixed body (WRITE: body + length payload, length <= kMaxIo);
// responses with status != 0 carry no body; a READ response's payload is checked by the caller
// against the length it asked for (see expected_reply_body).
Status decode_header(std::span<const std::byte, kHeaderSize> in, Header &out);

// The exact body length a request of `op` has (WRITE: without payload). -1 for unknown op.
long request_body_size(Op op);
// The exact body length a successful response to `op` has (READ: without payload).
long reply_body_size(Op op);

// ---- The codec, from each message's members ----
namespace detail {
template <class T>
concept WireInt = std::is_integral_v<T> || std::is_enum_v<T>;
template <class T>
concept WireBytes = requires { std::tuple_size<T>::value; } && sizeof(typename T::value_type) == 1;

template <WireInt T> constexpr size_t field_size(const T &) { return sizeof(T); }
template <WireBytes T> constexpr size_t field_size(const T &) { return std::tuple_size<T>::value; }

template <WireInt T> void put_field(std::byte *&p, const T &v)
{
	static_assert(!std::is_signed_v<T>, "wire integers are unsigned");
	const auto u = uint64_t(v);
	for (size_t i = 0; i < sizeof(T); i++)
		*p++ = std::byte((u >> (8 * i)) & 0xff);
}
template <WireBytes T> void put_field(std::byte *&p, const T &v)
{
	std::memcpy(p, v.data(), v.size());
	p += v.size();
}
template <WireInt T> void get_field(const std::byte *&p, T &v)
{
	uint64_t u = 0;
	for (size_t i = 0; i < sizeof(T); i++)
		u |= uint64_t(*p++) << (8 * i);
	v = T(u);
}
template <WireBytes T> void get_field(const std::byte *&p, T &v)
{
	std::memcpy(v.data(), p, v.size());
	p += v.size();
}
} // namespace detail

// A fixed body: its members (M::kWire.fields of them, in wire order) and its WireInfo.
template <class M>
concept WireMessage = std::is_aggregate_v<M> && requires {
	{ M::kWire } -> std::convertible_to<WireInfo>;
};

namespace detail {
// Call `visit` with each member of `m` in order (a structured binding of M::kWire.fields names).
template <class M, class V> constexpr void for_each_field(M &m, V &&visit)
{
	constexpr int n = std::remove_const_t<M>::kWire.fields;
	static_assert(n >= 1 && n <= 13, "for_each_field: add a case");
	if constexpr (n == 1) {
		auto &[x0] = m;
		visit(x0);
	} else if constexpr (n == 2) {
		auto &[x0, x1] = m;
		visit(x0); visit(x1);
	} else if constexpr (n == 3) {
		auto &[x0, x1, x2] = m;
		visit(x0); visit(x1); visit(x2);
	} else if constexpr (n == 4) {
		auto &[x0, x1, x2, x3] = m;
		visit(x0); visit(x1); visit(x2); visit(x3);
	} else if constexpr (n == 5) {
		auto &[x0, x1, x2, x3, x4] = m;
		visit(x0); visit(x1); visit(x2); visit(x3); visit(x4);
	} else if constexpr (n == 6) {
		auto &[x0, x1, x2, x3, x4, x5] = m;
		visit(x0); visit(x1); visit(x2); visit(x3); visit(x4); visit(x5);
	} else if constexpr (n == 7) {
		auto &[x0, x1, x2, x3, x4, x5, x6] = m;
		visit(x0); visit(x1); visit(x2); visit(x3); visit(x4); visit(x5); visit(x6);
	} else if constexpr (n == 8) {
		auto &[x0, x1, x2, x3, x4, x5, x6, x7] = m;
		visit(x0); visit(x1); visit(x2); visit(x3);
		visit(x4); visit(x5); visit(x6); visit(x7);
	} else if constexpr (n == 9) {
		auto &[x0, x1, x2, x3, x4, x5, x6, x7, x8] = m;
		visit(x0); visit(x1); visit(x2); visit(x3); visit(x4);
		visit(x5); visit(x6); visit(x7); visit(x8);
	} else if constexpr (n == 10) {
		auto &[x0, x1, x2, x3, x4, x5, x6, x7, x8, x9] = m;
		visit(x0); visit(x1); visit(x2); visit(x3); visit(x4);
		visit(x5); visit(x6); visit(x7); visit(x8); visit(x9);
	} else if constexpr (n == 11) {
		auto &[x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10] = m;
		visit(x0); visit(x1); visit(x2); visit(x3); visit(x4); visit(x5);
		visit(x6); visit(x7); visit(x8); visit(x9); visit(x10);
	} else if constexpr (n == 12) {
		auto &[x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11] = m;
		visit(x0); visit(x1); visit(x2); visit(x3); visit(x4); visit(x5);
		visit(x6); visit(x7); visit(x8); visit(x9); visit(x10); visit(x11);
	} else if constexpr (n == 13) {
		auto &[x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12] = m;
		visit(x0); visit(x1); visit(x2); visit(x3); visit(x4); visit(x5); visit(x6);
		visit(x7); visit(x8); visit(x9); visit(x10); visit(x11); visit(x12);
	}
}
} // namespace detail

// Bytes of `M` on the wire: the sum of its fields'.
template <WireMessage M> constexpr size_t wire_size()
{
	size_t n = 0;
	M m{};
	detail::for_each_field(m, [&n](const auto &f) { n += detail::field_size(f); });
	return n;
}

// Encode `m` into the first wire_size<M>() bytes of `out` (which must hold them).
template <WireMessage M> void encode(const M &m, std::span<std::byte> out)
{
	std::byte *p = out.first(wire_size<M>()).data();
	detail::for_each_field(m, [&p](const auto &f) { detail::put_field(p, f); });
}

// Decode a body that must be exactly wire_size<M>() bytes, then check every field's range
// (M::check, where it has one). `m` is left as it was unless the result is ok.
template <WireMessage M> Status decode(std::span<const std::byte> in, M &m)
{
	if (in.size() != wire_size<M>())
		return Status::fail(M::kWire.wrong_size);
	const std::byte *p = in.data();
	M r;
	detail::for_each_field(r, [&p](auto &f) { detail::get_field(p, f); });
	if constexpr (requires { r.check(); })
		if (const Status s = r.check(); !s.ok)
			return s;
	m = r;
	return {};
}

// The body sizes, derived from the members; the asserts pin the wire format.
inline constexpr size_t kAuthRequestSize = wire_size<AuthRequest>();
inline constexpr size_t kAuthReplySize = wire_size<AuthReply>();
inline constexpr size_t kAuthProofRequestSize = wire_size<AuthProofRequest>();
inline constexpr size_t kHelloRequestSize = wire_size<HelloRequest>();
inline constexpr size_t kHelloReplySize = wire_size<HelloReply>();
inline constexpr size_t kAllocReplySize = wire_size<AllocReply>();
inline constexpr size_t kFreeRequestSize = wire_size<FreeRequest>();
inline constexpr size_t kIoRequestSize = wire_size<IoRequest>();
inline constexpr size_t kStatsReplySize = wire_size<StatsReply>();
inline constexpr size_t kGiveBackRequestSize = wire_size<GiveBackRequest>();
inline constexpr size_t kGiveBackReplySize = wire_size<GiveBackReply>();
inline constexpr size_t kBindRequestSize = wire_size<BindRequest>();
inline constexpr size_t kBindReplySize = wire_size<BindReply>();
inline constexpr size_t kAllocTaggedRequestSize = wire_size<AllocTaggedRequest>();
inline constexpr size_t kSetTagRequestSize = wire_size<SetTagRequest>();
inline constexpr size_t kVolumeListRequestSize = wire_size<VolumeListRequest>();
inline constexpr size_t kVolumeEntrySize = wire_size<VolumeEntry>();
inline constexpr size_t kSessionEntrySize = wire_size<SessionEntry>();
inline constexpr size_t kDonorProofRequestSize = wire_size<DonorProofRequest>();

static_assert(kAuthRequestSize == 48);
static_assert(kAuthReplySize == 64);
static_assert(kAuthProofRequestSize == 32);
static_assert(kHelloRequestSize == 32);
static_assert(kHelloReplySize == 80);
static_assert(kAllocReplySize == 32);
static_assert(kFreeRequestSize == 8);
static_assert(kIoRequestSize == 16);
static_assert(kStatsReplySize == 80);
static_assert(kGiveBackRequestSize == 8);
static_assert(kGiveBackReplySize == 24);
static_assert(kBindRequestSize == 168);
static_assert(kBindReplySize == 16);
static_assert(kAllocTaggedRequestSize == 16);
static_assert(kSetTagRequestSize == 24);
static_assert(kVolumeListRequestSize == 16);
static_assert(kVolumeEntrySize == 32);
static_assert(kSessionEntrySize == 160);
static_assert(kDonorProofRequestSize == 64);
inline constexpr uint32_t kMaxVolumeEntries = (kMaxIo - 4) / kVolumeEntrySize;
inline constexpr uint32_t kMaxSessionEntries = (kMaxIo - 4) / kSessionEntrySize;
// The largest fixed body of any message: a receive buffer of this size holds any body.
inline constexpr size_t kMaxFixedBody = kBindRequestSize;
static_assert(kMaxFixedBody >= std::max({kAuthRequestSize, kAuthProofRequestSize,
					  kDonorProofRequestSize, kHelloRequestSize, kFreeRequestSize,
					  kIoRequestSize, kGiveBackRequestSize, kAllocTaggedRequestSize,
					  kSetTagRequestSize, kVolumeListRequestSize}));

const char *op_name(Op op);

} // namespace rdmaswap::proto
