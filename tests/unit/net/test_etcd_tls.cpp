// SPDX-License-Identifier: MIT
// Unit tests for etcd over TLS with credentials (no server): the etcd-* keys and their
// validation (common/util/config.h), the files etcd::Credentials reads and refuses, and the
// authentication replies and token rejections of etcd 3.4's gateway (common/net/etcd.h).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "common/net/etcd.h"
#include "common/util/config.h"

using namespace rdmaswap;
using namespace std::chrono_literals;

namespace {

// A temporary directory, removed with what it holds.
struct TempDir {
	std::string path;
	TempDir()
	{
		char tmpl[] = "/tmp/rdmaswap-etcd-tls-XXXXXX";
		REQUIRE(mkdtemp(tmpl));
		path = tmpl;
	}
	~TempDir() { std::filesystem::remove_all(path); }
	std::string file(const std::string &name, const std::string &text, mode_t mode = 0600) const
	{
		const std::string p = path + "/" + name;
		{
			std::ofstream f(p, std::ios::binary);
			f << text;
		}
		REQUIRE(chmod(p.c_str(), mode) == 0);
		return p;
	}
};

// A fresh Ed25519 key and a self-signed certificate of it, both PEM.
struct KeyCert {
	std::string key_pem, cert_pem;
};
KeyCert make_key_cert()
{
	EVP_PKEY *key = nullptr;
	EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
	REQUIRE(ctx);
	REQUIRE(EVP_PKEY_keygen_init(ctx) == 1);
	REQUIRE(EVP_PKEY_keygen(ctx, &key) == 1);
	EVP_PKEY_CTX_free(ctx);
	X509 *x = X509_new();
	REQUIRE(x);
	X509_set_version(x, 2);
	ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
	X509_gmtime_adj(X509_getm_notBefore(x), 0);
	X509_gmtime_adj(X509_getm_notAfter(x), 3600);
	X509_set_pubkey(x, key);
	X509_NAME *name = X509_get_subject_name(x);
	X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
				   reinterpret_cast<const unsigned char *>("rdmaswap"), -1, -1, 0);
	X509_set_issuer_name(x, name);
	REQUIRE(X509_sign(x, key, nullptr) > 0);
	auto pem = [](auto write) {
		BIO *b = BIO_new(BIO_s_mem());
		write(b);
		char *data = nullptr;
		const long n = BIO_get_mem_data(b, &data);
		std::string out(data, size_t(n));
		BIO_free(b);
		return out;
	};
	KeyCert kc;
	kc.key_pem = pem([&](BIO *b) {
		PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr);
	});
	kc.cert_pem = pem([&](BIO *b) { PEM_write_bio_X509(b, x); });
	X509_free(x);
	EVP_PKEY_free(key);
	return kc;
}

// The message Credentials throws for `s` ("" if it loads).
std::string load_error(const EtcdSecurity &s)
{
	try {
		etcd::Credentials c(s);
		return "";
	} catch (const std::runtime_error &e) {
		return e.what();
	}
}

bool has(const std::string &text, const std::string &part)
{
	return text.find(part) != std::string::npos;
}

const std::vector<std::string> kHttps{"https://127.0.0.1:2379", "https://[::1]:2379"};

} // namespace

TEST_CASE("etcd tls: the etcd-* keys set their fields; an empty value is an error", "[etcd][tls]")
{
	EtcdSecurity s;
	std::string why;
	CHECK(set_etcd_security_key(s, "etcd-cacert", "/ca.pem", why));
	CHECK(why.empty());
	CHECK(set_etcd_security_key(s, "etcd-cert", "/c.pem", why));
	CHECK(set_etcd_security_key(s, "etcd-key", "/k.pem", why));
	CHECK(set_etcd_security_key(s, "etcd-user", "compute", why));
	CHECK(set_etcd_security_key(s, "etcd-password-file", "/pw", why));
	CHECK(s.cacert == "/ca.pem");
	CHECK(s.cert == "/c.pem");
	CHECK(s.key == "/k.pem");
	CHECK(s.user == "compute");
	CHECK(s.password_file == "/pw");
	CHECK(s.tls());
	CHECK(set_etcd_security_key(s, "etcd-user", "", why));
	CHECK(why == "etcd-user= must not be empty");
	CHECK(s.user == "compute"); // unchanged
	CHECK_FALSE(set_etcd_security_key(s, "etcd", "https://h:1", why));
	CHECK_FALSE(set_etcd_security_key(s, "etcd-prefix", "/x/", why));
	CHECK_FALSE(set_etcd_security_key(s, "etcd-password", "secret", why)); // never a value
	CHECK_FALSE(EtcdSecurity{}.any());
}

