// SPDX-License-Identifier: MIT
// Issue 26, "etcd decides nothing alone": signed records. A certified memserver's registration
// (memserver/registry.h) and a volume's holders record in etcd (common/cluster/holders.h) verify, and
// every flipped byte of them, a copy under another key, another CA or volume key, an unsigned
// value are refused; a replayed older registration does not override a newer one (Membership).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cluster/discovery.h"
#include "common/cluster/holders.h"
#include "common/cluster/membership.h"
#include "common/wire/donor_cert.h"
#include "common/wire/volume_key.h"
#include "memserver/registry.h"
#include "tests/support/fake_transport.h"
#include "tests/support/key_helpers.h"
#include "tests/support/results.h"
#include "tests/support/volume_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::test;

namespace {

const SigningKey &ca()
{
	static const SigningKey k(*secret("the signed-etcd test CA secret 32"));
	return k;
}

std::shared_ptr<const SigningKey> donor_key(const char *s = "the donor's own key secret, 32 b")
{
	return std::make_shared<const SigningKey>(*secret(s));
}

std::vector<std::byte> cert_for(const SigningKey &issuer, const SigningKey &donor,
				std::vector<std::string> addrs, uint64_t serial = 7)
{
	return issue_cert(issuer, donor.public_key(), "donor-1", addrs, now_s() - 60,
			  now_s() + 3600, serial)
		.encode();
}

RegistryOptions reg(const std::string &adv, std::shared_ptr<const SigningKey> key,
		    std::vector<std::byte> cert)
{
	RegistryOptions o;
	o.prefix = "/p/";
	o.advertise = adv;
	o.transport = "tcp";
	o.slab_size = 1 << 20;
	o.slabs_total = 64;
	o.boot_id = 0x1234;
	o.donor_key = std::move(key);
	o.donor_cert = std::move(cert);
	return o;
}

std::optional<discovery::Donor> check(const std::string &key, const std::string &value,
				      DonorVerifier &v, discovery::Ignored &ig)
{
	return discovery::check_donor("/p/", key, value, ig, &v);
}

} // namespace

TEST_CASE("signed registration: accepted, and every change refused", "[discovery][signed]")
{
	quiet();
	auto dk = donor_key();
	const RegistryOptions o = reg("10.0.0.7:7471", dk, cert_for(ca(), *dk, {"10.0.0.7:7471"}));
	const std::string key = registry_key(o);
	const std::string value = registry_value(o, {.slabs_free = 60, .sessions = 2}, 1000);
	DonorVerifier v(ca().public_key(), "");
	discovery::Ignored ig;
	auto d = check(key, value, v, ig);
	REQUIRE(d);
	CHECK(d->ts == 1000);
	CHECK(d->slabs_free == 60);
	CHECK(ig.total() == 0);

	// Every byte of the value flipped (each bit of it in turn for the low ones): refused.
	size_t tries = 0;
	for (size_t i = 0; i < value.size(); i++)
		for (unsigned bit : {0x01u, 0x02u, 0x20u}) {
			std::string bad = value;
			bad[i] = char(uint8_t(bad[i]) ^ bit);
			discovery::Ignored ig2;
			INFO("byte " << i << " ^ " << bit << ": " << bad);
			CHECK_FALSE(check(key, bad, v, ig2));
			CHECK(ig2.total() == 1);
			tries++;
		}
	CHECK(tries == 3 * value.size());
	// Every byte of the key flipped (its value unchanged): refused.
	for (size_t i = 0; i < key.size(); i++) {
		std::string bad = key;
		bad[i] = char(uint8_t(bad[i]) ^ 0x01);
		discovery::Ignored ig2;
		CHECK_FALSE(discovery::check_donor(std::string("/p/"), bad, value, ig2, &v));
	}
	// A field added (unknown to parse_donor, covered by the signature): refused.
	{
		auto j = nlohmann::json::parse(value);
		j["extra"] = 1;
		discovery::Ignored ig2;
		CHECK_FALSE(check(key, j.dump(), v, ig2));
		CHECK(ig2.bad_signature == 1);
	}
	// The same JSON written otherwise (spaces, another order of keys): the same fields, so it
	// verifies (the signature covers the fields, not the bytes etcd holds).
	{
		auto j = nlohmann::json::parse(value);
		discovery::Ignored ig2;
		CHECK(check(key, j.dump(2), v, ig2));
	}
	// Without donor-ca= (no verifier) it is accepted like any registration.
	discovery::Ignored ig3;
	CHECK(discovery::check_donor("/p/", key, value, ig3));
}

