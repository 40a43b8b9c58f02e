// SPDX-License-Identifier: MIT
// Unit tests for common/wire/volume_key: derivation, signatures, the key file, the default path, and
// BIND on an in-process memserver (a wrong proof is EPERM; another volume key is another volume).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/transport/control_client.h"
#include "common/wire/auth.h"
#include "common/wire/protocol.h"
#include "common/wire/volume_key.h"
#include "memserver/server.h"

using namespace rdmaswap;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<const AuthKey> secret(const std::string &s)
{
	return std::make_shared<const AuthKey>(std::as_bytes(std::span(s.data(), s.size())));
}

std::span<const std::byte> bytes(const std::string &s)
{
	return std::as_bytes(std::span(s.data(), s.size()));
}

// A scratch directory, removed (with what the test put in it) on destruction.
struct TempDir {
	TempDir()
	{
		char tmpl[] = "/tmp/rdmaswap-vkey-XXXXXX";
		REQUIRE(mkdtemp(tmpl));
		path = tmpl;
	}
	~TempDir()
	{
		std::error_code ec; // best effort: a destructor must not throw
		std::filesystem::remove_all(path, ec);
	}
	std::string path;
};

mode_t mode_of(const std::string &p)
{
	struct stat st {};
	REQUIRE(stat(p.c_str(), &st) == 0);
	return st.st_mode & 07777;
}

std::string read_all(const std::string &p)
{
	std::ifstream f(p, std::ios::binary);
	std::stringstream ss;
	ss << f.rdbuf();
	return ss.str();
}

std::string load_error(const std::string &path)
{
	try {
		VolumeKey::load_or_create(path, "v");
	} catch (const std::runtime_error &e) {
		return e.what();
	}
	return "";
}

} // namespace

TEST_CASE("volume key: derive, sign, verify", "[volkey]")
{
	const auto v = secret("a host's volume secret, 32 bytes");
	const VolumeKey k(*v, "vol-1");
	CHECK(k.name() == "vol-1");
	const std::string text = "rdmaswap-volume-bind-v1 and some challenge bytes";
	const auto msg = bytes(text);
	const VolumeProof sig = k.sign(msg);
	CHECK(verify_volume_proof(k.public_key(), msg, sig));
	// Ed25519 is deterministic: the same key signs the same message the same way.
	CHECK(k.sign(msg) == sig);
	// The same secret and name give the same key (a restarted plugin finds its volume).
	CHECK(VolumeKey(*v, "vol-1").public_key() == k.public_key());

	SECTION("a changed byte of the message fails")
	{
		for (size_t i : {size_t(0), text.size() / 2, text.size() - 1}) {
			std::string t = text;
			t[i] ^= 1;
			CHECK_FALSE(verify_volume_proof(k.public_key(), bytes(t), sig));
		}
		CHECK_FALSE(verify_volume_proof(k.public_key(), msg.first(msg.size() - 1), sig));
	}
	SECTION("a changed byte of the signature fails")
	{
		for (size_t i : {size_t(0), size_t(31), size_t(32), size_t(63)}) {
			VolumeProof bad = sig;
			bad[i] ^= std::byte{0x10};
			CHECK_FALSE(verify_volume_proof(k.public_key(), msg, bad));
		}
		CHECK_FALSE(verify_volume_proof(k.public_key(), msg, VolumeProof{}));
	}
	SECTION("a changed byte of the public key fails")
	{
		for (size_t i : {size_t(0), size_t(15), size_t(31)}) {
			VolumePubKey bad = k.public_key();
			bad[i] ^= std::byte{0x01};
			CHECK_FALSE(verify_volume_proof(bad, msg, sig));
		}
		CHECK_FALSE(verify_volume_proof(VolumePubKey{}, msg, sig));
	}
	SECTION("two names, two keys; two secrets, two keys")
	{
		const VolumeKey other(*v, "vol-2");
		CHECK(other.public_key() != k.public_key());
		CHECK_FALSE(verify_volume_proof(other.public_key(), msg, sig));
		const VolumeKey b(*secret("another host's volume secret, 32"), "vol-1");
		CHECK(b.public_key() != k.public_key());
		CHECK_FALSE(verify_volume_proof(b.public_key(), msg, sig));
	}
	CHECK_THROWS_AS(VolumeKey(*v, ""), std::invalid_argument);
	CHECK_THROWS_AS(VolumeKey(*v, "has space"), std::invalid_argument);
}

