// SPDX-License-Identifier: MIT
// Key files, HMAC-SHA256 (libcrypto) and the two sides of the challenge-response.
#include "common/wire/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/util/err_text.h"
#include "common/util/private_file.h"

namespace rdmaswap {
namespace {

constexpr const char kServerLabel[] = "rdmaswap-auth-server-v1";
constexpr const char kClientLabel[] = "rdmaswap-auth-client-v1";
constexpr const char kAttachLabel[] = "rdmaswap-attach-v1";
constexpr const char kRdmaLabel[] = "rdmaswap-rdma-attach-v1";
constexpr const char kKeyIdLabel[] = "rdmaswap-key-id-v1";

Mac hmac(std::span<const std::byte> key, const char *label,
	 std::initializer_list<std::span<const std::byte>> parts)
{
	std::array<unsigned char, 256> msg;
	size_t n = std::strlen(label);
	if (n > msg.size())
		throw std::logic_error("hmac: label too long");
	std::memcpy(msg.data(), label, n);
	for (auto p : parts) {
		if (p.size() > msg.size() - n)
			throw std::logic_error("hmac: message too long");
		std::memcpy(msg.data() + n, p.data(), p.size());
		n += p.size();
	}
	Mac out;
	unsigned len = 0;
	const unsigned char *r = HMAC(EVP_sha256(), key.data(), int(key.size()), msg.data(), n,
				      reinterpret_cast<unsigned char *>(out.data()), &len);
	OPENSSL_cleanse(msg.data(), n);
	if (!r || len != out.size())
		throw std::runtime_error("HMAC-SHA256 failed (libcrypto)");
	return out;
}

std::array<std::byte, 8> le_bytes(uint64_t v)
{
	std::array<std::byte, 8> b;
	for (int i = 0; i < 8; i++)
		b[size_t(i)] = std::byte((v >> (8 * i)) & 0xff);
	return b;
}

uint64_t le64(const std::byte *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= uint64_t(p[i]) << (8 * i);
	return v;
}

} // namespace

AuthKey::AuthKey(std::span<const std::byte> bytes) : key_(bytes.begin(), bytes.end())
{
	if (key_.size() < kMinKeySize || key_.size() > kMaxKeySize)
		throw std::invalid_argument("auth key must be 16 to 4096 bytes");
	id_ = le64(mac(kKeyIdLabel, {}).data());
}

AuthKey::~AuthKey()
{
	OPENSSL_cleanse(key_.data(), key_.size());
}

std::shared_ptr<const AuthKey> AuthKey::with_donor_check(std::shared_ptr<DonorVerifier> donors) const
{
	auto k = std::make_shared<AuthKey>(key_);
	k->donors_ = std::move(donors);
	return k;
}

Mac AuthKey::mac(const char *label, std::initializer_list<std::span<const std::byte>> parts) const
{
	return hmac(key_, label, parts);
}

std::shared_ptr<const AuthKey> load_auth_key(const std::string &path, const char *kind)
{
	const std::string what = std::string(kind) + " file " + path;
	// O_NOFOLLOW: a symbolic link is refused (it could be pointed elsewhere); O_NONBLOCK: a
	// FIFO does not block the open (it is refused below, never read).
	const int fd =
		::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		const int e = errno;
		struct stat lst {};
		if (e == ELOOP && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
			throw std::runtime_error(what + ": is a symbolic link, which is not followed: "
							"name the key file itself");
		throw std::runtime_error(what + ": " + err_text(e));
	}
	struct stat st {};
	std::vector<std::byte> buf(kMaxKeySize + 2);
	size_t n = 0;
	std::string err;
	if (fstat(fd, &st) != 0) {
		err = err_text(errno);
	} else if (!S_ISREG(st.st_mode)) {
		err = std::string("not a regular file (") + file_kind(st.st_mode) +
		      "): a key is read from a regular file, mode 0600";
	} else if (st.st_uid != ::geteuid()) {
		err = private_file_problem(st) + "; another user could have changed the key: make a "
						 "new one, or, if its contents are yours, chown it to "
						 "the user this runs as and chmod 600 it";
	} else if (st.st_mode & 077) {
		char mode[8];
		std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
		err = std::string("is accessible by other users (mode ") + mode +
		      ": group or other permissions; a key must be mode 0600 or stricter); a readable "
		      "key is a leaked key: chmod 600 " + path +
		      " (and make a new key if others could read it)";
	} else {
		for (;;) {
			const ssize_t r = ::read(fd, buf.data() + n, buf.size() - n);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				err = err_text(errno);
				break;
			}
			n += size_t(r);
			if (r == 0 || n == buf.size())
				break;
		}
	}
	::close(fd);
	while (err.empty() && n > 0 &&
	       (buf[n - 1] == std::byte('\n') || buf[n - 1] == std::byte('\r') ||
		buf[n - 1] == std::byte(' ') || buf[n - 1] == std::byte('\t')))
		n--;
	if (err.empty() && n < kMinKeySize)
		err = "too short (" + std::to_string(n) +
		      " bytes, at least 16): make one with: openssl rand -hex 32 > " + path;
	if (err.empty() && n > kMaxKeySize)
		err = "too long (at most 4096 bytes)";
	std::shared_ptr<const AuthKey> key;
	if (err.empty())
		key = std::make_shared<const AuthKey>(std::span(buf).first(n));
	OPENSSL_cleanse(buf.data(), buf.size());
	if (!err.empty())
		throw std::runtime_error(what + ": " + err);
	return key;
}

