// SPDX-License-Identifier: MIT
// A listening TCP socket on 127.0.0.1 with a port the kernel picks, for the unit tests' fake
// memservers.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include "common/net/socket.h"

namespace rdmaswap::test {

// Listens on 127.0.0.1 (backlog 8); `a` gets the address, port included.
inline Fd listen_loopback(sockaddr_in &a)
{
	Fd ls(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
	a = sockaddr_in{};
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	REQUIRE(::bind(ls.get(), reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
	REQUIRE(::listen(ls.get(), 8) == 0);
	socklen_t len = sizeof a;
	REQUIRE(::getsockname(ls.get(), reinterpret_cast<sockaddr *>(&a), &len) == 0);
	return ls;
}

} // namespace rdmaswap::test