TEST_CASE("signed registration: unsigned, another address, another CA, revoked",
	  "[discovery][signed]")
{
	quiet();
	auto dk = donor_key();
	DonorVerifier v(ca().public_key(), "");
	// (a) Unsigned: a memserver without --donor-cert (or a value written by hand).
	{
		const RegistryOptions o = reg("10.0.0.9:7471", nullptr, {});
		discovery::Ignored ig;
		CHECK_FALSE(check(registry_key(o), registry_value(o, {}), v, ig));
		CHECK(ig.unsigned_ == 1);
		CHECK(ig.summary().find("unsigned") != std::string::npos);
	}
	// (b) A certified donor's registration copied to another address (key and addr both
	// changed): its certificate does not list that address.
	{
		const RegistryOptions o =
			reg("10.0.0.7:7471", dk, cert_for(ca(), *dk, {"10.0.0.7:7471"}));
		auto j = nlohmann::json::parse(registry_value(o, {}));
		j["addr"] = "10.0.0.66:7471";
		discovery::Ignored ig;
		CHECK_FALSE(check("/p/donors/10.0.0.66:7471", j.dump(), v, ig));
		CHECK(ig.bad_cert == 1);
	}
	// ... and to another of its own addresses: the signature names the key it was made for.
	{
		const RegistryOptions o = reg("10.0.0.7:7471", dk,
					      cert_for(ca(), *dk, {"10.0.0.7:7471", "10.0.0.8:7471"}));
		auto j = nlohmann::json::parse(registry_value(o, {}));
		j["addr"] = "10.0.0.8:7471";
		discovery::Ignored ig;
		CHECK_FALSE(check("/p/donors/10.0.0.8:7471", j.dump(), v, ig));
		CHECK(ig.bad_signature == 1);
	}
	// Signed by a key that is not the certified one.
	{
		RegistryOptions o = reg("10.0.0.7:7471", donor_key("another donor key, 32 bytes long"),
					cert_for(ca(), *dk, {"10.0.0.7:7471"}));
		discovery::Ignored ig;
		CHECK_FALSE(check(registry_key(o), registry_value(o, {}), v, ig));
		CHECK(ig.bad_signature == 1);
	}
	// A certificate of another CA.
	{
		const SigningKey other(*secret("not the operators' CA at all, 32"));
		const RegistryOptions o =
			reg("10.0.0.7:7471", dk, cert_for(other, *dk, {"10.0.0.7:7471"}));
		discovery::Ignored ig;
		CHECK_FALSE(check(registry_key(o), registry_value(o, {}), v, ig));
		CHECK(ig.bad_cert == 1);
	}
	// A hostname as the registered address: certificates name numeric addresses only.
	{
		const RegistryOptions o =
			reg("donor.example:7471", dk, cert_for(ca(), *dk, {"10.0.0.7:7471"}));
		discovery::Ignored ig;
		CHECK_FALSE(check(registry_key(o), registry_value(o, {}), v, ig));
		CHECK(ig.bad_cert == 1);
	}
	// The registration of a revoked certificate.
	{
		RevocationList crl;
		crl.issued = now_s();
		crl.serials = {7};
		sign_crl(ca(), crl);
		const std::string path = "/tmp/rdmaswap-signed-etcd-" + std::to_string(::getpid()) + ".crl";
		write_cert_file(path, crl.encode(), 0600);
		DonorVerifier revoking(ca().public_key(), path);
		const RegistryOptions o =
			reg("10.0.0.7:7471", dk, cert_for(ca(), *dk, {"10.0.0.7:7471"}, 7));
		discovery::Ignored ig;
		CHECK_FALSE(check(registry_key(o), registry_value(o, {}), revoking, ig));
		CHECK(ig.bad_cert == 1);
		std::remove(path.c_str());
	}
}