void random_bytes(std::span<std::byte> out)
{
	if (RAND_bytes(reinterpret_cast<unsigned char *>(out.data()), int(out.size())) != 1)
		throw std::runtime_error("RAND_bytes failed (libcrypto)");
}

bool mac_equal(std::span<const std::byte> a, std::span<const std::byte> b)
{
	return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool AuthServer::challenge(const Nonce &client_nonce, uint64_t key_id, Nonce &server_nonce,
			   Mac &server_mac)
{
	if (key_ || done_)
		return false;
	for (const auto &k : keys_)
		if (k && k->id() == key_id)
			key_ = k.get();
	if (!key_)
		return false;
	nc_ = client_nonce;
	random_bytes(ns_);
	server_nonce = ns_;
	server_mac = key_->mac(kServerLabel, {nc_, ns_});
	return true;
}

bool AuthServer::verify(const Mac &client_mac)
{
	if (!key_ || done_)
		return false;
	const Mac want = key_->mac(kClientLabel, {nc_, ns_});
	if (!mac_equal(want, client_mac)) {
		key_ = nullptr; // one try per challenge
		return false;
	}
	attach_ = key_->mac(kAttachLabel, {nc_, ns_});
	done_ = true;
	return true;
}

AuthClient::AuthClient(const AuthKey &key) : key_(key)
{
	random_bytes(nc_);
}

bool AuthClient::check(const Nonce &server_nonce, const Mac &server_mac, Mac &proof)
{
	const Mac want = key_.mac(kServerLabel, {nc_, server_nonce});
	if (!mac_equal(want, server_mac))
		return false;
	ns_ = server_nonce;
	proof = key_.mac(kClientLabel, {nc_, server_nonce});
	attach_ = key_.mac(kAttachLabel, {nc_, server_nonce});
	return true;
}

std::array<std::byte, kAttachMacSize> attach_mac(const Mac &attach_key, uint64_t session_id,
						 uint64_t token, uint64_t cm_nonce)
{
	const auto s = le_bytes(session_id), t = le_bytes(token), c = le_bytes(cm_nonce);
	const Mac m = hmac(attach_key, kRdmaLabel, {s, t, c});
	std::array<std::byte, kAttachMacSize> out;
	std::memcpy(out.data(), m.data(), out.size());
	return out;
}

} // namespace rdmaswap
