// SPDX-License-Identifier: MIT
// Cluster authentication: a shared key file, and the mutual HMAC-SHA256 challenge-response that
// opens every TCP connection (AUTH + AUTH_PROOF, before HELLO), with the per-session key that
// binds RDMA QP attaches to an authenticated session. Crypto is OpenSSL's libcrypto.
//
// The exchange (K = the cluster key, nc/ns = 32 fresh random bytes from client/server):
//   client -> AUTH       {nc, key_id(K)}
//   server -> reply      {ns, HMAC(K, "rdmaswap-auth-server-v1" | nc | ns)}   client checks it
//   client -> AUTH_PROOF {HMAC(K, "rdmaswap-auth-client-v1" | nc | ns)}        server checks it
// Distinct labels stop a reflected MAC from serving as the other side's proof. The session a
// connection creates gets attach key A = HMAC(K, "rdmaswap-attach-v1" | nc | ns); an RDMA
// connect must carry HMAC(A, "rdmaswap-rdma-attach-v1" | session | token | cm_nonce).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace rdmaswap {

class DonorVerifier; // common/wire/donor_cert.h

inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;
// Shortest key file accepted (after trailing whitespace is stripped).
inline constexpr size_t kMinKeySize = 16;
inline constexpr size_t kMaxKeySize = 4096;

using Nonce = std::array<std::byte, kNonceSize>;
using Mac = std::array<std::byte, kMacSize>;

// A cluster key. The bytes are wiped when it is destroyed. Not copyable (share it by pointer).
class AuthKey {
public:
	explicit AuthKey(std::span<const std::byte> bytes);
	~AuthKey();
	AuthKey(const AuthKey &) = delete;
	AuthKey &operator=(const AuthKey &) = delete;

	// HMAC-SHA256 under this key of label | parts... (the label without its NUL).
	Mac mac(const char *label, std::initializer_list<std::span<const std::byte>> parts) const;
	// Public name of the key: the first 8 bytes of HMAC(K, "rdmaswap-key-id-v1"). Lets a
	// server holding two keys (during a rotation) pick the one the client uses.
	uint64_t id() const { return id_; }

	// The client's donor check (donor-ca=, docs/security.md "Roles"): a copy of this key
	// that, when a client connects with it (connect_memserver), also requires the server to
	// prove a donor certificate `donors` accepts. The key travels to every place that
	// connects to a memserver (control, data, probe connections), so the check does too.
	std::shared_ptr<const AuthKey> with_donor_check(std::shared_ptr<DonorVerifier> donors) const;
	// The verifier of with_donor_check, or null: any server holding the key is accepted.
	DonorVerifier *donor_check() const { return donors_.get(); }

private:
	std::vector<std::byte> key_;
	uint64_t id_ = 0;
	std::shared_ptr<DonorVerifier> donors_;
};

// Read a key file: a regular file (opened with O_NOFOLLOW and O_NONBLOCK: a symbolic link is
// refused, a FIFO or device is refused without blocking or being read), owned by the process's
// effective user (another user could have written it), with no group or other permission bits
// (mode 0600 or stricter: a readable key is a leaked key), of kMinKeySize..kMaxKeySize bytes
// after stripping trailing whitespace. Throws std::runtime_error with a message that names the
// file (as "<kind> file PATH"), its owner and mode when they are wrong, and how to fix it.
std::shared_ptr<const AuthKey> load_auth_key(const std::string &path,
					     const char *kind = "auth key");

// `out.size()` random bytes from OpenSSL's CSPRNG. Throws std::runtime_error if it fails.
void random_bytes(std::span<std::byte> out);
// Constant-time equality (CRYPTO_memcmp) of two byte strings of the same length.
bool mac_equal(std::span<const std::byte> a, std::span<const std::byte> b);

// The server's side of one connection's handshake (control path only).
class AuthServer {
public:
	// `keys`: one key, or two during a rotation. Borrowed; must outlive this object.
	explicit AuthServer(std::span<const std::shared_ptr<const AuthKey>> keys) : keys_(keys) {}
	// Answer an AUTH: false if the client's key is not one of ours (or AUTH came twice).
	bool challenge(const Nonce &client_nonce, uint64_t key_id, Nonce &server_nonce,
		       Mac &server_mac);
	// Check the client's AUTH_PROOF; true once the peer proved it holds the key.
	bool verify(const Mac &client_mac);
	bool authenticated() const { return done_; }
	// Valid once authenticated(): the attach key of a session this connection creates.
	const Mac &attach_key() const { return attach_; }
	// Valid once authenticated(): the id of the key the peer proved it holds.
	uint64_t key_id() const { return key_ ? key_->id() : 0; }
	// Valid once authenticated(): the nonces of this exchange (a DONOR_PROOF signs them).
	const Nonce &client_nonce() const { return nc_; }
	const Nonce &server_nonce() const { return ns_; }

private:
	std::span<const std::shared_ptr<const AuthKey>> keys_;
	const AuthKey *key_ = nullptr; // the key the client named, once challenged
	Nonce nc_{}, ns_{};
	Mac attach_{};
	bool done_ = false;
};

// The client's side: make the AUTH request, check the server's answer, make the proof.
class AuthClient {
public:
	explicit AuthClient(const AuthKey &key);
	const Nonce &client_nonce() const { return nc_; }
	uint64_t key_id() const { return key_.id(); }
	// True if the server proved it holds the key; then `proof` is our AUTH_PROOF and
	// attach_key() the key for RDMA attaches to the session this connection creates.
	bool check(const Nonce &server_nonce, const Mac &server_mac, Mac &proof);
	const Mac &attach_key() const { return attach_; }
	// Valid once check() succeeded: the server's nonce (a DONOR_PROOF signs it).
	const Nonce &server_nonce() const { return ns_; }

private:
	const AuthKey &key_;
	Nonce nc_{}, ns_{};
	Mac attach_{};
};

// The MAC an RDMA connect carries (truncated to kAttachMacSize bytes).
inline constexpr size_t kAttachMacSize = 16;
std::array<std::byte, kAttachMacSize> attach_mac(const Mac &attach_key, uint64_t session_id,
						 uint64_t token, uint64_t cm_nonce);

} // namespace rdmaswap