TEST_CASE("etcd tls: validation of the keys together and with the endpoints", "[etcd][tls]")
{
	const std::vector<std::string> http{"http://127.0.0.1:2379"};
	const std::vector<std::string> mixed{"https://127.0.0.1:2379", "http://127.0.0.2:2379"};
	// None: fine with any endpoints, or none.
	CHECK(check_etcd_security({}, http, "") == "");
	CHECK(check_etcd_security({}, {}, "") == "");
	// Cert and key go together; user and password file go together.
	CHECK(check_etcd_security({.cert = "c"}, kHttps, "") ==
	      "etcd-cert= needs etcd-key= as well: the client certificate and its private key go "
	      "together");
	CHECK(has(check_etcd_security({.key = "k"}, kHttps, "--"),
		  "--etcd-key needs --etcd-cert as well"));
	CHECK(has(check_etcd_security({.user = "u"}, kHttps, ""),
		  "etcd-user= needs etcd-password-file= as well"));
	CHECK(has(check_etcd_security({.password_file = "p"}, kHttps, "--"),
		  "--etcd-password-file needs --etcd-user as well"));
	// TLS options or a password with an http:// endpoint: refused, naming it.
	CHECK(check_etcd_security({.cacert = "ca"}, http, "") ==
	      "etcd-cacert= needs https:// etcd endpoints, not http://127.0.0.1:2379 (TLS options "
	      "apply to https:// only)");
	CHECK(has(check_etcd_security({.cert = "c", .key = "k"}, mixed, "--"),
		  "--etcd-cert needs https:// etcd endpoints, not http://127.0.0.2:2379"));
	CHECK(has(check_etcd_security({.user = "u", .password_file = "p"}, http, ""),
		  "etcd-user= needs https:// etcd endpoints, not http://127.0.0.1:2379 (a password "
		  "is never sent in clear)"));
	// Without etcd at all.
	CHECK(check_etcd_security({.cacert = "ca"}, {}, "") == "etcd-cacert= needs etcd=");
	CHECK(check_etcd_security({.user = "u", .password_file = "p"}, {}, "--") ==
	      "--etcd-user needs --etcd");
	// Accepted: each alone or all together with https://.
	CHECK(check_etcd_security({.cacert = "ca"}, kHttps, "") == "");
	CHECK(check_etcd_security({.cert = "c", .key = "k"}, kHttps, "") == "");
	CHECK(check_etcd_security({.user = "u", .password_file = "p"}, kHttps, "") == "");
	CHECK(check_etcd_security({"ca", "c", "k", "u", "p"}, kHttps, "") == "");
}

