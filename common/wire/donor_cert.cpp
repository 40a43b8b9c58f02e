// SPDX-License-Identifier: MIT
// Donor certificates and revocation lists: encoding, strict parsing, signing, verification.
#include "common/wire/donor_cert.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/obs/log.h"
#include "common/util/config.h"
#include "common/util/encoding.h"
#include "common/util/err_text.h"
#include "common/util/private_file.h"

namespace rdmaswap {
namespace {

constexpr const char kKeyName[] = "rdmaswap-signing-key-v1"; // VolumeKey's derivation name
constexpr const char kCertLabel[] = "rdmaswap-donor-cert-v1";
constexpr const char kCrlLabel[] = "rdmaswap-donor-crl-v1";
constexpr const char kProofLabel[] = "rdmaswap-donor-proof-v1";
constexpr const char kPubPrefix[] = "rdmaswap-ed25519-v1 ";
constexpr std::array<char, 4> kCertMagic{'R', 'S', 'D', 'C'};
constexpr std::array<char, 4> kCrlMagic{'R', 'S', 'D', 'R'};
constexpr uint8_t kFormatVersion = 1;

class Writer {
public:
	void bytes(std::span<const std::byte> b) { out_.insert(out_.end(), b.begin(), b.end()); }
	void text(std::string_view s) { bytes(std::as_bytes(std::span(s.data(), s.size()))); }
	template <typename T> void le(T v)
	{
		for (size_t i = 0; i < sizeof(T); i++)
			out_.push_back(std::byte((uint64_t(v) >> (8 * i)) & 0xff));
	}
	std::vector<std::byte> take() { return std::move(out_); }

private:
	std::vector<std::byte> out_;
};

// Bounds-checked reader: every get fails (ok() false) rather than read past the end.
class Reader {
public:
	explicit Reader(std::span<const std::byte> in) : in_(in) {}
	bool ok() const { return ok_; }
	size_t pos() const { return pos_; }
	size_t left() const { return in_.size() - pos_; }
	bool get(std::span<std::byte> out)
	{
		if (!ok_ || out.size() > left())
			return ok_ = false;
		std::memcpy(out.data(), in_.data() + pos_, out.size());
		pos_ += out.size();
		return true;
	}
	template <typename T> T le()
	{
		std::array<std::byte, sizeof(T)> b{};
		if (!get(b))
			return T{};
		uint64_t v = 0;
		for (size_t i = 0; i < sizeof(T); i++)
			v |= uint64_t(b[i]) << (8 * i);
		return T(v);
	}
	std::string text(size_t n)
	{
		std::string s(std::min(n, left()), '\0');
		if (n > left())
			ok_ = false;
		else
			get(std::as_writable_bytes(std::span(s.data(), s.size())));
		return s;
	}

private:
	std::span<const std::byte> in_;
	size_t pos_ = 0;
	bool ok_ = true;
};

bool graphic(std::string_view s)
{
	return std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

std::span<const std::byte> as_bytes(std::string_view s)
{
	return std::as_bytes(std::span(s.data(), s.size()));
}

// label | body, the message a signature covers.
std::vector<std::byte> labelled(const char *label, std::span<const std::byte> body)
{
	Writer w;
	w.text(label);
	w.bytes(body);
	return w.take();
}

template <size_t N> bool magic_is(Reader &r, const std::array<char, N> &want)
{
	std::array<std::byte, N> got{};
	return r.get(got) && std::memcmp(got.data(), want.data(), N) == 0;
}

} // namespace

// --- Keys

SigningKey::SigningKey(const AuthKey &secret)
	: key_(std::make_unique<const VolumeKey>(secret, kKeyName))
{
}

std::unique_ptr<const SigningKey> SigningKey::load(const std::string &path, const char *kind)
{
	const auto secret = load_auth_key(path, kind);
	return std::make_unique<const SigningKey>(*secret);
}

std::unique_ptr<const SigningKey> SigningKey::create(const std::string &path,
						      const std::string &pub_path)
{
	struct stat st {};
	if (::lstat(path.c_str(), &st) == 0)
		throw std::runtime_error(path + ": exists already (not overwritten)");
	if (::lstat(pub_path.c_str(), &st) == 0)
		throw std::runtime_error(pub_path + ": exists already (not overwritten)");
	bool created = false;
	(void)VolumeKey::load_or_create(path, kKeyName, &created);
	if (!created)
		throw std::runtime_error(path + ": made by another process meanwhile");
	auto key = load(path, "key");
	const std::string text = public_key_text(key->public_key());
	write_cert_file(pub_path, as_bytes(text), 0644);
	return key;
}

std::string public_key_text(const PublicKey &pub)
{
	return kPubPrefix + hex(pub) + "\n";
}

std::optional<PublicKey> parse_public_key(std::string_view text)
{
	const std::string_view prefix = kPubPrefix;
	if (text.substr(0, prefix.size()) != prefix)
		return std::nullopt;
	text.remove_prefix(prefix.size());
	if (!text.empty() && text.back() == '\n')
		text.remove_suffix(1);
	PublicKey pub{};
	const auto bytes = unhex(text);
	if (!bytes || bytes->size() != pub.size())
		return std::nullopt;
	std::copy(bytes->begin(), bytes->end(), pub.begin());
	return pub;
}

PublicKey read_public_key(const std::string &path)
{
	const auto b = read_cert_file(path, 256, "public key");
	const auto pub = parse_public_key(
		std::string_view(reinterpret_cast<const char *>(b.data()), b.size()));
	if (!pub)
		throw std::runtime_error("public key file " + path + ": not a public key (one line "
					 "\"" + std::string(kPubPrefix) + "<64 hex digits>\", as "
					 "rdmaswapctl ca create and donor-key create write)");
	return *pub;
}

PublicKey read_public_or_secret_key(const std::string &path)
{
	const auto b = read_cert_file(path, 8192, "donor key");
	const std::string_view text(reinterpret_cast<const char *>(b.data()), b.size());
	if (text.substr(0, std::strlen(kPubPrefix)) == kPubPrefix)
		return read_public_key(path);
	return SigningKey::load(path, "donor key")->public_key();
}

// --- Files

std::vector<std::byte> read_cert_file(const std::string &path, size_t max, const char *kind)
{
	const auto text = read_small_file(path, max);
	if (!text)
		throw std::runtime_error(std::string(kind) + " file " + path + ": " + text.error);
	if (!*text)
		throw std::runtime_error(std::string(kind) + " file " + path + ": " +
					 err_text(ENOENT));
	const auto b = as_bytes(**text);
	return {b.begin(), b.end()};
}

void write_cert_file(const std::string &path, std::span<const std::byte> bytes, unsigned mode)
{
	std::string err =
		replace_private_file(path, std::string_view(reinterpret_cast<const char *>(bytes.data()),
							    bytes.size()))
			.error;
	if (err.empty() && ::chmod(path.c_str(), mode) != 0)
		err = std::string("chmod: ") + err_text(errno);
	if (!err.empty())
		throw std::runtime_error("cannot write " + path + ": " + err);
}

// --- Certificates

std::optional<std::string> canonical_cert_address(std::string_view s)
{
	const auto ep = parse_endpoint(s);
	if (!ep)
		return std::nullopt;
	std::array<std::byte, 16> raw{};
	std::array<char, 64> buf{};
	if (inet_pton(AF_INET, ep->host.c_str(), raw.data()) == 1) {
		inet_ntop(AF_INET, raw.data(), buf.data(), buf.size());
		return std::string(buf.data()) + ":" + std::to_string(ep->port);
	}
	if (inet_pton(AF_INET6, ep->host.c_str(), raw.data()) == 1) {
		inet_ntop(AF_INET6, raw.data(), buf.data(), buf.size());
		return "[" + std::string(buf.data()) + "]:" + std::to_string(ep->port);
	}
	return std::nullopt;
}

std::vector<std::byte> DonorCert::signed_part() const
{
	Writer w;
	w.bytes(std::as_bytes(std::span(kCertMagic)));
	w.le<uint8_t>(kFormatVersion);
	w.le<uint8_t>(0);
	w.le<uint64_t>(serial);
	w.le<int64_t>(not_before);
	w.le<int64_t>(not_after);
	w.bytes(ca);
	w.bytes(donor);
	w.le<uint8_t>(uint8_t(name.size()));
	w.text(name);
	w.le<uint8_t>(uint8_t(addresses.size()));
	for (const auto &a : addresses) {
		w.le<uint8_t>(uint8_t(a.size()));
		w.text(a);
	}
	return w.take();
}

std::vector<std::byte> DonorCert::encode() const
{
	auto b = signed_part();
	b.insert(b.end(), signature.begin(), signature.end());
	return b;
}

bool DonorCert::lists(std::string_view addr) const
{
	return std::find(addresses.begin(), addresses.end(), addr) != addresses.end();
}

std::string DonorCert::address_list() const
{
	std::string list;
	for (const auto &a : addresses)
		list += (list.empty() ? "" : ",") + a;
	return list;
}

std::optional<DonorCert> parse_cert(std::span<const std::byte> in, std::string &err)
{
	auto fail = [&err](const char *why) {
		err = why;
		return std::nullopt;
	};
	if (in.size() > kMaxCertSize)
		return fail("longer than any certificate");
	Reader r(in);
	if (!magic_is(r, kCertMagic))
		return fail("not a donor certificate (bad magic)");
	if (r.le<uint8_t>() != kFormatVersion)
		return fail("unsupported certificate version");
	if (r.le<uint8_t>() != 0)
		return fail("reserved byte not zero");
	DonorCert c;
	c.serial = r.le<uint64_t>();
	c.not_before = r.le<int64_t>();
	c.not_after = r.le<int64_t>();
	r.get(c.ca);
	r.get(c.donor);
	const size_t name_len = r.le<uint8_t>();
	if (!r.ok())
		return fail("truncated");
	if (name_len == 0 || name_len > kMaxCertName)
		return fail("name length out of range (1..64)");
	c.name = r.text(name_len);
	if (!r.ok())
		return fail("truncated");
	if (!graphic(c.name))
		return fail("name has a character other than graphic ASCII");
	const size_t count = r.le<uint8_t>();
	if (!r.ok())
		return fail("truncated");
	if (count == 0 || count > kMaxCertAddresses)
		return fail("address count out of range (1..16)");
	for (size_t i = 0; i < count; i++) {
		const size_t len = r.le<uint8_t>();
		if (!r.ok())
			return fail("truncated");
		if (len == 0 || len > kMaxCertAddress)
			return fail("address length out of range");
		std::string a = r.text(len);
		if (!r.ok())
			return fail("truncated");
		const auto canon = canonical_cert_address(a);
		if (!canon || *canon != a)
			return fail("an address is not in canonical numeric IP:PORT form");
		c.addresses.push_back(std::move(a));
	}
	if (c.not_after <= c.not_before)
		return fail("validity period is empty (not_after <= not_before)");
	r.get(c.signature);
	if (!r.ok())
		return fail("truncated");
	if (r.left() != 0)
		return fail("trailing bytes after the signature");
	return c;
}

DonorCert issue_cert(const SigningKey &ca, const PublicKey &donor, std::string_view name,
		     std::span<const std::string> addresses, int64_t not_before, int64_t not_after,
		     uint64_t serial)
{
	if (name.empty() || name.size() > kMaxCertName || !graphic(name))
		throw std::invalid_argument("name: 1 to 64 graphic ASCII characters (no space)");
	if (addresses.empty() || addresses.size() > kMaxCertAddresses)
		throw std::invalid_argument("addresses: 1 to 16 addresses");
	if (not_after <= not_before)
		throw std::invalid_argument("the validity period is empty");
	DonorCert c;
	c.serial = serial;
	c.not_before = not_before;
	c.not_after = not_after;
	c.ca = ca.public_key();
	c.donor = donor;
	c.name = name;
	for (const auto &a : addresses) {
		const auto canon = canonical_cert_address(a);
		if (!canon)
			throw std::invalid_argument(
				"address '" + a + "': a numeric IPv4 or IPv6 address with an optional "
				"port (IP, IP:PORT, [V6]:PORT): a certificate names the addresses "
				"plugins dial, not host names");
		if (!c.lists(*canon))
			c.addresses.push_back(*canon);
	}
	c.signature = ca.sign(labelled(kCertLabel, c.signed_part()));
	return c;
}

std::string cert_problem(const DonorCert &cert, const PublicKey &ca, int64_t now)
{
	if (!mac_equal(cert.ca, ca))
		return "certificate issued by another CA (key " + hex(cert.ca).substr(0, 16) +
		       "..., donor-ca= is " + hex(ca).substr(0, 16) + "...)";
	if (!verify_volume_proof(ca, labelled(kCertLabel, cert.signed_part()), cert.signature))
		return "certificate signature is not the CA's (altered or forged)";
	if (now < cert.not_before)
		return "certificate not valid yet (from " + std::to_string(cert.not_before) +
		       ", now " + std::to_string(now) + ")";
	if (now >= cert.not_after)
		return "certificate expired (at " + std::to_string(cert.not_after) + ", now " +
		       std::to_string(now) + ")";
	return {};
}

Signature donor_sign(const SigningKey &donor_key, std::span<const std::byte> msg)
{
	return donor_key.sign(msg);
}

bool verify_donor_signature(const DonorCert &cert, std::span<const std::byte> msg,
			    const Signature &sig)
{
	return verify_volume_proof(cert.donor, msg, sig);
}

std::vector<std::byte> donor_proof_message(const Nonce &client_nonce, const Nonce &server_nonce,
					   std::string_view dialled)
{
	Writer w;
	w.text(kProofLabel);
	w.bytes(client_nonce);
	w.bytes(server_nonce);
	const size_t n = std::min<size_t>(dialled.size(), 64);
	w.le<uint8_t>(uint8_t(n));
	w.text(dialled.substr(0, n));
	return w.take();
}

// --- Revocation lists

std::vector<std::byte> RevocationList::signed_part() const
{
	Writer w;
	w.bytes(std::as_bytes(std::span(kCrlMagic)));
	w.le<uint8_t>(kFormatVersion);
	w.le<uint8_t>(0);
	w.bytes(ca);
	w.le<int64_t>(issued);
	w.le<uint32_t>(uint32_t(serials.size()));
	for (uint64_t s : serials)
		w.le<uint64_t>(s);
	return w.take();
}

std::vector<std::byte> RevocationList::encode() const
{
	auto b = signed_part();
	b.insert(b.end(), signature.begin(), signature.end());
	return b;
}

bool RevocationList::revoked(uint64_t serial) const
{
	return std::binary_search(serials.begin(), serials.end(), serial);
}

std::optional<RevocationList> parse_crl(std::span<const std::byte> in, std::string &err)
{
	auto fail = [&err](const char *why) {
		err = why;
		return std::nullopt;
	};
	Reader r(in);
	if (!magic_is(r, kCrlMagic))
		return fail("not a revocation list (bad magic)");
	if (r.le<uint8_t>() != kFormatVersion)
		return fail("unsupported revocation list version");
	if (r.le<uint8_t>() != 0)
		return fail("reserved byte not zero");
	RevocationList l;
	r.get(l.ca);
	l.issued = r.le<int64_t>();
	const uint32_t count = r.le<uint32_t>();
	if (!r.ok())
		return fail("truncated");
	if (count > kMaxRevoked)
		return fail("more serials than a list may hold");
	if (uint64_t(count) * 8 + 64 != r.left())
		return fail("length does not match the serial count");
	l.serials.reserve(count);
	for (uint32_t i = 0; i < count; i++) {
		const uint64_t s = r.le<uint64_t>();
		if (!l.serials.empty() && s <= l.serials.back())
			return fail("serials not strictly ascending");
		l.serials.push_back(s);
	}
	r.get(l.signature);
	if (!r.ok() || r.left() != 0)
		return fail("truncated");
	return l;
}

void sign_crl(const SigningKey &ca, RevocationList &list)
{
	if (list.serials.size() > kMaxRevoked)
		throw std::invalid_argument("more than 65536 revoked serials");
	std::sort(list.serials.begin(), list.serials.end());
	list.serials.erase(std::unique(list.serials.begin(), list.serials.end()),
			   list.serials.end());
	list.ca = ca.public_key();
	list.signature = ca.sign(labelled(kCrlLabel, list.signed_part()));
}

std::string crl_problem(const RevocationList &list, const PublicKey &ca)
{
	if (!mac_equal(list.ca, ca))
		return "revocation list of another CA";
	if (!verify_volume_proof(ca, labelled(kCrlLabel, list.signed_part()), list.signature))
		return "revocation list signature is not the CA's (altered or forged)";
	return {};
}

// --- The plugin's verifier

DonorVerifier::DonorVerifier(const std::string &ca_path, const std::string &crl_path)
	: DonorVerifier(read_public_key(ca_path), crl_path)
{
}

DonorVerifier::DonorVerifier(const PublicKey &ca, std::string crl_path)
	: ca_(ca), crl_path_(std::move(crl_path))
{
	if (!crl_path_.empty())
		load_crl(true);
}

void DonorVerifier::load_crl(bool first)
{
	struct stat st {};
	FileId id;
	if (::stat(crl_path_.c_str(), &st) == 0)
		id = {int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
		      int64_t(st.st_size), int64_t(st.st_ino)};
	if (!first && id == crl_id_)
		return;
	std::string why;
	std::optional<RevocationList> l;
	try {
		const auto b = read_cert_file(crl_path_, 16 + 32 + 8 + 4 + kMaxRevoked * 8 + 64,
					      "revocation list");
		l = parse_crl(b, why);
		if (l)
			why = crl_problem(*l, ca_);
		else
			why = "revocation list file " + crl_path_ + ": " + why;
		if (why.empty() && crl_ && l->issued < crl_->issued)
			why = "revocation list file " + crl_path_ + " is older than the one in force "
			      "(issued " + std::to_string(l->issued) + " < " +
			      std::to_string(crl_->issued) + ")";
	} catch (const std::exception &e) {
		why = e.what();
	}
	if (first && !why.empty())
		throw std::runtime_error("donor-crl=: " + why);
	crl_id_ = id;
	if (!why.empty()) {
		if (!crl_warned_)
			logger("donor-cert")->warn("donor-crl=: {}; the list read before stays in "
						   "force ({} serials revoked)",
						   why, crl_ ? crl_->serials.size() : 0);
		crl_warned_ = true;
		return;
	}
	crl_warned_ = false;
	const size_t before = crl_ ? crl_->serials.size() : 0;
	crl_ = std::move(l);
	if (!first)
		logger("donor-cert")->info("donor-crl=: {} re-read: {} serials revoked (was {})",
					   crl_path_, crl_->serials.size(), before);
}

void DonorVerifier::refresh_crl()
{
	if (!crl_path_.empty())
		load_crl(false);
}

void DonorVerifier::warn_refused(std::string_view dialled, std::string_view why)
{
	{
		std::lock_guard lock(mu_);
		const auto now = std::chrono::steady_clock::now();
		auto it = std::find_if(warned_.begin(), warned_.end(),
				       [&](const Warned &w) { return w.dialled == dialled; });
		if (it != warned_.end() && it->why == why && now - it->at < kRewarn)
			return;
		if (it == warned_.end()) {
			if (warned_.size() >= kMaxWarned)
				warned_.erase(warned_.begin());
			warned_.push_back({std::string(dialled), std::string(why), now});
		} else {
			it->why = why;
			it->at = now;
		}
	}
	logger("donor-cert")->warn("donor {} refused (donor-ca=): {}; it is not used", dialled,
				   why);
}

std::string DonorVerifier::check(const DonorCert &cert, std::string_view dialled)
{
	const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
				    std::chrono::system_clock::now().time_since_epoch())
				    .count();
	if (std::string why = cert_problem(cert, ca_, now); !why.empty())
		return why;
	{
		std::lock_guard lock(mu_);
		refresh_crl();
		if (crl_ && crl_->revoked(cert.serial))
			return "certificate revoked (serial " + std::to_string(cert.serial) +
			       " is in " + crl_path_ + ")";
	}
	if (!cert.lists(dialled))
		return "certificate is for " + cert.address_list() + ", not for " +
		       std::string(dialled) + " (the address dialled)";
	return {};
}

} // namespace rdmaswap
