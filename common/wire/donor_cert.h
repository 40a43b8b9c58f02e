// SPDX-License-Identifier: MIT
// Donor certificates (docs/security.md, "Roles"): the operator's CA key signs, for each donor,
// its Ed25519 public key, a name, the addresses it may be dialled at and a validity period; a
// CA-signed revocation list withdraws certificates by serial. A memserver proves it holds the
// certified key in every handshake (DONOR_PROOF, protocol.h); a plugin with donor-ca= accepts
// only donors whose certificate and proof pass DonorVerifier::check.
//
// Keys reuse volume_key.h's Ed25519 (OpenSSL 3): a key file holds a secret (the rules of
// load_auth_key: regular, 0600, owned by the user); the Ed25519 key is derived from it under a
// fixed name. A public key file is one line "rdmaswap-ed25519-v1 <64 hex digits>".
//
// Certificate encoding (all integers little-endian; every length checked, nothing trailing):
//   "RSDC" | version u8 (1) | reserved u8 (0) | serial u64 | not_before i64 | not_after i64
//   (unix seconds) | CA public key [32] | donor public key [32] | name_len u8 | name (1..64
//   graphic ASCII) | count u8 (1..16) | count x (len u8 | address (canonical "IP:PORT",
//   "[V6]:PORT")) | signature [64]
// The signature is the CA's over "rdmaswap-donor-cert-v1" | every byte before it.
// Revocation list: "RSDR" | version u8 (1) | reserved u8 (0) | CA public key [32] | issued
// i64 | count u32 (<= kMaxRevoked) | count x serial u64, strictly ascending | signature [64]
// over "rdmaswap-donor-crl-v1" | every byte before it.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/wire/auth.h"
#include "common/wire/volume_key.h"

namespace rdmaswap {

using PublicKey = VolumePubKey;  // Ed25519, 32 bytes
using Signature = VolumeProof;   // Ed25519, 64 bytes

inline constexpr size_t kMaxCertName = 64;
inline constexpr size_t kMaxCertAddresses = 16;
inline constexpr size_t kMaxCertAddress = 47; // "[" + INET6_ADDRSTRLEN-1 + "]:65535"
inline constexpr size_t kMaxCertSize = 4 + 2 + 8 + 8 + 8 + 32 + 32 + 1 + kMaxCertName + 1 +
				       kMaxCertAddresses * (1 + kMaxCertAddress) + 64;
inline constexpr size_t kMaxRevoked = 65536;

// An Ed25519 signing key (the CA's or a donor's) derived from a secret key file. Not copyable.
class SigningKey {
public:
	// Load `path` (load_auth_key's rules; `kind` names it in errors). Throws std::runtime_error.
	static std::unique_ptr<const SigningKey> load(const std::string &path, const char *kind);
	// Create a new secret file at `path` (mode 0600; refused if it exists) and its public key
	// file at `pub_path`. Throws std::runtime_error naming the file.
	static std::unique_ptr<const SigningKey> create(const std::string &path,
							const std::string &pub_path);
	explicit SigningKey(const AuthKey &secret);
	const PublicKey &public_key() const { return key_->public_key(); }
	// The Ed25519 signature of `msg`. Thread-safe. Throws std::runtime_error if libcrypto
	// fails. Callers put a label of their own at the start of `msg` (domain separation).
	Signature sign(std::span<const std::byte> msg) const { return key_->sign(msg); }

private:
	std::unique_ptr<const VolumeKey> key_;
};

// Public key files: "rdmaswap-ed25519-v1 <hex>\n". read_public_key throws std::runtime_error
// naming the file (not a regular file, too large, not that format).
std::string public_key_text(const PublicKey &pub);
std::optional<PublicKey> parse_public_key(std::string_view text);
PublicKey read_public_key(const std::string &path);
// A donor key argument of `rdmaswapctl cert issue`: a public key file, or the secret key file.
PublicKey read_public_or_secret_key(const std::string &path);

struct DonorCert {
	uint64_t serial = 0;
	int64_t not_before = 0, not_after = 0; // unix seconds, the period it is valid in
	PublicKey ca{};                        // the issuer's public key
	PublicKey donor{};                     // the certified donor's public key
	std::string name;                      // the donor's name (logs, cert show)
	std::vector<std::string> addresses;    // canonical "IP:PORT" / "[V6]:PORT"
	Signature signature{};

