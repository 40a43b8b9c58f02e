// SPDX-License-Identifier: MIT
// Catch2 main for the unit tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
