// SPDX-License-Identifier: MIT
// Unit tests for common/wire/donor_cert: the certificate and revocation list encodings (strict
// parsing, every flipped byte refused), signing, expiry, revocation, address binding, key files,
// and the DONOR_PROOF handshake against an in-process memserver (certified, uncertified, for
// another address, with another key, revoked while the verifier lives).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "common/obs/log.h"
#include "common/transport/control_client.h"
#include "common/wire/auth.h"
#include "common/wire/donor_cert.h"
#include "common/wire/protocol.h"
#include "tests/support/key_helpers.h"
#include "memserver/server.h"

using namespace rdmaswap;
using namespace std::chrono_literals;
using rdmaswap::test::now_s;
using rdmaswap::test::secret;

namespace {

struct TmpDir {
	TmpDir()
	{
		std::string t = (std::filesystem::temp_directory_path() / "donor-cert-XXXXXX").string();
		REQUIRE(::mkdtemp(t.data()));
		path = t;
	}
	~TmpDir() { std::filesystem::remove_all(path); }
	std::string operator/(const std::string &f) const { return path + "/" + f; }
	std::string path;
};

const SigningKey &ca_key()
{
	static const SigningKey k(*secret("the operator's CA secret, 32 bytes"));
	return k;
}
const SigningKey &donor_key()
{
	static const SigningKey k(*secret("a donor's signing secret, 32 bytes"));
	return k;
}

DonorCert make_cert(std::vector<std::string> addrs = {"127.0.0.1:7471"}, int64_t from = -60,
		    int64_t to = 86400, uint64_t serial = 42)
{
	const int64_t now = now_s();
	return issue_cert(ca_key(), donor_key().public_key(), "donor-1", addrs, now + from,
			  now + to, serial);
}

} // namespace

TEST_CASE("donor cert: encode, parse, verify", "[donorcert]")
{
	const DonorCert c = make_cert({"127.0.0.1:7000", "10.0.0.5", "[::1]:7001", "[0:0::2]"});
	CHECK(c.addresses == std::vector<std::string>{"127.0.0.1:7000", "10.0.0.5:7471",
						      "[::1]:7001", "[::2]:7471"});
	const auto b = c.encode();
	CHECK(b.size() <= kMaxCertSize);
	std::string err;
	const auto p = parse_cert(b, err);
	REQUIRE(p);
	CHECK(p->encode() == b);
	CHECK(p->name == "donor-1");
	CHECK(p->serial == 42);
	CHECK(p->donor == donor_key().public_key());
	CHECK(cert_problem(*p, ca_key().public_key(), now_s()) == "");

	// Another CA's key: refused, whichever way it is presented.
	const SigningKey other(*secret("another would-be CA's secret!!!!"));
	CHECK(cert_problem(*p, other.public_key(), now_s()).find("another CA") != std::string::npos);
	DonorCert forged = *p;
	forged.ca = other.public_key();
	forged.signature = other.sign(forged.signed_part()); // (not even the right label)
	CHECK(!cert_problem(forged, other.public_key(), now_s()).empty());
	const DonorCert by_other = issue_cert(other, donor_key().public_key(), "x",
					      std::vector<std::string>{"127.0.0.1"}, 0, now_s() + 99, 1);
	CHECK(cert_problem(by_other, ca_key().public_key(), now_s()) != "");
	CHECK(cert_problem(by_other, other.public_key(), now_s()) == "");
}

TEST_CASE("donor cert: flipping any byte is refused", "[donorcert]")
{
	const DonorCert c = make_cert({"127.0.0.1:7000", "[::1]:7001"});
	const auto b = c.encode();
	for (size_t i = 0; i < b.size(); i++) {
		for (uint8_t mask : {uint8_t(0x01), uint8_t(0x80)}) {
			auto t = b;
			t[i] ^= std::byte(mask);
			std::string err;
			const auto p = parse_cert(t, err);
			// Either it no longer parses, or its signature no longer holds.
			const bool refused = !p || !cert_problem(*p, ca_key().public_key(), now_s()).empty();
			INFO("byte " << i << " mask " << unsigned(mask));
			CHECK(refused);
		}
	}
	// Truncated at every length, and with a byte appended: never parses.
	for (size_t n = 0; n < b.size(); n++) {
		std::string err;
		CHECK(!parse_cert(std::span(b).first(n), err));
	}
	auto longer = b;
	longer.push_back(std::byte(0));
	std::string err;
	CHECK(!parse_cert(longer, err));
	CHECK(err == "trailing bytes after the signature");
}

