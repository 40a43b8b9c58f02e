// SPDX-License-Identifier: MIT
// Unit tests for common/wire/auth: key files, the mutual challenge-response, rotation with two keys,
// the RDMA attach MAC, and the AUTH messages of the wire protocol.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/wire/auth.h"
#include "common/wire/protocol.h"

using namespace rdmaswap;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<const AuthKey> key_of(const std::string &s)
{
	return std::make_shared<const AuthKey>(std::as_bytes(std::span(s.data(), s.size())));
}

// A temporary key file with the given content and mode; removed on destruction.
struct KeyFile {
	KeyFile(const std::string &content, mode_t mode)
	{
		char tmpl[] = "/tmp/rdmaswap-key-XXXXXX";
		const int fd = mkstemp(tmpl);
		REQUIRE(fd >= 0);
		path = tmpl;
		REQUIRE(write(fd, content.data(), content.size()) == ssize_t(content.size()));
		REQUIRE(fchmod(fd, mode) == 0);
		close(fd);
	}
	~KeyFile() { unlink(path.c_str()); }
	std::string path;
};

std::string load_error(const std::string &path)
{
	try {
		load_auth_key(path);
	} catch (const std::runtime_error &e) {
		return e.what();
	}
	return "";
}

// One handshake between a client holding `ck` and a server holding `sk`. Returns whether the
// server accepted the client; `client_ok` says whether the client accepted the server.
bool handshake(const AuthKey &ck, std::span<const std::shared_ptr<const AuthKey>> sk,
	       bool &client_ok, Mac *client_attach = nullptr, Mac *server_attach = nullptr)
{
	AuthClient c(ck);
	AuthServer s(sk);
	Nonce ns;
	Mac smac, proof{};
	client_ok = false;
	if (!s.challenge(c.client_nonce(), c.key_id(), ns, smac))
		return false;
	client_ok = c.check(ns, smac, proof);
	if (!client_ok)
		return false;
	const bool ok = s.verify(proof);
	if (client_attach)
		*client_attach = c.attach_key();
	if (server_attach)
		*server_attach = s.attach_key();
	return ok && s.authenticated();
}

} // namespace

TEST_CASE("auth: a client and a server with the same key accept each other", "[auth]")
{
	const std::vector keys{key_of("0123456789abcdef0123456789abcdef")};
	bool client_ok = false;
	Mac ca{}, sa{};
	CHECK(handshake(*keys[0], keys, client_ok, &ca, &sa));
	CHECK(client_ok);
	CHECK(ca == sa);
	CHECK(ca != Mac{});
	// The attach key differs per handshake (fresh nonces).
	Mac ca2{}, sa2{};
	CHECK(handshake(*keys[0], keys, client_ok, &ca2, &sa2));
	CHECK(ca2 != ca);
	// The RDMA attach MAC: same inputs, same MAC; any other input, another MAC.
	const auto m = attach_mac(ca, 1, 2, 3);
	CHECK(m == attach_mac(sa, 1, 2, 3));
	CHECK(m != attach_mac(ca2, 1, 2, 3));
	CHECK(m != attach_mac(ca, 1, 2, 4));
	CHECK(m != attach_mac(ca, 1, 3, 3));
	CHECK(m != attach_mac(ca, 2, 2, 3));
}

TEST_CASE("auth: another key is refused, and the client spots an impostor", "[auth]")
{
	const std::vector server_keys{key_of("server key server key server key")};
	const auto other = key_of("another key, another key, another");
	bool client_ok = true;
	// Unknown key id: the server refuses at once.
	CHECK_FALSE(handshake(*other, server_keys, client_ok));
	CHECK_FALSE(client_ok);

	// An impostor that echoes a key id but does not hold the key cannot answer the challenge.
	AuthClient c(*server_keys[0]);
	Nonce ns{};
	Mac smac{}, proof{};
	CHECK_FALSE(c.check(ns, smac, proof));
	// Nor by reflecting our nonce and a MAC it computed under another key.
	AuthServer impostor(std::span(&other, 1));
	AuthClient c_other(*other);
	REQUIRE(impostor.challenge(c.client_nonce(), other->id(), ns, smac));
	CHECK_FALSE(c.check(ns, smac, proof));
}

