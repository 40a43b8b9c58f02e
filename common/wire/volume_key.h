// SPDX-License-Identifier: MIT
// Per-volume credentials: the owning host's volume key file (a secret V), the Ed25519 key of one
// volume derived from it, and the proof a BIND carries. The memserver keeps only the public key.
//
//   seed(name)   = HMAC-SHA256(V, "rdmaswap-volume-seed-v1" | name), an Ed25519 private key
//   public key   = its 32-byte Ed25519 public key: with the cluster key id and the name, it is
//                  the volume's identity on a memserver (another V never matches it)
//   BIND proof   = Ed25519 signature of bind_proof_message(challenge of the connection, session
//                  id, name field, lease, public key)
// Crypto is OpenSSL 3's libcrypto (EVP_PKEY_ED25519, EVP_DigestSign/Verify with no digest).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/wire/auth.h"

struct evp_pkey_st; // OpenSSL's EVP_PKEY

namespace rdmaswap {

inline constexpr size_t kVolumePubKeySize = 32;
inline constexpr size_t kVolumeProofSize = 64;
inline constexpr size_t kChallengeSize = 32;
using VolumePubKey = std::array<std::byte, kVolumePubKeySize>;
using VolumeProof = std::array<std::byte, kVolumeProofSize>;
using Challenge = std::array<std::byte, kChallengeSize>;

// The signing key of one volume, derived from the host's secret. The seed is wiped when it is
// destroyed. Not copyable (share it by pointer). sign() is const and thread-safe.
class VolumeKey {
public:
	// Derive the key of volume `name` (1..64 graphic ASCII characters, proto::valid_volume_name)
	// from the secret `v`. Throws std::invalid_argument for a bad name, std::runtime_error if
	// libcrypto fails.
	VolumeKey(const AuthKey &v, std::string_view name);
	~VolumeKey();
	VolumeKey(const VolumeKey &) = delete;
	VolumeKey &operator=(const VolumeKey &) = delete;

	// Load the secret from `path` (the rules of load_auth_key: a regular file, not a symbolic
	// link, owned by this process's user, not accessible by group or others, 16..4096 bytes)
	// or, if no such file exists, create it first: missing parent directories with mode 0700,
	// then the file with mode 0600 holding 64 random hex digits and a newline (written whole
	// under a temporary name and linked into place, so a concurrent start never reads half a
	// key; if another process created it meanwhile, that one is used). Then derive the key of `name`. `created` (may be null) is set to whether
	// this call made the file. Throws std::runtime_error naming the file and what failed.
	static std::unique_ptr<const VolumeKey> load_or_create(const std::string &path,
							       std::string_view name,
							       bool *created = nullptr);

	const std::string &name() const { return name_; }
	const VolumePubKey &public_key() const { return pub_; }
	// The Ed25519 signature of `msg`. Throws std::runtime_error if libcrypto fails.
	VolumeProof sign(std::span<const std::byte> msg) const;

private:
	struct PkeyFree {
		void operator()(::evp_pkey_st *p) const;
	};
	std::string name_;
	std::array<std::byte, 32> seed_{};
	std::unique_ptr<::evp_pkey_st, PkeyFree> pkey_;
	VolumePubKey pub_{};
};

// True if `sig` is a valid Ed25519 signature of `msg` under public key `pub` (false too for a
// public key that is not a valid curve point). Never throws.
bool verify_volume_proof(const VolumePubKey &pub, std::span<const std::byte> msg,
			 const VolumeProof &sig);

// What a BIND proof signs: "rdmaswap-volume-bind-v1" | challenge | session id (le64) | the
// request's name field (64 bytes, NUL-padded) | lease_s (le32) | public key.
inline constexpr size_t kBindProofMessageSize = 23 + kChallengeSize + 8 + 64 + 4 + kVolumePubKeySize;
std::array<std::byte, kBindProofMessageSize>
bind_proof_message(const Challenge &challenge, uint64_t session_id, std::span<const char, 64> name,
		   uint32_t lease_s, const VolumePubKey &pub);

// Where the volume key lives when volume-key= is not given: $STATE_DIRECTORY/volume.key
// (systemd's StateDirectory=; the first of several colon-separated ones), else
// /var/lib/rdmaswap/volume.key for root, else ${XDG_STATE_HOME:-$HOME/.local/state}/rdmaswap/
// volume.key. Arguments are the environment's values (null: unset or empty). Throws
// std::runtime_error when none applies (not root, neither XDG_STATE_HOME nor HOME set).
std::string default_volume_key_path(const char *state_directory, bool root,
				    const char *xdg_state_home, const char *home);
// The same, from this process's environment and effective uid.
std::string default_volume_key_path();


} // namespace rdmaswap
