// SPDX-License-Identifier: MIT
// Tests that check a failure's reason with the value: the value of a Result
// (common/util/result.h), and its error in `why` when it has none (`why` is left alone on
// success).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "common/util/result.h"

namespace rdmaswap::test {

template <class T> std::optional<T> value_or_why(Result<T> r, std::string &why)
{
	if (!r)
		why = std::move(r.error);
	return std::move(r.value);
}

} // namespace rdmaswap::test
