// SPDX-License-Identifier: MIT
// Hex and base64 (encoding.h).
#include "common/util/encoding.h"

#include <array>
#include <cstdint>

namespace rdmaswap {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int decode_char(char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

} // namespace

std::string hex(std::span<const std::byte> b)
{
	static const char digits[] = "0123456789abcdef";
	std::string s(b.size() * 2, '0');
	for (size_t i = 0; i < b.size(); i++) {
		s[2 * i] = digits[unsigned(b[i]) >> 4];
		s[2 * i + 1] = digits[unsigned(b[i]) & 15];
	}
	return s;
}

std::optional<std::vector<std::byte>> unhex(std::string_view text)
{
	if (text.size() % 2)
		return std::nullopt;
	auto nibble = [](char c) -> int {
		if (c >= '0' && c <= '9')
			return c - '0';
		if (c >= 'a' && c <= 'f')
			return c - 'a' + 10;
		return -1;
	};
	std::vector<std::byte> out(text.size() / 2);
	for (size_t i = 0; i < out.size(); i++) {
		const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return std::nullopt;
		out[i] = std::byte(hi << 4 | lo);
	}
	return out;
}

std::string base64_encode(std::string_view bytes)
{
	std::string out;
	out.reserve((bytes.size() + 2) / 3 * 4);
	size_t i = 0;
	for (; i + 3 <= bytes.size(); i += 3) {
		const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 |
				   uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
		out += kAlphabet[v >> 18 & 63];
		out += kAlphabet[v >> 12 & 63];
		out += kAlphabet[v >> 6 & 63];
		out += kAlphabet[v & 63];
	}
	if (const size_t rest = bytes.size() - i; rest) {
		uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
		if (rest == 2)
			v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
		out += kAlphabet[v >> 18 & 63];
		out += kAlphabet[v >> 12 & 63];
		out += rest == 2 ? kAlphabet[v >> 6 & 63] : '=';
		out += '=';
	}
	return out;
}

std::optional<std::string> base64_decode(std::string_view text)
{
	if (text.size() % 4)
		return std::nullopt;
	std::string out;
	out.reserve(text.size() / 4 * 3);
	for (size_t i = 0; i < text.size(); i += 4) {
		const bool last = i + 4 == text.size();
		const size_t pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
		if (pad == 1 && text[i + 2] == '=') // "x=y=" style
			return std::nullopt;
		std::array<int, 4> d{};
		for (size_t k = 0; k < 4 - pad; k++)
			if ((d[k] = decode_char(text[i + k])) < 0)
				return std::nullopt;
		const uint32_t v = uint32_t(d[0]) << 18 | uint32_t(d[1]) << 12 |
				   uint32_t(d[2]) << 6 | uint32_t(d[3]);
		if ((pad == 1 && (v & 0xff)) || (pad == 2 && (v & 0xffff)))
			return std::nullopt; // bits set in the padding: not canonical
		out += char(v >> 16);
		if (pad < 2)
			out += char(v >> 8 & 0xff);
		if (pad < 1)
			out += char(v & 0xff);
	}
	return out;
}

} // namespace rdmaswap
