// SPDX-License-Identifier: MIT
// Helpers shared by the unit tests of the plugin's state files (the donor cache, the holders
// record): a scratch directory and endpoints as text.
#pragma once

#include <catch2/catch.hpp>

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "common/util/config.h"

namespace rdmaswap::test {

// Each endpoint as Endpoint::str(), in order.
inline std::vector<std::string> strs(const std::vector<Endpoint> &eps)
{
	std::vector<std::string> out;
	for (const auto &e : eps)
		out.push_back(e.str());
	return out;
}

// A fresh directory under $TMPDIR, removed with what the test put in it at the end.
struct TempDir {
	std::filesystem::path path;
	TempDir()
	{
		std::string t = std::filesystem::temp_directory_path() / "rdmaswap-state.XXXXXX";
		REQUIRE(::mkdtemp(t.data()));
		path = t;
	}
	~TempDir()
	{
		std::error_code ec; // best effort: a destructor must not throw
		std::filesystem::remove_all(path, ec);
	}
};

} // namespace rdmaswap::test