TEST_CASE("signed registration: a replayed older registration does not override a newer one",
	  "[membership][etcd][signed]")
{
	quiet();
	auto b = backend("a", 16);
	auto vol = make_volume({b}, opts(4 * SS));
	Membership::Options mo;
	mo.revision = 1;
	mo.registry.verifier = std::make_shared<DonorVerifier>(ca().public_key(), "");
	const std::vector<Membership::Start> st{{Endpoint{"a", 7471}, 0x1111, true}};
	Membership m(
		*vol,
		[](const Endpoint &) -> std::unique_ptr<Server> { throw std::runtime_error("no"); },
		std::move(mo), st);
	discovery::Donor d;
	d.addr = Endpoint{"10.0.0.7", 7471};
	d.boot_id = 0x1111;
	d.transport = "tcp";
	d.ts = 2000;
	m.registration_put(d);
	CHECK(m.counters().registered == 1);
	// The same donor's registration written earlier (a replay of an old boot's): ignored,
	// counted, and the donor counts as not registered (as if the key held nothing).
	discovery::Donor old = d;
	old.boot_id = 0x2222;
	old.ts = 1000;
	m.registration_put(old);
	auto c = m.counters();
	CHECK(c.ignored_replayed == 1);
	CHECK(c.registered == 0);
	m.set_registered(std::vector<discovery::Donor>{old}); // (a listing too)
	c = m.counters();
	CHECK(c.ignored_replayed == 2);
	CHECK(c.registered == 0);
	CHECK(m.status_text().find("etcd_ignored_replayed=2\n") != std::string::npos);
	// A newer one is used again.
	d.ts = 3000;
	m.registration_put(d);
	CHECK(m.counters().registered == 1);
}

TEST_CASE("signed holders record: only this volume's key for this key", "[holders][signed]")
{
	const VolumeKey vk(*secret("volume key secret of host one, 32"), "vol-a");
	const VolumeKey other_host(*secret("volume key secret of host two, 32"), "vol-a");
	const VolumeKey other_name(*secret("volume key secret of host one, 32"), "vol-b");
	const std::vector<Endpoint> donors{{"10.0.0.1", 7471}, {"10.0.0.2", 7471}};
	const holders::Unreachable unreachable{{"10.0.0.2:7471", 1234}};
	const std::string key = holders::etcd_key("/p/", "vol-a");
	const std::string text = holders::signed_text(key, "vol-a", donors, unreachable, vk);
	std::string why;
	CHECK(value_or_why(holders::verify_signed(key, text, vk.public_key()), why));
	// The local file's reader reads a signed text too.
	holders::Unreachable u;
	auto parsed = value_or_why(holders::parse_record(text, "vol-a", &u), why);
	REQUIRE(parsed);
	CHECK(parsed->size() == 2);
	CHECK(u == unreachable);
	// Every byte flipped: refused.
	for (size_t i = 0; i < text.size(); i++) {
		if (text[i] == '\n')
			continue; // (the trailing newline is not JSON: whitespace)
		std::string bad = text;
		bad[i] = char(uint8_t(bad[i]) ^ 0x01);
		INFO("byte " << i << ": " << bad);
		CHECK_FALSE(value_or_why(holders::verify_signed(key, bad, vk.public_key()), why));
	}
	// Unsigned (what a plugin before issue 26, or anyone, writes): refused.
	CHECK_FALSE(value_or_why(holders::verify_signed(key, holders::record_text("vol-a", donors),
					   vk.public_key()), why));
	CHECK(why.find("not signed") != std::string::npos);
	// Signed by another host's key for the same name, or for another volume of this host.
	CHECK_FALSE(value_or_why(holders::verify_signed(
		key, holders::signed_text(key, "vol-a", donors, {}, other_host), vk.public_key()), why));
	CHECK_FALSE(value_or_why(holders::verify_signed(
		key, holders::signed_text(key, "vol-a", donors, {}, other_name), vk.public_key()), why));
	// This volume's record copied under another key.
	const std::string key_b = holders::etcd_key("/p/", "vol-b");
	CHECK_FALSE(value_or_why(holders::verify_signed(
		key_b, holders::signed_text(key, "vol-a", donors, {}, vk), vk.public_key()), why));
	// A dead address added to a signed record: refused.
	auto j = nlohmann::json::parse(text);
	j["donors"].push_back("10.9.9.9:1");
	CHECK_FALSE(value_or_why(holders::verify_signed(key, j.dump(), vk.public_key()), why));
}