TEST_CASE("donor cert: bad inputs to issue and parse", "[donorcert]")
{
	const auto pub = donor_key().public_key();
	const std::vector<std::string> ok{"127.0.0.1"};
	CHECK_THROWS_AS(issue_cert(ca_key(), pub, "", ok, 0, 10, 1), std::invalid_argument);
	CHECK_THROWS_AS(issue_cert(ca_key(), pub, "a b", ok, 0, 10, 1), std::invalid_argument);
	CHECK_THROWS_AS(issue_cert(ca_key(), pub, std::string(65, 'x'), ok, 0, 10, 1),
			std::invalid_argument);
	CHECK_THROWS_AS(issue_cert(ca_key(), pub, "n", std::vector<std::string>{}, 0, 10, 1),
			std::invalid_argument);
	CHECK_THROWS_AS(issue_cert(ca_key(), pub, "n", std::vector<std::string>{"donor.example"},
				   0, 10, 1),
			std::invalid_argument);
	CHECK_THROWS_AS(issue_cert(ca_key(), pub, "n", std::vector<std::string>(17, "10.0.0.1"),
				   0, 10, 1),
			std::invalid_argument);
	CHECK_THROWS_AS(issue_cert(ca_key(), pub, "n", ok, 10, 10, 1), std::invalid_argument);
	CHECK(canonical_cert_address("1.2.3.4:80") == "1.2.3.4:80");
	CHECK(canonical_cert_address("[::ffff:1.2.3.4]:80") == "[::ffff:1.2.3.4]:80");
	CHECK(!canonical_cert_address("1.2.3.4:0"));
	CHECK(!canonical_cert_address("1.2.3:80"));
	std::string err;
	CHECK(!parse_cert({}, err));
	const std::vector<std::byte> junk(kMaxCertSize + 1, std::byte('R'));
	CHECK(!parse_cert(junk, err));
}

TEST_CASE("donor cert: validity period", "[donorcert]")
{
	const int64_t now = now_s();
	const DonorCert future = make_cert({"127.0.0.1"}, 3600, 7200);
	CHECK(cert_problem(future, ca_key().public_key(), now).find("not valid yet") !=
	      std::string::npos);
	const DonorCert expired = make_cert({"127.0.0.1"}, -7200, -1);
	CHECK(cert_problem(expired, ca_key().public_key(), now).find("expired") !=
	      std::string::npos);
	const DonorCert c = make_cert();
	CHECK(cert_problem(c, ca_key().public_key(), c.not_after - 1) == "");
	CHECK(cert_problem(c, ca_key().public_key(), c.not_after) != "");
}

TEST_CASE("donor cert: reusable donor signatures", "[donorcert]")
{
	const DonorCert c = make_cert();
	const std::string msg = "rdmaswap-test-label-v1 registration bytes";
	const auto m = std::as_bytes(std::span(msg.data(), msg.size()));
	const Signature sig = donor_sign(donor_key(), m);
	CHECK(verify_donor_signature(c, m, sig));
	Signature bad = sig;
	bad[3] ^= std::byte(1);
	CHECK(!verify_donor_signature(c, m, bad));
	const SigningKey other(*secret("not the certified donor's secret"));
	CHECK(!verify_donor_signature(c, m, donor_sign(other, m)));
	// The proof message binds both nonces and the address.
	Nonce a{}, b{};
	b[0] = std::byte(1);
	CHECK(donor_proof_message(a, b, "1.2.3.4:5") != donor_proof_message(b, a, "1.2.3.4:5"));
	CHECK(donor_proof_message(a, b, "1.2.3.4:5") != donor_proof_message(a, b, "1.2.3.4:6"));
}