TEST_CASE("volume key: the BIND proof message", "[volkey]")
{
	Challenge c;
	for (size_t i = 0; i < c.size(); i++)
		c[i] = std::byte(0xc0 + i);
	std::array<char, 64> name{};
	std::memcpy(name.data(), "vol", 3);
	VolumePubKey pub;
	pub.fill(std::byte{0x55});
	const auto m = bind_proof_message(c, 0x0102030405060708ull, name, 0x11223344u, pub);
	static_assert(kBindProofMessageSize == 163);
	CHECK(std::memcmp(m.data(), "rdmaswap-volume-bind-v1", 23) == 0);
	CHECK(m[23] == std::byte{0xc0});
	CHECK(m[54] == std::byte{0xc0 + 31});
	CHECK(m[55] == std::byte{0x08}); // session id, little-endian
	CHECK(m[62] == std::byte{0x01});
	CHECK(m[63] == std::byte{'v'});
	CHECK(m[66] == std::byte{0}); // NUL padding of the name
	CHECK(m[127] == std::byte{0x44}); // lease, little-endian
	CHECK(m[130] == std::byte{0x11});
	CHECK(m[131] == std::byte{0x55});
	CHECK(m[162] == std::byte{0x55});
	// Every input changes it.
	CHECK(bind_proof_message(c, 0x0102030405060709ull, name, 0x11223344u, pub) != m);
	CHECK(bind_proof_message(c, 0x0102030405060708ull, name, 0x11223345u, pub) != m);
	Challenge c2 = c;
	c2[5] ^= std::byte{1};
	CHECK(bind_proof_message(c2, 0x0102030405060708ull, name, 0x11223344u, pub) != m);
}

TEST_CASE("volume key: load-or-create makes a 0600 file and refuses a 0644 one", "[volkey]")
{
	TempDir d;
	const std::string path = d.path + "/state/rdmaswap/volume.key";
	bool created = false;
	const auto k = VolumeKey::load_or_create(path, "vol-a", &created);
	CHECK(created);
	CHECK(mode_of(path) == 0600);
	CHECK(mode_of(d.path + "/state/rdmaswap") == 0700);
	CHECK(mode_of(d.path + "/state") == 0700);
	const std::string text = read_all(path);
	REQUIRE(text.size() == 65);
	CHECK(text.back() == '\n');
	CHECK(text.find_first_not_of("0123456789abcdef") == 64);
	// Loaded again: not re-created, the same key; the key is the file's (hex text) bytes.
	const auto again = VolumeKey::load_or_create(path, "vol-a", &created);
	CHECK_FALSE(created);
	CHECK(again->public_key() == k->public_key());
	CHECK(VolumeKey(*secret(text.substr(0, 64)), "vol-a").public_key() == k->public_key());
	// Another volume of the same host (same file): another key.
	CHECK(VolumeKey::load_or_create(path, "vol-b")->public_key() != k->public_key());
	// No temporary file left behind.
	CHECK(std::system(("test $(ls -A '" + d.path + "/state/rdmaswap' | wc -l) -eq 1").c_str()) == 0);

	SECTION("a key others can read is refused")
	{
		REQUIRE(chmod(path.c_str(), 0644) == 0);
		const std::string e = load_error(path);
		CHECK(e.find("volume key file " + path) != std::string::npos);
		CHECK(e.find("accessible by other users") != std::string::npos);
	}
	SECTION("a key its group can read, a symbolic link, another user's key are refused")
	{
		REQUIRE(chmod(path.c_str(), 0640) == 0);
		CHECK(load_error(path).find("accessible by other users") != std::string::npos);
		REQUIRE(chmod(path.c_str(), 0600) == 0);
		// A link, even to this good key, is not followed (nor is a missing key created
		// through a dangling one).
		const std::string link = d.path + "/link.key", dangling = d.path + "/dangling.key";
		REQUIRE(symlink(path.c_str(), link.c_str()) == 0);
		CHECK(load_error(link).find("symbolic link") != std::string::npos);
		REQUIRE(symlink((d.path + "/made-through-link").c_str(), dangling.c_str()) == 0);
		CHECK(load_error(dangling).find("symbolic link") != std::string::npos);
		CHECK(access((d.path + "/made-through-link").c_str(), F_OK) != 0);
		if (geteuid() == 0) {
			REQUIRE(chown(path.c_str(), 65534, 65534) == 0);
			const std::string e = load_error(path);
			CHECK(e.find("volume key file " + path) != std::string::npos);
			CHECK(e.find("uid 65534") != std::string::npos);
			REQUIRE(chown(path.c_str(), 0, 0) == 0);
		}
		CHECK(load_error(path).empty()); // (and the good key still loads)
	}
	SECTION("too short, a directory, or a parent that is a file")
	{
		const std::string shorty = d.path + "/short.key";
		std::ofstream(shorty) << "0123456789\n";
		REQUIRE(chmod(shorty.c_str(), 0600) == 0);
		CHECK(load_error(shorty).find("too short") != std::string::npos);
		CHECK(load_error(d.path).find("regular file") != std::string::npos);
		CHECK(load_error(path + "/sub.key").find("ot a directory") != std::string::npos);
	}
}

