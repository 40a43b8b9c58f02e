// SPDX-License-Identifier: MIT
// Signed registrations (registration.h).
#include "common/wire/registration.h"

#include <cstring>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/util/encoding.h"

namespace rdmaswap {

using nlohmann::json;

std::vector<std::byte> registration_message(std::string_view key, std::string_view text)
{
	return etcd_signed_message(kRegistrationLabel, key, text);
}

std::vector<std::byte> etcd_signed_message(std::string_view label, std::string_view key,
					   std::string_view text)
{
	std::vector<std::byte> m;
	m.reserve(label.size() + 4 + key.size() + text.size());
	auto put = [&](std::string_view s) {
		for (char c : s)
			m.push_back(std::byte(c));
	};
	put(label);
	const auto n = uint32_t(key.size());
	for (int i = 0; i < 4; i++)
		m.push_back(std::byte((n >> (8 * i)) & 0xff));
	put(key);
	put(text);
	return m;
}

std::string sign_registration(std::string_view key, std::string_view fields,
			      const SigningKey &donor_key, std::span<const std::byte> cert)
{
	json o = json::parse(fields, nullptr, false);
	if (o.is_discarded() || !o.is_object())
		throw std::invalid_argument("a registration to sign is not a JSON object");
	o.erase("sig");
	o["cert"] = base64_encode(
		std::string_view(reinterpret_cast<const char *>(cert.data()), cert.size()));
	const Signature sig = donor_sign(donor_key, registration_message(key, o.dump()));
	o["sig"] = base64_encode(
		std::string_view(reinterpret_cast<const char *>(sig.data()), sig.size()));
	return o.dump();
}

RegistrationRefusal verify_registration(std::string_view key, std::string_view value,
			    DonorVerifier &verifier, std::string &why)
{
	json o = json::parse(value, nullptr, false);
	if (o.is_discarded() || !o.is_object()) {
		why = "the value is not a JSON object";
		return RegistrationRefusal::BadSignature;
	}
	const auto sig_it = o.find("sig"), cert_it = o.find("cert"), ts_it = o.find("ts");
	const auto addr_it = o.find("addr");
	if (sig_it == o.end() || cert_it == o.end() || ts_it == o.end()) {
		why = "unsigned (no donor certificate and signature: a memserver without "
		      "--donor-cert, or not one)";
		return RegistrationRefusal::Unsigned;
	}
	if (addr_it == o.end() || !addr_it->is_string()) {
		why = "no \"addr\"";
		return RegistrationRefusal::BadSignature;
	}
	std::optional<std::string> cert_bytes, sig_bytes;
	if (cert_it->is_string())
		cert_bytes = base64_decode(cert_it->get<std::string>());
	if (sig_it->is_string())
		sig_bytes = base64_decode(sig_it->get<std::string>());
	if (!cert_bytes) {
		why = "\"cert\" is not base64";
		return RegistrationRefusal::BadCert;
	}
	std::string err;
	const auto cert = parse_cert(std::as_bytes(std::span(cert_bytes->data(), cert_bytes->size())),
				     err);
	if (!cert) {
		why = "\"cert\" is not a donor certificate: " + err;
		return RegistrationRefusal::BadCert;
	}
	const auto addr = canonical_cert_address(addr_it->get<std::string>());
	if (!addr) {
		why = fmt::format("the registered address {} is not numeric (a certificate names "
				  "numeric addresses only)",
				  addr_it->get<std::string>());
		return RegistrationRefusal::BadCert;
	}
	if (std::string problem = verifier.check(*cert, *addr); !problem.empty()) {
		why = fmt::format("donor certificate '{}' (serial {}) refused: {}", cert->name,
				  cert->serial, problem);
		return RegistrationRefusal::BadCert;
	}
	Signature sig{};
	if (!sig_bytes || sig_bytes->size() != sig.size()) {
		why = "\"sig\" is not a base64 Ed25519 signature";
		return RegistrationRefusal::BadSignature;
	}
	std::memcpy(sig.data(), sig_bytes->data(), sig.size());
	o.erase("sig");
	std::string text;
	try {
		text = o.dump();
	} catch (const json::exception &) { // (invalid UTF-8 in a string)
		why = "the value does not re-encode";
		return RegistrationRefusal::BadSignature;
	}
	if (!verify_donor_signature(*cert, registration_message(key, text), sig)) {
		why = fmt::format("the signature is not donor '{}''s over this key and value "
				  "(changed, or copied from another key)",
				  cert->name);
		return RegistrationRefusal::BadSignature;
	}
	return RegistrationRefusal::None;
}

} // namespace rdmaswap
