// SPDX-License-Identifier: MIT
// The control path's one way to fail (docs/architecture.md, "Errors"): a value, or why not.
// The data path returns errno values instead (no string, no allocation); construction throws.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace rdmaswap {

// A value, or `error` saying why there is none (a sentence naming what failed: it is logged or
// shown as is). `code` is a number the caller may act on, where the producer documents one
// (etcd's gRPC status, an errno); 0 otherwise.
template <class T> struct Result {
	std::optional<T> value;
	std::string error;
	int code = 0;

	explicit operator bool() const { return value.has_value(); }
	T &operator*() { return *value; }
	const T &operator*() const { return *value; }
	T *operator->() { return &*value; }
	const T *operator->() const { return &*value; }

	static Result of(T v) { return {std::move(v), {}, 0}; }
	static Result fail(std::string why, int c = 0) { return {std::nullopt, std::move(why), c}; }
};

// The value of a Result that has none to give.
struct Ok {};

} // namespace rdmaswap
