// SPDX-License-Identifier: MIT
// libFuzzer target for the donor certificate formats (common/wire/donor_cert.h): parse_cert and
// parse_crl on the whole input (their magics differ, so one corpus feeds both), and
// canonical_cert_address on the input as text. A certificate comes from the network (a
// memserver's DONOR_PROOF reply), a revocation list from a file the plugin re-reads while it
// runs. Besides "no crash, no UB, no leak" it checks that
//   - what parses re-encodes to the same bytes (strict: one encoding per value), within the
//     bounds of the format (name, address count and form, validity period, serials ascending);
//   - a parsed certificate or list whose CA signature is valid stops being valid when one bit of
//     the signed bytes changes (so a valid seed does not mask a check that ignores a field), and
//     its validity period is enforced at both ends;
//   - DonorVerifier::check (no revocation list) refuses an address the certificate does not list
//     and agrees with cert_problem;
//   - revoked() finds exactly the listed serials;
//   - an accepted address is canonical (canonical_cert_address of it is itself).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/config.h"
#include "common/wire/donor_cert.h"
#include "tests/fuzz/fuzz_check.h"

using namespace rdmaswap;

namespace {

// The input with bit 0 of byte `at` of its signed part flipped.
std::vector<std::byte> flipped(std::span<const std::byte> in, size_t at)
{
	std::vector<std::byte> v(in.begin(), in.end());
	v[at] ^= std::byte{1};
	return v;
}

void check_cert(std::span<const std::byte> in, const DonorCert &c)
{
	FUZZ_CHECK(c.encode() == std::vector<std::byte>(in.begin(), in.end()));
	const auto signed_part = c.signed_part();
	FUZZ_CHECK(signed_part.size() + 64 == in.size());
	FUZZ_CHECK(in.size() <= kMaxCertSize);
	FUZZ_CHECK(!c.name.empty() && c.name.size() <= kMaxCertName);
	FUZZ_CHECK(!c.addresses.empty() && c.addresses.size() <= kMaxCertAddresses);
	for (const auto &a : c.addresses) {
		FUZZ_CHECK(a.size() <= kMaxCertAddress);
		FUZZ_CHECK(canonical_cert_address(a) == a);
	}
	FUZZ_CHECK(c.not_before < c.not_after);

	// Issued by another CA: refused whatever else holds.
	PublicKey other = c.ca;
	other[0] ^= std::byte{1};
	FUZZ_CHECK(!cert_problem(c, other, c.not_before).empty());

	// The validity period, at both ends (the signature is checked first: only a certificate
	// the CA signed gets this far).
	const bool signed_ok = cert_problem(c, c.ca, c.not_before).empty();
	FUZZ_CHECK(signed_ok == cert_problem(c, c.ca, c.not_after - 1).empty());
	if (!signed_ok)
		return;
	FUZZ_CHECK(!cert_problem(c, c.ca, c.not_after).empty());
	if (c.not_before > std::numeric_limits<int64_t>::min())
		FUZZ_CHECK(!cert_problem(c, c.ca, c.not_before - 1).empty());

	// One bit of the signed bytes changed (which one: from the signature's last byte, which
	// the fuzzer varies freely): it no longer parses, or no longer verifies.
	const size_t at = (size_t(in.back()) * 7 + in.size()) % signed_part.size();
	std::string err;
	if (const auto d = parse_cert(flipped(in, at), err))
		FUZZ_CHECK(!cert_problem(*d, c.ca, d->not_before).empty());

	// The plugin's check, with no revocation list: an address not in the certificate is
	// refused; the first one it lists is accepted exactly when the certificate is valid now.
	DonorVerifier v(c.ca, "");
	FUZZ_CHECK(!v.check(c, "not-an-address").empty());
	const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
				    std::chrono::system_clock::now().time_since_epoch())
				    .count();
	const bool valid_now = cert_problem(c, c.ca, now).empty();
	const bool accepted = v.check(c, c.addresses.front()).empty();
	// (now may have moved on by a second between the two calls, at not_after exactly.)
	FUZZ_CHECK(accepted == valid_now || now + 1 >= c.not_after);
}

void check_crl(std::span<const std::byte> in, const RevocationList &l)
{
	FUZZ_CHECK(l.encode() == std::vector<std::byte>(in.begin(), in.end()));
	FUZZ_CHECK(l.serials.size() <= kMaxRevoked);
	FUZZ_CHECK(in.size() == 4 + 2 + 32 + 8 + 4 + 8 * l.serials.size() + 64);
	for (size_t i = 0; i < l.serials.size(); i++) {
		const uint64_t s = l.serials[i];
		FUZZ_CHECK(i == 0 || l.serials[i - 1] < s);
		FUZZ_CHECK(l.revoked(s));
		// The serial after it is revoked only if it is the next one listed.
		if (s != std::numeric_limits<uint64_t>::max())
			FUZZ_CHECK(l.revoked(s + 1) ==
				   (i + 1 < l.serials.size() && l.serials[i + 1] == s + 1));
	}
	if (!l.serials.empty() && l.serials.front() > 0)
		FUZZ_CHECK(!l.revoked(l.serials.front() - 1));

	PublicKey other = l.ca;
	other[31] ^= std::byte{0x80};
	FUZZ_CHECK(!crl_problem(l, other).empty());
	if (!crl_problem(l, l.ca).empty())
		return;
	const size_t signed_size = in.size() - 64;
	const size_t at = (size_t(in.back()) * 7 + in.size()) % signed_size;
	std::string err;
	if (const auto d = parse_crl(flipped(in, at), err))
		FUZZ_CHECK(!crl_problem(*d, l.ca).empty());
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const std::span<const std::byte> in(reinterpret_cast<const std::byte *>(data), size);

	std::string err;
	if (const auto c = parse_cert(in, err)) {
		FUZZ_CHECK(err.empty());
		check_cert(in, *c);
	} else {
		FUZZ_CHECK(!err.empty());
	}
	err.clear();
	if (const auto l = parse_crl(in, err)) {
		FUZZ_CHECK(err.empty());
		check_crl(in, *l);
	} else {
		FUZZ_CHECK(!err.empty());
	}

	const std::string_view s(reinterpret_cast<const char *>(data), size);
	if (const auto a = canonical_cert_address(s)) {
		FUZZ_CHECK(canonical_cert_address(*a) == a);
		const auto ep = parse_endpoint(*a);
		FUZZ_CHECK(ep.has_value());
	}
	return 0;
}
