// SPDX-License-Identifier: MIT
// rdmaswapctl ca create, donor-key create, cert issue|show|list|revoke, crl create|show: the
// operator's CA and the donor certificates it signs (common/wire/donor_cert.h).
#include "tools/rdmaswapctl_cert.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/encoding.h"
#include "common/util/err_text.h"
#include "common/wire/auth.h"
#include "common/wire/donor_cert.h"

namespace rdmaswap {
namespace {

int cert_usage()
{
	std::fprintf(stderr,
		     "usage: rdmaswapctl ca create FILE            (FILE: CA key, 0600; FILE.pub)\n"
		     "       rdmaswapctl donor-key create FILE     (FILE: donor key; FILE.pub)\n"
		     "       rdmaswapctl cert issue ca-key=FILE donor-key=FILE name=NAME "
		     "addresses=IP[:PORT][,...] days=N [out=FILE]\n"
		     "       rdmaswapctl cert show FILE [ca=CA.pub] [crl=FILE]\n"
		     "       rdmaswapctl cert list ca-key=FILE [crl=FILE]\n"
		     "       rdmaswapctl cert revoke ca-key=FILE serial=N crl=FILE\n"
		     "       rdmaswapctl crl create ca-key=FILE crl=FILE\n"
		     "       rdmaswapctl crl show FILE [ca=CA.pub]\n");
	return 2;
}

int64_t now_s()
{
	return std::chrono::duration_cast<std::chrono::seconds>(
		       std::chrono::system_clock::now().time_since_epoch())
		.count();
}

std::string utc(int64_t t)
{
	const time_t tt = time_t(t);
	std::tm tm{};
	char buf[32] = "?";
	if (gmtime_r(&tt, &tm))
		std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
	return buf;
}

// key=value arguments from argv[from..]; throws std::invalid_argument for an unknown or
// repeated key.
std::map<std::string, std::string> args(int argc, char **argv, int from,
					std::initializer_list<const char *> allowed)
{
	std::map<std::string, std::string> out;
	for (int i = from; i < argc; i++) {
		const std::string a = argv[i];
		const size_t eq = a.find('=');
		const std::string k = a.substr(0, eq);
		bool ok = eq != std::string::npos;
		if (ok) {
			ok = false;
			for (const char *x : allowed)
				ok = ok || k == x;
		}
		if (!ok)
			throw std::invalid_argument("unknown argument '" + a + "'");
		if (!out.emplace(k, a.substr(eq + 1)).second)
			throw std::invalid_argument(k + "= given twice");
	}
	return out;
}

const std::string &need(const std::map<std::string, std::string> &a, const char *k)
{
	const auto it = a.find(k);
	if (it == a.end() || it->second.empty())
		throw std::invalid_argument(std::string(k) + "= is required");
	return it->second;
}

uint64_t parse_u64(const std::string &s, const char *what)
{
	size_t pos = 0;
	unsigned long long v = 0;
	try {
		v = std::stoull(s, &pos, 10);
	} catch (const std::exception &) {
		pos = 0;
	}
	if (pos == 0 || pos != s.size() || s[0] == '-')
		throw std::invalid_argument(std::string(what) + "=" + s + ": not a number");
	return v;
}

void print_cert(const DonorCert &c)
{
	std::printf("name=%s\nserial=%llu\nnot_before=%s\nnot_after=%s\ndonor_key=%s\nca_key=%s\n",
		    c.name.c_str(), static_cast<unsigned long long>(c.serial),
		    utc(c.not_before).c_str(), utc(c.not_after).c_str(), hex(c.donor).c_str(),
		    hex(c.ca).c_str());
	for (const auto &a : c.addresses)
		std::printf("address=%s\n", a.c_str());
}

RevocationList read_crl(const std::string &path, const PublicKey *ca)
{
	const auto b = read_cert_file(path, 16 + 32 + 8 + 4 + kMaxRevoked * 8 + 64,
				      "revocation list");
	std::string err;
	auto l = parse_crl(b, err);
	if (!l)
		throw std::runtime_error("revocation list file " + path + ": " + err);
	if (ca)
		if (std::string why = crl_problem(*l, *ca); !why.empty())
			throw std::runtime_error("revocation list file " + path + ": " + why);
	return *l;
}

// The CA's issue log, FILE.issued beside its key FILE: one line per certificate `cert issue`
// made, "serial name not_after hex(certificate)", appended (O_APPEND: a line is one write).
std::string issue_log(const std::string &ca_key)
{
	return ca_key + ".issued";
}

void log_issued(const std::string &ca_key, const DonorCert &c)
{
	const std::string path = issue_log(ca_key);
	const std::string line = std::to_string(c.serial) + " " + c.name + " " + utc(c.not_after) +
				 " " + hex(c.encode()) + "\n";
	const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
			      0600);
	if (fd < 0)
		throw std::runtime_error("issue log " + path + ": " + err_text(errno));
	const ssize_t n = ::write(fd, line.data(), line.size());
	const int e = errno;
	::close(fd);
	if (n != ssize_t(line.size()))
		throw std::runtime_error("issue log " + path + ": " +
					 (n < 0 ? err_text(e) : "short write"));
}

int key_create(int argc, char **argv, const char *kind)
{
	if (argc != 4 || std::strcmp(argv[2], "create") != 0)
		return cert_usage();
	const std::string path = argv[3], pub = path + ".pub";
	const auto key = SigningKey::create(path, pub);
	std::printf("%s key: %s (secret, mode 0600)\npublic key: %s\n%s", kind, path.c_str(),
		    pub.c_str(), public_key_text(key->public_key()).c_str());
	return 0;
}

int cert_issue(int argc, char **argv)
{
	const auto a = args(argc, argv, 3,
			    {"ca-key", "donor-key", "name", "addresses", "days", "out", "serial"});
	const auto ca = SigningKey::load(need(a, "ca-key"), "CA key");
	const PublicKey donor = read_public_or_secret_key(need(a, "donor-key"));
	const std::string &name = need(a, "name");
	std::vector<std::string> addrs;
	const std::string &list = need(a, "addresses");
	for (size_t p = 0; p <= list.size();) {
		const size_t c = std::min(list.find(',', p), list.size());
		addrs.push_back(list.substr(p, c - p));
		p = c + 1;
	}
	const uint64_t days = parse_u64(need(a, "days"), "days");
	if (days == 0 || days > 36500)
		throw std::invalid_argument("days= between 1 and 36500");
	uint64_t serial = 0;
	if (a.count("serial")) {
		serial = parse_u64(a.at("serial"), "serial");
	} else {
		std::array<std::byte, 8> r{};
		random_bytes(r);
		for (auto b : r)
			serial = serial << 8 | uint64_t(b);
		serial >>= 1; // positive in any signed reading
	}
	const int64_t now = now_s();
	// Valid from a minute ago: a plugin whose clock is a little behind accepts it at once.
	const DonorCert c = issue_cert(*ca, donor, name, addrs, now - 60,
				       now + int64_t(days) * 86400, serial);
	const std::string out = a.count("out") ? a.at("out") : name + ".cert";
	log_issued(need(a, "ca-key"), c); // (first: a certificate out there is always listed)
	write_cert_file(out, c.encode(), 0644);
	std::printf("certificate: %s\n", out.c_str());
	print_cert(c);
	return 0;
}

int cert_show(int argc, char **argv)
{
	if (argc < 4)
		return cert_usage();
	const std::string path = argv[3];
	const auto a = args(argc, argv, 4, {"ca", "crl"});
	const auto b = read_cert_file(path, kMaxCertSize, "donor certificate");
	std::string err;
	const auto c = parse_cert(b, err);
	if (!c) {
		std::fprintf(stderr, "rdmaswapctl: %s: not a donor certificate: %s\n", path.c_str(),
			     err.c_str());
		return 1;
	}
	print_cert(*c);
	if (!a.count("ca"))
		return 0;
	const PublicKey ca = read_public_key(a.at("ca"));
	std::string why = cert_problem(*c, ca, now_s());
	if (why.empty() && a.count("crl")) {
		const auto l = read_crl(a.at("crl"), &ca);
		if (l.revoked(c->serial))
			why = "revoked";
	}
	std::printf("valid=%s\n", why.empty() ? "yes" : ("no (" + why + ")").c_str());
	return why.empty() ? 0 : 1;
}

// Every certificate in the CA's issue log, one line each: serial, name, addresses, expiry and
// its state now (valid, expired, revoked, or why the CA does not vouch for it).
int cert_list(int argc, char **argv)
{
	const auto a = args(argc, argv, 3, {"ca-key", "crl"});
	const std::string &key = need(a, "ca-key");
	const PublicKey ca = read_public_key(key + ".pub");
	std::optional<RevocationList> crl;
	if (a.count("crl"))
		crl = read_crl(a.at("crl"), &ca);
	std::ifstream in(issue_log(key));
	if (!in)
		throw std::runtime_error("issue log " + issue_log(key) +
					 ": cannot be read (no certificate issued with this CA key?)");
	const int64_t now = now_s();
	std::string line;
	size_t n = 0, bad = 0;
	while (std::getline(in, line)) {
		const size_t sp = line.rfind(' ');
		const auto bytes = unhex(sp == std::string::npos ? "" : std::string_view(line).substr(sp + 1));
		std::string err;
		const auto c = bytes ? parse_cert(*bytes, err) : std::nullopt;
		if (!c) {
			bad++;
			continue;
		}
		std::string state = cert_problem(*c, ca, now);
		if (state.empty())
			state = crl && crl->revoked(c->serial) ? "revoked" : "valid";
		std::printf("serial=%llu name=%s addresses=%s not_after=%s state=%s\n",
			    static_cast<unsigned long long>(c->serial), c->name.c_str(),
			    c->address_list().c_str(),
			    utc(c->not_after).c_str(), state.c_str());
		n++;
	}
	if (bad)
		std::fprintf(stderr, "rdmaswapctl: %zu unreadable lines in %s\n", bad,
			     issue_log(key).c_str());
	std::printf("%zu certificates%s\n", n, crl ? "" : " (no crl=: revocations not shown)");
	return bad ? 1 : 0;
}

int cert_revoke(int argc, char **argv)
{
	const auto a = args(argc, argv, 3, {"ca-key", "serial", "crl"});
	const auto ca = SigningKey::load(need(a, "ca-key"), "CA key");
	const uint64_t serial = parse_u64(need(a, "serial"), "serial");
	const std::string &path = need(a, "crl");
	RevocationList l;
	struct stat st {};
	if (::lstat(path.c_str(), &st) == 0)
		l = read_crl(path, &ca->public_key());
	const bool had = l.revoked(serial);
	l.serials.push_back(serial);
	// Strictly newer than the list it replaces: plugins refuse an older list (a rollback).
	l.issued = std::max(now_s(), l.issued + 1);
	sign_crl(*ca, l);
	write_cert_file(path, l.encode(), 0644);
	std::printf("%s serial %llu in %s (%zu revoked)\n", had ? "already revoked:" : "revoked:",
		    static_cast<unsigned long long>(serial), path.c_str(), l.serials.size());
	return 0;
}

int crl_create(int argc, char **argv)
{
	const auto a = args(argc, argv, 3, {"ca-key", "crl"});
	const auto ca = SigningKey::load(need(a, "ca-key"), "CA key");
	const std::string &path = need(a, "crl");
	struct stat st {};
	if (::lstat(path.c_str(), &st) == 0)
		throw std::runtime_error(path + ": exists already (not overwritten)");
	RevocationList l;
	l.issued = now_s();
	sign_crl(*ca, l);
	write_cert_file(path, l.encode(), 0644);
	std::printf("revocation list: %s (empty)\n", path.c_str());
	return 0;
}

int crl_show(int argc, char **argv)
{
	if (argc < 4)
		return cert_usage();
	const auto a = args(argc, argv, 4, {"ca"});
	std::optional<PublicKey> ca;
	if (a.count("ca"))
		ca = read_public_key(a.at("ca"));
	const auto l = read_crl(argv[3], ca ? &*ca : nullptr);
	std::printf("ca_key=%s\nissued=%s\n", hex(l.ca).c_str(), utc(l.issued).c_str());
	for (uint64_t s : l.serials)
		std::printf("revoked=%llu\n", static_cast<unsigned long long>(s));
	if (ca)
		std::printf("valid=yes\n");
	return 0;
}

} // namespace

