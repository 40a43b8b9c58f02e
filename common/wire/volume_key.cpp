// SPDX-License-Identifier: MIT
// Volume keys: the key file, the Ed25519 key derived per volume name, and BIND proofs.
#include "common/wire/volume_key.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "common/util/encoding.h"
#include "common/util/err_text.h"
#include "common/util/private_file.h"
#include "common/wire/protocol.h"

namespace rdmaswap {
namespace {

constexpr const char kSeedLabel[] = "rdmaswap-volume-seed-v1";
constexpr const char kBindLabel[] = "rdmaswap-volume-bind-v1";
static_assert(sizeof kBindLabel - 1 == 23, "kBindProofMessageSize counts the label");

struct MdCtxFree {
	void operator()(EVP_MD_CTX *c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;
struct PkeyFree {
	void operator()(EVP_PKEY *p) const { EVP_PKEY_free(p); }
};

// mkdir -p with mode 0700 for every directory it makes. Throws naming the directory.
void make_parents(const std::string &path)
{
	const size_t slash = path.rfind('/');
	if (slash == std::string::npos || slash == 0)
		return;
	const std::string dir = path.substr(0, slash);
	struct stat st {};
	if (::stat(dir.c_str(), &st) == 0) {
		if (!S_ISDIR(st.st_mode))
			throw std::runtime_error(dir + ": not a directory");
		return;
	}
	if (errno != ENOENT)
		throw std::runtime_error(dir + ": " + err_text(errno));
	make_parents(dir);
	if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
		throw std::runtime_error("cannot create directory " + dir + ": " +
					 err_text(errno));
}

// Create `path` holding 64 random hex digits and a newline, mode 0600, atomically: written
// whole under a temporary name, then linked into place. False if `path` existed already
// (another process made it first); throws on any other failure.
bool create_key_file(const std::string &path)
{
	std::array<std::byte, 32> raw;
	random_bytes(raw);
	std::array<char, 65> text;
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < raw.size(); i++) {
		text[2 * i] = digits[unsigned(raw[i]) >> 4];
		text[2 * i + 1] = digits[unsigned(raw[i]) & 15];
	}
	text[64] = '\n';
	OPENSSL_cleanse(raw.data(), raw.size());
	std::array<std::byte, 8> rnd;
	random_bytes(rnd);
	const std::string tmp = path + ".tmp-" + hex(rnd);
	std::string err =
		write_private_file(tmp, std::string_view(text.data(), text.size())).error;
	OPENSSL_cleanse(text.data(), text.size());
	bool made = false;
	if (err.empty()) {
		if (::link(tmp.c_str(), path.c_str()) == 0)
			made = true;
		else if (errno != EEXIST)
			err = "cannot link " + tmp + " to " + path + ": " + err_text(errno);
		::unlink(tmp.c_str()); // (write_private_file removed it if it failed)
	}
	if (!err.empty())
		throw std::runtime_error("cannot create volume key file " + path + ": " + err);
	return made;
}

} // namespace

void VolumeKey::PkeyFree::operator()(::evp_pkey_st *p) const
{
	EVP_PKEY_free(p);
}

VolumeKey::VolumeKey(const AuthKey &v, std::string_view name) : name_(name)
{
	if (!proto::valid_volume_name(name))
		throw std::invalid_argument("volume key: the volume name is not 1..64 graphic ASCII "
					    "characters");
	const Mac seed = v.mac(kSeedLabel, {std::as_bytes(std::span(name.data(), name.size()))});
	std::memcpy(seed_.data(), seed.data(), seed_.size());
	pkey_.reset(EVP_PKEY_new_raw_private_key(
		EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char *>(seed_.data()),
		seed_.size()));
	size_t len = pub_.size();
	if (!pkey_ ||
	    EVP_PKEY_get_raw_public_key(pkey_.get(), reinterpret_cast<unsigned char *>(pub_.data()),
					&len) != 1 ||
	    len != pub_.size()) {
		OPENSSL_cleanse(seed_.data(), seed_.size());
		throw std::runtime_error("volume key: Ed25519 key derivation failed (libcrypto)");
	}
}

VolumeKey::~VolumeKey()
{
	OPENSSL_cleanse(seed_.data(), seed_.size());
}

std::unique_ptr<const VolumeKey> VolumeKey::load_or_create(const std::string &path,
							    std::string_view name, bool *created)
{
	bool made = false;
	struct stat st {};
	if (::lstat(path.c_str(), &st) != 0) {
		if (errno != ENOENT)
			throw std::runtime_error("volume key file " + path + ": " +
						 err_text(errno));
		make_parents(path);
		made = create_key_file(path);
	}
	if (created)
		*created = made;
	const auto v = load_auth_key(path, "volume key");
	return std::make_unique<const VolumeKey>(*v, name);
}

VolumeProof VolumeKey::sign(std::span<const std::byte> msg) const
{
	MdCtx ctx(EVP_MD_CTX_new());
	VolumeProof sig{};
	size_t len = sig.size();
	if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, pkey_.get()) != 1 ||
	    EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char *>(sig.data()), &len,
			   reinterpret_cast<const unsigned char *>(msg.data()), msg.size()) != 1 ||
	    len != sig.size())
		throw std::runtime_error("volume key: Ed25519 signing failed (libcrypto)");
	return sig;
}