TEST_CASE("auth: a wrong or replayed proof is refused, one try per challenge", "[auth]")
{
	const std::vector keys{key_of("the cluster key of this test....")};
	AuthClient c(*keys[0]);
	AuthServer s(keys);
	Nonce ns;
	Mac smac, proof;
	REQUIRE(s.challenge(c.client_nonce(), c.key_id(), ns, smac));
	REQUIRE(c.check(ns, smac, proof));
	Mac bad = proof;
	bad[7] ^= std::byte{1};
	CHECK_FALSE(s.verify(bad));
	CHECK_FALSE(s.verify(proof)); // the failed try used up the challenge
	CHECK_FALSE(s.authenticated());

	// A proof recorded from one connection is useless on the next (fresh server nonce).
	AuthServer s2(keys);
	Nonce ns2;
	Mac smac2;
	REQUIRE(s2.challenge(c.client_nonce(), c.key_id(), ns2, smac2));
	CHECK(ns2 != ns);
	CHECK_FALSE(s2.verify(proof));
	// The server's MAC cannot serve as the client's proof (distinct labels).
	AuthServer s3(keys);
	Nonce ns3;
	Mac smac3;
	REQUIRE(s3.challenge(c.client_nonce(), c.key_id(), ns3, smac3));
	CHECK_FALSE(s3.verify(smac3));
	// No AUTH twice on one connection.
	AuthServer s4(keys);
	REQUIRE(s4.challenge(c.client_nonce(), c.key_id(), ns, smac));
	CHECK_FALSE(s4.challenge(c.client_nonce(), c.key_id(), ns, smac));
}

TEST_CASE("auth: during a rotation a server with two keys accepts clients of either", "[auth]")
{
	const auto old_key = key_of("old key old key old key old key!");
	const auto new_key = key_of("new key new key new key new key!");
	const std::vector both{old_key, new_key};
	const std::vector only_new{new_key};
	bool client_ok = false;
	CHECK(handshake(*old_key, both, client_ok));
	CHECK(handshake(*new_key, both, client_ok));
	CHECK_FALSE(handshake(*old_key, only_new, client_ok));
	CHECK(old_key->id() != new_key->id());
}

TEST_CASE("auth: key files", "[auth]")
{
	const std::string k = "0123456789abcdef0123456789abcdef";
	KeyFile good(k + "\n", 0600);
	const auto key = load_auth_key(good.path);
	REQUIRE(key);
	CHECK(key->id() == key_of(k)->id()); // the trailing newline is not part of the key
	KeyFile world(k, 0644);
	const std::string e = load_error(world.path);
	CHECK(e.find("other users") != std::string::npos);
	CHECK(e.find("chmod 600") != std::string::npos);
	KeyFile world_w(k, 0602);
	CHECK(load_error(world_w.path).find("other users") != std::string::npos);

	KeyFile shortk("short\n", 0600);
	CHECK(load_error(shortk.path).find("too short") != std::string::npos);
	KeyFile empty("", 0600);
	CHECK(load_error(empty.path).find("too short") != std::string::npos);
	KeyFile huge(std::string(5000, 'k'), 0600);
	CHECK(load_error(huge.path).find("too long") != std::string::npos);
	CHECK(load_error("/nonexistent/rdmaswap.key").find("No such file") != std::string::npos);
	CHECK(load_error("/tmp").find("regular file") != std::string::npos);
}