TEST_CASE("donor cert: revocation lists", "[donorcert]")
{
	RevocationList l;
	l.issued = 1000;
	l.serials = {9, 3, 3, 7};
	sign_crl(ca_key(), l);
	CHECK(l.serials == std::vector<uint64_t>{3, 7, 9});
	const auto b = l.encode();
	std::string err;
	const auto p = parse_crl(b, err);
	REQUIRE(p);
	CHECK(crl_problem(*p, ca_key().public_key()) == "");
	CHECK(p->revoked(7));
	CHECK(!p->revoked(8));
	for (size_t i = 0; i < b.size(); i++) {
		auto t = b;
		t[i] ^= std::byte(0x10);
		const auto q = parse_crl(t, err);
		INFO("byte " << i);
		CHECK((!q || !crl_problem(*q, ca_key().public_key()).empty()));
	}
	for (size_t n = 0; n < b.size(); n++)
		CHECK(!parse_crl(std::span(b).first(n), err));
	const SigningKey other(*secret("another would-be CA's secret!!!!"));
	RevocationList o = l;
	sign_crl(other, o);
	CHECK(!crl_problem(o, ca_key().public_key()).empty());
}

TEST_CASE("donor cert: key files and the verifier's list re-read", "[donorcert]")
{
	set_log_level("off");
	TmpDir d;
	const auto ca = SigningKey::create(d / "ca.key", d / "ca.pub");
	struct stat st {};
	REQUIRE(::stat((d / "ca.key").c_str(), &st) == 0);
	CHECK((st.st_mode & 0777) == 0600);
	CHECK(read_public_key(d / "ca.pub") == ca->public_key());
	CHECK(SigningKey::load(d / "ca.key", "CA key")->public_key() == ca->public_key());
	CHECK_THROWS(SigningKey::create(d / "ca.key", d / "other.pub")); // never overwritten
	CHECK_THROWS(read_public_key(d / "ca.key"));                     // a secret is not a pub
	CHECK(read_public_or_secret_key(d / "ca.key") == ca->public_key());

	const int64_t now = now_s();
	const DonorCert c = issue_cert(*ca, donor_key().public_key(), "d",
				       std::vector<std::string>{"127.0.0.1:7000"}, now - 1,
				       now + 100, 5);
	RevocationList l;
	l.issued = now;
	sign_crl(*ca, l);
	write_cert_file(d / "crl", l.encode(), 0644);
	DonorVerifier v(d / "ca.pub", d / "crl");
	CHECK(v.check(c, "127.0.0.1:7000") == "");
	CHECK(v.check(c, "127.0.0.1:7001").find("not for 127.0.0.1:7001") != std::string::npos);
	CHECK(v.check(c, "127.0.0.2:7000") != "");

	l.serials = {5};
	l.issued = now + 1;
	sign_crl(*ca, l);
	write_cert_file(d / "crl", l.encode(), 0644);
	CHECK(v.check(c, "127.0.0.1:7000").find("revoked") != std::string::npos);

	// An older list (a rollback) and junk are ignored: the revocation stays in force.
	RevocationList older;
	older.issued = now;
	sign_crl(*ca, older);
	write_cert_file(d / "crl", older.encode(), 0644);
	CHECK(v.check(c, "127.0.0.1:7000").find("revoked") != std::string::npos);
	const std::string junk = "junk";
	write_cert_file(d / "crl", std::as_bytes(std::span(junk.data(), junk.size())), 0644);
	CHECK(v.check(c, "127.0.0.1:7000").find("revoked") != std::string::npos);

	// A list that does not read at start is an error at start.
	CHECK_THROWS(DonorVerifier(d / "ca.pub", d / "crl"));
	CHECK_THROWS(DonorVerifier(d / "ca.pub", d / "missing"));
}

namespace {

// A free TCP port on 127.0.0.1 (bound, read, closed): the certificate must name the port
// before the memserver that uses it starts.
uint16_t free_port()
{
	Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
	sockaddr_in a{};
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
	socklen_t len = sizeof a;
	REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr *>(&a), &len) == 0);
	return ntohs(a.sin_port);
}

