// SPDX-License-Identifier: MIT
// Small helpers of the unit tests of keys and certificates (test_donor_cert, test_signed_etcd).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/wire/auth.h"

namespace rdmaswap::test {

// A secret key made of the bytes of `s` (a cluster key, or the secret of an Ed25519 key).
inline std::shared_ptr<const AuthKey> secret(const std::string &s)
{
	return std::make_shared<const AuthKey>(std::as_bytes(std::span(s.data(), s.size())));
}

// Unix time now, in seconds (certificate validity).
inline int64_t now_s()
{
	return std::chrono::duration_cast<std::chrono::seconds>(
		       std::chrono::system_clock::now().time_since_epoch())
		.count();
}

} // namespace rdmaswap::test