bool verify_volume_proof(const VolumePubKey &pub, std::span<const std::byte> msg,
			 const VolumeProof &sig)
{
	std::unique_ptr<EVP_PKEY, PkeyFree> key(EVP_PKEY_new_raw_public_key(
		EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char *>(pub.data()),
		pub.size()));
	if (!key)
		return false;
	MdCtx ctx(EVP_MD_CTX_new());
	return ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) == 1 &&
	       EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char *>(sig.data()),
				sig.size(), reinterpret_cast<const unsigned char *>(msg.data()),
				msg.size()) == 1;
}

std::array<std::byte, kBindProofMessageSize>
bind_proof_message(const Challenge &challenge, uint64_t session_id, std::span<const char, 64> name,
		   uint32_t lease_s, const VolumePubKey &pub)
{
	std::array<std::byte, kBindProofMessageSize> m{};
	size_t n = 0;
	auto put = [&](const void *p, size_t len) {
		std::memcpy(m.data() + n, p, len);
		n += len;
	};
	auto put_le = [&](uint64_t v, size_t len) {
		for (size_t i = 0; i < len; i++)
			m[n++] = std::byte((v >> (8 * i)) & 0xff);
	};
	put(kBindLabel, sizeof kBindLabel - 1);
	put(challenge.data(), challenge.size());
	put_le(session_id, 8);
	put(name.data(), name.size());
	put_le(lease_s, 4);
	put(pub.data(), pub.size());
	return m;
}

std::string default_volume_key_path(const char *state_directory, bool root,
				    const char *xdg_state_home, const char *home)
{
	auto set = [](const char *s) { return s && *s; };
	if (set(state_directory)) {
		std::string dir(state_directory);
		dir = dir.substr(0, dir.find(':'));
		return dir + "/volume.key";
	}
	if (root)
		return "/var/lib/rdmaswap/volume.key";
	if (set(xdg_state_home))
		return std::string(xdg_state_home) + "/rdmaswap/volume.key";
	if (set(home))
		return std::string(home) + "/.local/state/rdmaswap/volume.key";
	throw std::runtime_error("no default place for the volume key (STATE_DIRECTORY, "
				 "XDG_STATE_HOME and HOME are unset and we are not root): give "
				 "volume-key=FILE");
}

std::string default_volume_key_path()
{
	return default_volume_key_path(std::getenv("STATE_DIRECTORY"), ::geteuid() == 0,
				       std::getenv("XDG_STATE_HOME"), std::getenv("HOME"));
}

} // namespace rdmaswap