TEST_CASE("auth: a key file must be this user's regular file, mode 0600 or stricter", "[auth]")
{
	const std::string k = "0123456789abcdef0123456789abcdef";
	CHECK(load_auth_key(KeyFile(k, 0400).path)); // stricter than 0600 is fine

	SECTION("any group permission is refused")
	{
		for (const mode_t mode : {0640, 0620, 0610}) {
			KeyFile group(k, mode);
			const std::string e = load_error(group.path);
			INFO("mode " << std::oct << mode << ": " << e);
			CHECK(e.find("auth key file " + group.path) != std::string::npos);
			CHECK(e.find("accessible by other users") != std::string::npos);
			CHECK(e.find("0600 or stricter") != std::string::npos);
			CHECK(e.find("chmod 600") != std::string::npos);
		}
	}
	SECTION("a FIFO is refused at once, never waited on")
	{
		char dir[] = "/tmp/rdmaswap-key-XXXXXX";
		REQUIRE(mkdtemp(dir));
		const std::string fifo = std::string(dir) + "/fifo.key";
		REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
		auto result = std::async(std::launch::async, [&] { return load_error(fifo); });
		const bool done = result.wait_for(5s) == std::future_status::ready;
		if (!done) { // let the blocked open return (a writer appears), so the test ends
			const int w = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
			if (w >= 0)
				close(w);
		}
		CHECK(done);
		const std::string e = result.get();
		CHECK(e.find("not a regular file (a FIFO)") != std::string::npos);
		unlink(fifo.c_str());
		rmdir(dir);
	}
	SECTION("a symbolic link is refused, even to a good key")
	{
		KeyFile good(k, 0600);
		const std::string link = good.path + ".link";
		REQUIRE(symlink(good.path.c_str(), link.c_str()) == 0);
		const std::string e = load_error(link);
		unlink(link.c_str());
		CHECK(e.find("auth key file " + link + ": is a symbolic link") != std::string::npos);
	}
	SECTION("another user's key is refused, even with mode 0600")
	{
		if (geteuid() != 0) {
			WARN("not root: cannot give a file to another user, not checked");
			return;
		}
		KeyFile theirs(k, 0600);
		REQUIRE(chown(theirs.path.c_str(), 65534, 65534) == 0);
		const std::string e = load_error(theirs.path);
		INFO(e);
		CHECK(e.find("auth key file " + theirs.path) != std::string::npos);
		CHECK(e.find("uid 65534") != std::string::npos);
		CHECK(e.find("mode 0600") != std::string::npos);
		CHECK(e.find("not owned by") != std::string::npos);
		CHECK(e.find("uid 0") != std::string::npos);
	}
}

TEST_CASE("protocol: AUTH messages", "[auth][protocol]")
{
	using namespace rdmaswap::proto;
	CHECK(request_body_size(Op::Auth) == long(kAuthRequestSize));
	CHECK(reply_body_size(Op::Auth) == long(kAuthReplySize));
	CHECK(request_body_size(Op::AuthProof) == long(kAuthProofRequestSize));
	CHECK(reply_body_size(Op::AuthProof) == 0);
	CHECK(kAuthReplySize <= kMaxFixedBody);
	CHECK(std::string(op_name(Op::Auth)) == "AUTH");
	CHECK(request_body_size(Op::DonorProof) == long(kDonorProofRequestSize));
	CHECK(std::string(op_name(Op::DonorProof)) == "DONOR_PROOF");
	CHECK(request_body_size(Op(19)) == -1); // past the last op: unknown

	AuthRequest req;
	for (size_t i = 0; i < req.client_nonce.size(); i++)
		req.client_nonce[i] = std::byte(i);
	req.key_id = 0x1122334455667788ull;
	std::array<std::byte, kAuthRequestSize> b{};
	encode(req, b);
	CHECK(b[32] == std::byte{0x88});
	AuthRequest back;
	REQUIRE(decode(b, back).ok);
	CHECK(back.client_nonce == req.client_nonce);
	CHECK(back.key_id == req.key_id);
	b[40] = std::byte{1}; // reserved
	CHECK_FALSE(decode(b, back).ok);
	CHECK_FALSE(decode(std::span(b).first(47), back).ok);

	AuthReply rep;
	rep.server_nonce[0] = std::byte{9};
	rep.server_mac[31] = std::byte{7};
	std::array<std::byte, kAuthReplySize> rb{};
	encode(rep, rb);
	AuthReply rback;
	REQUIRE(decode(rb, rback).ok);
	CHECK(rback.server_nonce == rep.server_nonce);
	CHECK(rback.server_mac == rep.server_mac);
	CHECK_FALSE(decode(std::span(rb).first(63), rback).ok);

	AuthProofRequest p;
	p.client_mac[5] = std::byte{5};
	std::array<std::byte, kAuthProofRequestSize> pb{};
	encode(p, pb);
	AuthProofRequest pback;
	REQUIRE(decode(pb, pback).ok);
	CHECK(pback.client_mac == p.client_mac);

	// Headers: AUTH requests carry exactly their body, replies theirs.
	Header h;
	h.op = Op::Auth;
	h.body_len = kAuthRequestSize;
	std::array<std::byte, kHeaderSize> hb{};
	encode_header(h, hb);
	Header hd;
	CHECK(decode_header(hb, hd).ok);
	h.body_len = 0xffffffff;
	encode_header(h, hb);
	CHECK_FALSE(decode_header(hb, hd).ok);
	h.flags = kFlagResponse;
	h.body_len = kAuthReplySize + 1;
	encode_header(h, hb);
	CHECK_FALSE(decode_header(hb, hd).ok);
}