bool is_cert_command(const char *cmd)
{
	return std::strcmp(cmd, "ca") == 0 || std::strcmp(cmd, "donor-key") == 0 ||
	       std::strcmp(cmd, "cert") == 0 || std::strcmp(cmd, "crl") == 0;
}

int cert_command(int argc, char **argv)
{
	if (argc < 3)
		return cert_usage();
	const std::string cmd = argv[1], sub = argv[2];
	try {
		if (cmd == "ca")
			return key_create(argc, argv, "CA");
		if (cmd == "donor-key")
			return key_create(argc, argv, "donor");
		if (cmd == "cert" && sub == "issue")
			return cert_issue(argc, argv);
		if (cmd == "cert" && sub == "show")
			return cert_show(argc, argv);
		if (cmd == "cert" && sub == "list")
			return cert_list(argc, argv);
		if (cmd == "cert" && sub == "revoke")
			return cert_revoke(argc, argv);
		if (cmd == "crl" && sub == "create")
			return crl_create(argc, argv);
		if (cmd == "crl" && sub == "show")
			return crl_show(argc, argv);
	} catch (const std::invalid_argument &e) {
		std::fprintf(stderr, "rdmaswapctl %s %s: %s\n", cmd.c_str(), sub.c_str(), e.what());
		return 2;
	} catch (const std::exception &e) {
		std::fprintf(stderr, "rdmaswapctl %s %s: %s\n", cmd.c_str(), sub.c_str(), e.what());
		return 1;
	}
	return cert_usage();
}

} // namespace rdmaswap