// A TCP memserver on 127.0.0.1:`port` with the given donor credentials, on its own thread.
struct CertServer {
	CertServer(uint16_t port, std::shared_ptr<const SigningKey> key, std::vector<std::byte> cert)
	{
		MemserverOptions o;
		o.listen = "127.0.0.1";
		o.port = port;
		o.capacity = 8ull << 20;
		o.slab_size = 1ull << 20;
		o.transport = TransportKind::Tcp;
		o.lock_memory = false;
		o.auth_keys.push_back(cluster);
		o.donor_key = std::move(key);
		o.donor_cert = std::move(cert);
		server = std::make_unique<Memserver>(o);
		thread = std::thread([this] { server->run(); });
	}
	~CertServer()
	{
		server->stop();
		thread.join();
	}
	SockAddr addr() const { return resolve(Endpoint{"127.0.0.1", server->port()}); }
	std::shared_ptr<const AuthKey> cluster = secret("the cluster key of this test!!");
	std::unique_ptr<Memserver> server;
	std::thread thread;
};

std::shared_ptr<const SigningKey> shared_donor()
{
	return std::make_shared<const SigningKey>(*secret("a donor's signing secret, 32 bytes"));
}

int connect_with(const CertServer &s, const std::shared_ptr<DonorVerifier> &v)
{
	const auto key = s.cluster->with_donor_check(v);
	int err = 0;
	Fd fd = connect_memserver(s.addr(), deadline_after(5s), key.get(), nullptr, err);
	CHECK(bool(fd) == (err == 0));
	return err;
}

} // namespace

TEST_CASE("donor cert: the handshake accepts only a certified donor", "[donorcert][memserver]")
{
	set_log_level("off");
	TmpDir d;
	RevocationList l;
	l.issued = now_s();
	sign_crl(ca_key(), l);
	write_cert_file(d / "crl", l.encode(), 0644);
	auto v = std::make_shared<DonorVerifier>(ca_key().public_key(), d / "crl");
	const uint16_t port = free_port();
	const std::string here = "127.0.0.1:" + std::to_string(port);

	SECTION("uncertified memserver (the compute host's attack): refused")
	{
		CertServer s(port, nullptr, {});
		CHECK(connect_with(s, v) == ENOKEY);
		// Without donor-ca= the same server is used (today's behaviour).
		int err = 0;
		CHECK(connect_memserver(s.addr(), deadline_after(5s), s.cluster.get(), nullptr, err));
	}
	SECTION("certified: accepted, a session works; revoked later: refused")
	{
		CertServer s(port, shared_donor(), make_cert({here}).encode());
		CHECK(connect_with(s, v) == 0);
		ControlClient cc(s.addr(), 5s, s.cluster->with_donor_check(v));
		proto::HelloReply hello;
		CHECK(cc.open_session(false, hello) == 0);
		l.serials = {42};
		l.issued += 1;
		sign_crl(ca_key(), l);
		write_cert_file(d / "crl", l.encode(), 0644);
		CHECK(connect_with(s, v) == ENOKEY);
	}
	SECTION("certified for another address: refused")
	{
		CertServer s(port, shared_donor(), make_cert({"127.0.0.1:1", "127.0.0.2:" +
							     std::to_string(port)}).encode());
		CHECK(connect_with(s, v) == ENOKEY);
	}
	SECTION("someone else's certificate (without its key): refused")
	{
		const auto thief = std::make_shared<const SigningKey>(
			*secret("a compute host's own secret!!!!!"));
		CertServer s(port, thief, make_cert({here}).encode());
		CHECK(connect_with(s, v) == ENOKEY);
	}
	SECTION("expired, or by another CA: refused")
	{
		CertServer s(port, shared_donor(), make_cert({here}, -7200, -10).encode());
		CHECK(connect_with(s, v) == ENOKEY);
		auto w = std::make_shared<DonorVerifier>(donor_key().public_key(), "");
		CertServer t(free_port(), shared_donor(), make_cert({here}).encode());
		CHECK(connect_with(t, w) == ENOKEY);
	}
}
