// SPDX-License-Identifier: MIT
// A donor's registration in etcd, signed (docs/security.md, "etcd"): what the signature covers,
// how a certified memserver signs its value and how a plugin with donor-ca= checks one. The
// value's fields and how a plugin uses them: common/cluster/discovery.h.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/wire/donor_cert.h"

namespace rdmaswap {

// A memserver with a donor key and certificate adds to its value "ts" (unix milliseconds,
// strictly increasing within a run), "cert" (its certificate, base64) and "sig": the base64
// of the Ed25519 signature, by the certified donor key, of registration_message(key, the
// value's JSON object without "sig", as nlohmann::json::dump() writes it: compact, keys
// sorted). So the signature covers the label, the etcd key (a registration copied under
// another key does not verify) and every field of the value, unknown ones included (one added
// or changed does not verify either).
inline constexpr std::string_view kRegistrationLabel = "rdmaswap-donor-registration-v1";
// What a signed etcd value's signature covers (registrations, and holders records:
// common/cluster/holders.h): label | key length (u32, little-endian) | key | text.
std::vector<std::byte> etcd_signed_message(std::string_view label, std::string_view key,
					   std::string_view text);
// etcd_signed_message(kRegistrationLabel, key, text).
std::vector<std::byte> registration_message(std::string_view key, std::string_view text);
// The value `fields` (a JSON object without "cert", "sig") with "cert" = `cert` and "sig"
// added, signed for `key`. Throws std::invalid_argument if `fields` is not a JSON object,
// std::runtime_error if libcrypto fails.
std::string sign_registration(std::string_view key, std::string_view fields,
			      const SigningKey &donor_key, std::span<const std::byte> cert);

// Why a registration is not accepted by a plugin with donor-ca=.
enum class RegistrationRefusal {
	None,         // signed by a donor certified for its address, the signature checks
	Unsigned,     // no "sig" or no "cert" (or no "ts")
	BadCert,      // "cert" does not parse, is not the CA's, not valid now, revoked, or does
		      // not list the registered address
	BadSignature, // "sig" is not a signature of this key and value by the certified key
};
// Check the registration `key` = `value` (parse_donor accepted it) under `verifier`
// (DonorVerifier::check with the registered address, canonical_cert_address, then
// verify_donor_signature). Sets `why` when it refuses. Never throws but std::bad_alloc.
RegistrationRefusal verify_registration(std::string_view key, std::string_view value,
			    DonorVerifier &verifier, std::string &why);

} // namespace rdmaswap