TEST_CASE("etcd tls: Credentials reads the files once and checks them", "[etcd][tls]")
{
	TempDir d;
	const KeyCert kc = make_key_cert(), other = make_key_cert();
	const std::string ca = d.file("ca.pem", kc.cert_pem, 0644);
	const std::string cert = d.file("client.pem", kc.cert_pem, 0644);
	const std::string key = d.file("client.key", kc.key_pem);
	const std::string pw = d.file("pw", "s3cret pass\n");

	etcd::Credentials c({ca, cert, key, "compute", pw});
	CHECK(c.cacert_pem() == kc.cert_pem);
	CHECK(c.cert_pem() == kc.cert_pem);
	CHECK(c.key_pem() == kc.key_pem);
	CHECK(c.user() == "compute");
	CHECK(c.password() == "s3cret pass"); // the line break stripped, the space kept
	CHECK(c.token().empty());
	c.set_token("tok");
	CHECK(c.token() == "tok");
	// Read at construction: the files may go afterwards.
	std::filesystem::remove(pw);
	CHECK(c.password() == "s3cret pass");

	// Each alone.
	CHECK(load_error({.cacert = ca}) == "");
	CHECK(load_error({.cert = cert, .key = key}) == "");
	CHECK(load_error({.user = "u", .password_file = d.file("pw2", "x")}) == "");

	// A file that cannot be read: an error naming the key and the file.
	CHECK(load_error({.cacert = d.path + "/none.pem"}) ==
	      "etcd-cacert file " + d.path + "/none.pem: No such file or directory");
	CHECK(has(load_error({.cert = cert, .key = d.path + "/none.key"}),
		  "etcd-key file " + d.path + "/none.key: No such file or directory"));
	CHECK(has(load_error({.cacert = d.path}), "etcd-cacert file " + d.path +
							  ": not a regular file (a directory)"));
	// Not PEM; a key that is not the certificate's.
	CHECK(has(load_error({.cacert = d.file("junk.pem", "junk", 0644)}),
		  "junk.pem: no PEM certificate in it"));
	CHECK(has(load_error({.cert = d.file("junk2.pem", "junk", 0644), .key = key}),
		  "etcd-cert file " + d.path + "/junk2.pem: no PEM certificate in it"));
	CHECK(has(load_error({.cert = cert, .key = d.file("junk.key", "junk")}),
		  "etcd-key file " + d.path + "/junk.key: no unencrypted PEM private key in it"));
	CHECK(has(load_error({.cert = cert, .key = d.file("other.key", other.key_pem)}),
		  "other.key: not the private key of the certificate in " + cert));
	// A public file may be a symbolic link (/etc/ssl/certs); a secret may not.
	const std::string ca_link = d.path + "/ca-link.pem";
	REQUIRE(symlink(ca.c_str(), ca_link.c_str()) == 0);
	CHECK(load_error({.cacert = ca_link}) == "");
	const std::string key_link = d.path + "/key-link";
	REQUIRE(symlink(key.c_str(), key_link.c_str()) == 0);
	CHECK(has(load_error({.cert = cert, .key = key_link}),
		  "etcd-key file " + key_link + ": is a symbolic link"));
}

TEST_CASE("etcd tls: the key and the password file follow the key-file rules", "[etcd][tls]")
{
	TempDir d;
	const KeyCert kc = make_key_cert();
	const std::string cert = d.file("client.pem", kc.cert_pem, 0644);
	auto pw_error = [&](const std::string &path) {
		return load_error({.user = "u", .password_file = path});
	};
	// Open to the group or others: refused, saying the mode.
	CHECK(has(pw_error(d.file("pw-0640", "x\n", 0640)), "mode 0640"));
	CHECK(has(pw_error(d.file("pw-0604", "x\n", 0604)), "etcd-password-file file " + d.path +
								      "/pw-0604: "));
	CHECK(has(load_error({.cert = cert, .key = d.file("k-0644", kc.key_pem, 0644)}),
		  "etcd-key file " + d.path + "/k-0644: "));
	CHECK(pw_error(d.file("pw-0400", "x\n", 0400)) == "");
	// Empty, or more than one line.
	CHECK(has(pw_error(d.file("pw-empty", "\n")), "pw-empty: empty"));
	CHECK(has(pw_error(d.file("pw-two", "a\nb\n")), "pw-two: more than one line"));
	// A symbolic link to a good file: refused.
	const std::string good = d.file("pw-good", "x\n");
	const std::string link = d.path + "/pw-link";
	REQUIRE(symlink(good.c_str(), link.c_str()) == 0);
	CHECK(has(pw_error(link), "is a symbolic link"));
	// A FIFO is refused at once, not waited on.
	const std::string fifo = d.path + "/pw-fifo";
	REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
	auto result = std::async(std::launch::async, [&] { return pw_error(fifo); });
	const bool done = result.wait_for(5s) == std::future_status::ready;
	if (!done) { // let a blocked open return, so that the test ends
		const int w = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
		if (w >= 0)
			close(w);
	}
	CHECK(done);
	CHECK(has(result.get(), "not a regular file (a FIFO)"));
}

