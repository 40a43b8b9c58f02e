// SPDX-License-Identifier: MIT
// Bytes as text: lower-case hex (keys and ids in logs, file names and etcd) and standard base64
// (etcd's gateway, certificates and signatures in etcd values). Pure functions, no allocation
// beyond the result.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdmaswap {

// Lower-case hex of `b`.
std::string hex(std::span<const std::byte> b);
// The bytes of lower-case hex `text` (what hex() writes); nullopt for an odd length or any
// other character.
std::optional<std::vector<std::byte>> unhex(std::string_view text);

// Standard base64 (RFC 4648, with padding), as etcd's gateway encodes bytes.
std::string base64_encode(std::string_view bytes);
// nullopt if `text` is not valid padded base64 (wrong length, a stray character, bits set in
// the padding).
std::optional<std::string> base64_decode(std::string_view text);

} // namespace rdmaswap