	// The whole encoding (signature included) and the bytes the signature covers.
	std::vector<std::byte> encode() const;
	std::vector<std::byte> signed_part() const;
	// Whether `addr` (canonical, canonical_cert_address) is one of its addresses.
	bool lists(std::string_view addr) const;
	// Its addresses, comma-separated (messages, cert list).
	std::string address_list() const;
};

// Strict parse: every length and field range checked, nothing trailing; no signature check.
// On failure returns nullopt and sets `err`. Never reads outside `in`. Fuzz entry point.
std::optional<DonorCert> parse_cert(std::span<const std::byte> in, std::string &err);
// Canonical form of a certificate address: "IP" or "IP:PORT" with a numeric IPv4 or IPv6
// address (IPv6 in brackets when a port follows); without a port, kDefaultPort. nullopt for a
// name or junk (a certificate names what plugins dial; a name would need a lookup per check).
std::optional<std::string> canonical_cert_address(std::string_view s);

// Make a certificate signed by `ca`. Throws std::invalid_argument for a bad name, address
// list or period (the message says which), std::runtime_error if libcrypto fails.
DonorCert issue_cert(const SigningKey &ca, const PublicKey &donor, std::string_view name,
		     std::span<const std::string> addresses, int64_t not_before, int64_t not_after,
		     uint64_t serial);
// Why `cert` is not valid under CA `ca` at `now` (unix seconds): another issuer, a bad
// signature, not yet valid, expired. "" when it is valid. Revocation is DonorVerifier's.
std::string cert_problem(const DonorCert &cert, const PublicKey &ca, int64_t now);

// Reusable signing by a certified donor (the handshake proof; signed etcd registrations):
// `msg` must start with a label of the caller's own. verify_donor_signature checks the
// signature under the certificate's donor key only (check the certificate itself with
// cert_problem / DonorVerifier first). Never throws.
Signature donor_sign(const SigningKey &donor_key, std::span<const std::byte> msg);
bool verify_donor_signature(const DonorCert &cert, std::span<const std::byte> msg,
			    const Signature &sig);

// What a DONOR_PROOF signs: "rdmaswap-donor-proof-v1" | client nonce | server nonce |
// address_len u8 | the address the client dialled (SockAddr::str(), at most 64 bytes).
std::vector<std::byte> donor_proof_message(const Nonce &client_nonce, const Nonce &server_nonce,
					   std::string_view dialled);

struct RevocationList {
	PublicKey ca{};
	int64_t issued = 0;           // unix seconds; a list older than one seen is refused
	std::vector<uint64_t> serials; // strictly ascending
	Signature signature{};
	std::vector<std::byte> encode() const;
	std::vector<std::byte> signed_part() const;
	bool revoked(uint64_t serial) const;
};
std::optional<RevocationList> parse_crl(std::span<const std::byte> in, std::string &err);
// Sign `list` (its ca set to the CA's key, serials sorted and deduplicated).
void sign_crl(const SigningKey &ca, RevocationList &list);
// Why `list` is not a valid list of CA `ca`. "" when it is.
std::string crl_problem(const RevocationList &list, const PublicKey &ca);

// Read a certificate, key or list file (private_file.h's read_small_file: regular, no symbolic
// link, bounded), and write one (replace_private_file, then `mode`). Throw std::runtime_error
// naming the file.
std::vector<std::byte> read_cert_file(const std::string &path, size_t max, const char *kind);
void write_cert_file(const std::string &path, std::span<const std::byte> bytes, unsigned mode);

// The plugin's side (donor-ca=, donor-crl=): is this certificate, presented with a valid proof
// by the server at `dialled`, acceptable now? Thread-safe; control path only (a new donor
// connection). The revocation list is re-read when its file changed (one stat at each call):
// revocation reaches running plugins, for their next connection, without a restart. A list
// that no longer reads, is not the CA's, or is older than the one held is ignored with a
// warning, and the one held stays in force.
class DonorVerifier {
public:
	// Throws std::runtime_error naming the file when the CA key or the list does not read.
	DonorVerifier(const std::string &ca_path, const std::string &crl_path);
	DonorVerifier(const PublicKey &ca, std::string crl_path);
	const PublicKey &ca() const { return ca_; }
	// "" if `cert` is valid (cert_problem), not revoked and lists `dialled` (SockAddr::str());
	// else why not, as a sentence for the operator.
	std::string check(const DonorCert &cert, std::string_view dialled);
	// Re-read the list if its file changed (check() calls it first).
	void refresh_crl();
	// Warn that the donor at `dialled` was refused and why: once per donor and reason
	// (again after kRewarn), so a reconnecting plugin does not flood the log.
	void warn_refused(std::string_view dialled, std::string_view why);
	static constexpr std::chrono::minutes kRewarn{10};

private:
	const PublicKey ca_;
	const std::string crl_path_;
	std::mutex mu_;
	std::optional<RevocationList> crl_;
	struct FileId {
		int64_t mtime_ns = -1, size = -1, ino = -1;
		bool operator==(const FileId &) const = default;
	} crl_id_;
	bool crl_warned_ = false;
	struct Warned {
		std::string dialled, why;
		std::chrono::steady_clock::time_point at;
	};
	std::vector<Warned> warned_; // bounded: the oldest goes beyond kMaxWarned
	static constexpr size_t kMaxWarned = 1024;
	// Load the list (throws on the first load only).
	void load_crl(bool first);
};

} // namespace rdmaswap
