// SPDX-License-Identifier: MIT
// The etcd client's credentials (etcd.h, Credentials): the PEM files and the password read once
// and checked, and the token etcd hands out for them.
#include "common/net/etcd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "common/util/err_text.h"
#include "common/util/fd.h"
#include "common/util/private_file.h"

namespace rdmaswap::etcd {

namespace {

// The largest credential file read (a CA bundle of a few hundred certificates fits).
constexpr size_t kMaxCredentialFile = size_t(1) << 20;
constexpr size_t kMaxPassword = 4096;

// Read the file `path` of the key `what` ("etcd-cacert"). A secret (`secret`: the private key,
// the password) must be a key file: not a symbolic link, owned by this process's user, mode
// 0600 or stricter. Anything must be a regular file (O_NONBLOCK: a FIFO is refused, never
// waited on) of at most kMaxCredentialFile bytes. Throws naming `what` and `path`.
std::string read_credential_file(const char *what, const std::string &path, bool secret)
{
	const std::string name = std::string(what) + " file " + path;
	const int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (secret ? O_NOFOLLOW : 0);
	const int fd = ::open(path.c_str(), flags);
	if (fd < 0) {
		const int e = errno;
		struct stat lst {};
		if (secret && e == ELOOP && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
			throw std::runtime_error(name + ": is a symbolic link, which is not followed "
							"for a secret: name the file itself");
		throw std::runtime_error(name + ": " + err_text(e));
	}
	const Fd closer(fd);
	struct stat st {};
	if (::fstat(fd, &st) != 0)
		throw std::runtime_error(name + ": " + err_text(errno));
	if (!S_ISREG(st.st_mode))
		throw std::runtime_error(name + ": not a regular file (" + file_kind(st.st_mode) + ")");
	if (secret)
		if (const std::string why = private_file_problem(st); !why.empty())
			throw std::runtime_error(name + ": " + why + "; chown it to the user this runs " +
						 "as and chmod 600 it");
	if (uint64_t(st.st_size) > kMaxCredentialFile)
		throw std::runtime_error(name + ": larger than " +
					 std::to_string(kMaxCredentialFile) + " bytes");
	std::string text(size_t(st.st_size), '\0');
	if (const int e = read_fd_into(fd, text); e != 0) {
		OPENSSL_cleanse(text.data(), text.size());
		throw std::runtime_error(name + ": " + err_text(e));
	}
	return text;
}

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;
using PKeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

Bio bio_of(const std::string &pem)
{
	Bio b(BIO_new_mem_buf(pem.data(), int(pem.size())), &BIO_free);
	if (!b)
		throw std::bad_alloc();
	return b;
}

// The first certificate of `pem`, or null.
X509Ptr first_cert(const std::string &pem)
{
	Bio b = bio_of(pem);
	return X509Ptr(PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr), &X509_free);
}

// A passphrase callback that gives none: an encrypted key is refused, never prompted for.
int no_passphrase(char *, int, int, void *)
{
	return -1;
}

} // namespace

Credentials::Credentials(const EtcdSecurity &s) : user_(s.user)
{
	try {
		load(s);
	} catch (...) {
		OPENSSL_cleanse(password_.data(), password_.size());
		OPENSSL_cleanse(key_.data(), key_.size());
		throw;
	}
}

void Credentials::load(const EtcdSecurity &s)
{
	if (!s.cacert.empty()) {
		cacert_ = read_credential_file("etcd-cacert", s.cacert, false);
		if (!first_cert(cacert_))
			throw std::runtime_error("etcd-cacert file " + s.cacert +
						 ": no PEM certificate in it (-----BEGIN CERTIFICATE-----)");
	}
	if (!s.cert.empty()) {
		cert_ = read_credential_file("etcd-cert", s.cert, false);
		key_ = read_credential_file("etcd-key", s.key, true);
		X509Ptr cert = first_cert(cert_);
		if (!cert)
			throw std::runtime_error("etcd-cert file " + s.cert +
						 ": no PEM certificate in it (-----BEGIN CERTIFICATE-----)");
		Bio b = bio_of(key_);
		PKeyPtr key(PEM_read_bio_PrivateKey(b.get(), nullptr, &no_passphrase, nullptr),
			    &EVP_PKEY_free);
		if (!key)
			throw std::runtime_error("etcd-key file " + s.key +
						 ": no unencrypted PEM private key in it");
		if (X509_check_private_key(cert.get(), key.get()) != 1)
			throw std::runtime_error("etcd-key file " + s.key +
						 ": not the private key of the certificate in " + s.cert);
	}
	if (!s.password_file.empty()) {
		password_ = read_credential_file("etcd-password-file", s.password_file, true);
		while (!password_.empty() && (password_.back() == '\n' || password_.back() == '\r'))
			password_.pop_back();
		if (password_.empty() || password_.size() > kMaxPassword)
			throw std::runtime_error("etcd-password-file file " + s.password_file +
						 (password_.empty() ? ": empty"
								    : ": longer than 4096 bytes"));
		if (password_.find_first_of(std::string_view("\n\r\0", 3)) != std::string::npos)
			throw std::runtime_error("etcd-password-file file " + s.password_file +
						 ": more than one line (the password is its first "
						 "and only line)");
	}
}

Credentials::~Credentials()
{
	OPENSSL_cleanse(password_.data(), password_.size());
	OPENSSL_cleanse(key_.data(), key_.size());
	std::lock_guard lock(mu_);
	OPENSSL_cleanse(token_.data(), token_.size());
}

std::string Credentials::token() const
{
	std::lock_guard lock(mu_);
	return token_;
}

void Credentials::set_token(std::string t) const
{
	std::lock_guard lock(mu_);
	OPENSSL_cleanse(token_.data(), token_.size());
	token_ = std::move(t);
}

} // namespace rdmaswap::etcd