TEST_CASE("volume key: the default location", "[volkey]")
{
	CHECK(default_volume_key_path("/var/lib/rdmaswap", true, "/x", "/home/u") ==
	      "/var/lib/rdmaswap/volume.key");
	CHECK(default_volume_key_path("/s1:/s2", false, nullptr, "/home/u") == "/s1/volume.key");
	CHECK(default_volume_key_path(nullptr, true, "/x", "/root") ==
	      "/var/lib/rdmaswap/volume.key");
	CHECK(default_volume_key_path("", false, "/xdg", "/home/u") ==
	      "/xdg/rdmaswap/volume.key");
	CHECK(default_volume_key_path(nullptr, false, "", "/home/u") ==
	      "/home/u/.local/state/rdmaswap/volume.key");
	CHECK_THROWS_WITH(default_volume_key_path(nullptr, false, nullptr, nullptr),
			  Catch::Contains("volume-key=FILE"));
}

namespace {

// A TCP memserver on 127.0.0.1 running on its own thread for the test's lifetime.
struct LocalServer {
	LocalServer()
	{
		MemserverOptions o;
		o.listen = "127.0.0.1";
		o.port = 0;
		o.capacity = 8ull << 20;
		o.slab_size = 1ull << 20;
		o.transport = TransportKind::Tcp;
		o.lock_memory = false;
		o.auth_keys.push_back(key);
		server = std::make_unique<Memserver>(o);
		thread = std::thread([this] { server->run(); });
	}
	~LocalServer()
	{
		server->stop();
		thread.join();
	}
	SockAddr addr() const { return resolve(Endpoint{"127.0.0.1", server->port()}); }
	std::shared_ptr<const AuthKey> key = secret("the cluster key of this test!!");
	std::unique_ptr<Memserver> server;
	std::thread thread;
};

// A raw BIND on a new session: HELLO, then BIND with `pub` and the proof `sign` makes from the
// message of this connection. Returns the BIND's status (0 or errno).
template <typename Sign>
int raw_bind(const LocalServer &s, const std::string &name, const VolumePubKey &pub, Sign sign,
	     proto::BindReply *out = nullptr)
{
	int err = 0;
	Fd fd = connect_memserver(s.addr(), deadline_after(5s), s.key.get(), nullptr, err);
	REQUIRE(fd);
	std::array<std::byte, proto::kHelloRequestSize> hb;
	proto::encode(proto::HelloRequest{}, hb);
	std::array<std::byte, proto::kHelloReplySize> hr;
	REQUIRE(rpc(fd.get(), 1, proto::Op::Hello, hb, hr, deadline_after(5s)) == 0);
	proto::HelloReply hello;
	REQUIRE(proto::decode(hr, hello).ok);
	proto::BindRequest req;
	std::memcpy(req.name.data(), name.data(), name.size());
	req.lease_s = 30;
	req.pubkey = pub;
	req.proof = sign(bind_proof_message(hello.challenge, hello.session_id, req.name,
					    req.lease_s, pub));
	std::array<std::byte, proto::kBindRequestSize> bb;
	proto::encode(req, bb);
	std::array<std::byte, proto::kBindReplySize> br;
	const int r = rpc(fd.get(), 2, proto::Op::Bind, bb, br, deadline_after(5s));
	if (r == 0 && out)
		REQUIRE(proto::decode(br, *out).ok);
	return r;
}

} // namespace