TEST_CASE("etcd tls: authenticate's body and replies, and the token rejections", "[etcd][tls]")
{
	CHECK(nlohmann::json::parse(etcd::authenticate_body("donor-A", "p\"w")) ==
	      nlohmann::json{{"name", "donor-A"}, {"password", "p\"w"}});
	// etcd 3.4's replies (recorded from the gateway).
	auto ok = etcd::parse_authenticate(
		R"({"header":{"cluster_id":"1","member_id":"2","revision":"1","raft_term":"2"},)"
		R"("token":"vIAvqMcGwYirxHNX.18"})");
	REQUIRE(ok);
	CHECK(*ok.value == "vIAvqMcGwYirxHNX.18");
	auto bad = etcd::parse_authenticate(
		R"({"error":"etcdserver: authentication failed, invalid user ID or password",)"
		R"("message":"etcdserver: authentication failed, invalid user ID or password","code":3})");
	CHECK_FALSE(bad);
	CHECK(bad.error == "etcd: etcdserver: authentication failed, invalid user ID or password");
	CHECK(bad.code == 3);
	CHECK_FALSE(etcd::parse_authenticate(R"({"header":{}})"));
	CHECK_FALSE(etcd::parse_authenticate(R"({"token":""})"));
	CHECK_FALSE(etcd::parse_authenticate(R"({"token":"a\r\nX-Evil: 1"})"));
	// A malformed reply is never quoted (it may hold a token).
	auto junk = etcd::parse_authenticate("token=secret-token");
	CHECK_FALSE(junk);
	CHECK_FALSE(has(junk.error, "secret-token"));

	CHECK(etcd::token_rejected(16, "etcdserver: invalid auth token"));
	CHECK(etcd::token_rejected(3, "etcdserver: revision of auth store is old"));
	CHECK(etcd::token_rejected(
		0, "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"));
	CHECK(etcd::token_rejected(0, "rpc error: code = InvalidArgument desc = etcdserver: "
				      "revision of auth store is old"));
	CHECK_FALSE(etcd::token_rejected(7, "etcdserver: permission denied"));
	CHECK_FALSE(etcd::token_rejected(3, "etcdserver: user name is empty"));
	CHECK_FALSE(etcd::token_rejected(5, "etcdserver: requested lease not found"));
}

TEST_CASE("etcd tls: a client with credentials fails within its bound when nobody answers",
	  "[etcd][tls]")
{
	TempDir d;
	const KeyCert kc = make_key_cert();
	auto creds = std::make_shared<const etcd::Credentials>(
		EtcdSecurity{d.file("ca.pem", kc.cert_pem, 0644), "", "", "u", d.file("pw", "x")});
	// A port nobody listens on (bound, never listened).
	const int s = ::socket(AF_INET, SOCK_STREAM, 0);
	REQUIRE(s >= 0);
	sockaddr_in a{};
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	REQUIRE(bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
	socklen_t len = sizeof a;
	REQUIRE(getsockname(s, reinterpret_cast<sockaddr *>(&a), &len) == 0);
	etcd::Client client({{"https://127.0.0.1:" + std::to_string(ntohs(a.sin_port))},
			     500ms,
			     500ms,
			     creds});
	const auto t0 = std::chrono::steady_clock::now();
	auto r = client.get("/x", t0 + 2s);
	CHECK_FALSE(r);
	CHECK(has(r.error, "authenticating as etcd user u"));
	CHECK(std::chrono::steady_clock::now() - t0 < 2s);
	CHECK(creds->token().empty());
	::close(s);
}