TEST_CASE("volume key: BIND on a memserver needs the owner's proof", "[volkey][memserver]")
{
	set_log_level("off");
	LocalServer s;
	const auto a = secret("owner's volume secret, 32 bytes!");
	const auto b = secret("another host's volume secret!!!!");
	const VolumeKey ka(*a, "vol"), kb(*b, "vol");

	// The owner binds, takes a tagged slab, and goes away: the session is kept (lease 30 s).
	{
		ControlClient owner(s.addr(), 5s, s.key);
		proto::HelloReply hello;
		REQUIRE(owner.open_session(false, hello) == 0);
		proto::BindReply r;
		REQUIRE(owner.bind(ka, 30, r) == 0);
		CHECK(r.reattached == 0);
		proto::AllocReply ar;
		REQUIRE(owner.alloc_tagged(0, 1, ar) == 0);
	}
	auto detached = [&] {
		ControlClient c(s.addr(), 5s, s.key);
		std::vector<proto::SessionEntry> v;
		return c.sessions(0, v) == 0 && v.size() == 1 && (v[0].flags & proto::kSessionDetached);
	};
	for (int i = 0; i < 250 && !detached(); i++)
		std::this_thread::sleep_for(20ms);
	REQUIRE(detached());

	SECTION("a wrong proof is EPERM and binds nothing")
	{
		// The owner's public key, signed by another key; a proof of another connection's
		// challenge; a flipped bit; no proof at all.
		CHECK(raw_bind(s, "vol", ka.public_key(),
			       [&](const auto &m) { return kb.sign(m); }) == EPERM);
		CHECK(raw_bind(s, "vol", ka.public_key(), [&](const auto &m) {
			      auto other = m;
			      other[30] ^= std::byte{1}; // inside the challenge
			      return ka.sign(other);
		      }) == EPERM);
		CHECK(raw_bind(s, "vol", ka.public_key(), [&](const auto &m) {
			      auto p = ka.sign(m);
			      p[10] ^= std::byte{4};
			      return p;
		      }) == EPERM);
		CHECK(raw_bind(s, "vol", ka.public_key(), [](const auto &) { return VolumeProof{}; }) ==
		      EPERM);
		// The owner's slab is still its own: the owner's next bind takes it over.
		proto::BindReply r;
		REQUIRE(raw_bind(s, "vol", ka.public_key(),
				 [&](const auto &m) { return ka.sign(m); }, &r) == 0);
		CHECK(r.reattached == 1);
		CHECK(r.slabs == 1);
	}
	SECTION("another volume key with the same name is another volume")
	{
		ControlClient thief(s.addr(), 5s, s.key);
		proto::HelloReply hello;
		REQUIRE(thief.open_session(false, hello) == 0);
		proto::BindReply r;
		REQUIRE(thief.bind(kb, 30, r) == 0);
		CHECK(r.reattached == 0); // before volume keys: 1, and the owner's slab with it
		CHECK(r.slabs == 0);
		std::vector<proto::VolumeEntry> slabs;
		REQUIRE(thief.volume_list(proto::ListWhat::Slabs, 0, slabs) == 0);
		CHECK(slabs.empty());
		// The owner, meanwhile (the thief is live: before, this was EBUSY), gets its slab.
		ControlClient owner(s.addr(), 5s, s.key);
		REQUIRE(owner.open_session(false, hello) == 0);
		REQUIRE(owner.bind(ka, 30, r) == 0);
		CHECK(r.reattached == 1);
		CHECK(r.slabs == 1);
	}
}
