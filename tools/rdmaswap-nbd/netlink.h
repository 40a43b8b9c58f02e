// SPDX-License-Identifier: MIT
// rdmaswap-nbd: the kernel's generic-netlink "nbd" family (NBD_CMD_CONNECT, _RECONFIGURE,
// _DISCONNECT): a message builder and the socket that sends it and reads the answer.
#pragma once

#include <linux/genetlink.h>
#include <linux/nbd-netlink.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tools/rdmaswap-nbd/nbd.h"

namespace rdmaswap::nbd {


class Msg {
public:
	Msg(uint16_t type, uint16_t flags, uint8_t cmd, uint8_t version)
	{
		buf_.resize(NLMSG_HDRLEN + GENL_HDRLEN);
		auto *nh = reinterpret_cast<nlmsghdr *>(buf_.data());
		nh->nlmsg_type = type;
		nh->nlmsg_flags = uint16_t(NLM_F_REQUEST | NLM_F_ACK | flags);
		nh->nlmsg_seq = 1;
		auto *gh = reinterpret_cast<genlmsghdr *>(buf_.data() + NLMSG_HDRLEN);
		gh->cmd = cmd;
		gh->version = version;
	}
	void put(uint16_t type, const void *data, size_t len)
	{
		nlattr a{};
		a.nla_len = uint16_t(NLA_HDRLEN + len);
		a.nla_type = type;
		const size_t at = buf_.size();
		buf_.resize(at + NLA_ALIGN(a.nla_len));
		std::memcpy(buf_.data() + at, &a, sizeof(a));
		if (len)
			std::memcpy(buf_.data() + at + NLA_HDRLEN, data, len);
	}
	void u32(uint16_t type, uint32_t v) { put(type, &v, sizeof(v)); }
	void u64(uint16_t type, uint64_t v) { put(type, &v, sizeof(v)); }
	void str(uint16_t type, const std::string &s) { put(type, s.c_str(), s.size() + 1); }
	size_t begin_nest(uint16_t type)
	{
		const size_t at = buf_.size();
		put(uint16_t(type | NLA_F_NESTED), nullptr, 0);
		return at;
	}
	void end_nest(size_t at)
	{
		nlattr a;
		std::memcpy(&a, buf_.data() + at, sizeof(a));
		a.nla_len = uint16_t(buf_.size() - at);
		std::memcpy(buf_.data() + at, &a, sizeof(a));
	}
	std::vector<uint8_t> &finish()
	{
		reinterpret_cast<nlmsghdr *>(buf_.data())->nlmsg_len = uint32_t(buf_.size());
		return buf_;
	}

private:
	std::vector<uint8_t> buf_;
};

class Genl {
public:
	Genl()
	{
		fd_ = Fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_GENERIC));
		if (fd_.get() < 0)
			fail("netlink: socket(NETLINK_GENERIC)", errno);
		sockaddr_nl sa{};
		sa.nl_family = AF_NETLINK;
		if (::bind(fd_.get(), reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) < 0)
			fail("netlink: bind", errno);
		struct timeval tv{30, 0};
		::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	}

	// The id of the "nbd" family (registered when the nbd module is loaded).
	uint16_t nbd_family()
	{
		Msg m(GENL_ID_CTRL, 0, CTRL_CMD_GETFAMILY, 1);
		m.str(CTRL_ATTR_FAMILY_NAME, NBD_GENL_FAMILY_NAME);
		uint16_t id = 0;
		const int err = transact(m, [&](const nlattr *a) {
			if ((a->nla_type & NLA_TYPE_MASK) == CTRL_ATTR_FAMILY_ID)
				std::memcpy(&id, reinterpret_cast<const uint8_t *>(a) + NLA_HDRLEN, sizeof(id));
		});
		if (err == ENOENT)
			fail("netlink: no generic-netlink family \"nbd\" (is the nbd module loaded? modprobe nbd)", err);
		if (err)
			fail("netlink: CTRL_CMD_GETFAMILY nbd", err);
		if (!id)
			fail("netlink: CTRL_CMD_GETFAMILY nbd: no family id in the reply");
		return id;
	}

	// Sends M, calls on_attr for each top-level attribute of every reply, returns the ack's
	// errno (0 = success).
	template <typename F> int transact(Msg &m, F on_attr)
	{
		auto &b = m.finish();
		sockaddr_nl to{};
		to.nl_family = AF_NETLINK;
		if (::sendto(fd_.get(), b.data(), b.size(), 0, reinterpret_cast<sockaddr *>(&to), sizeof(to)) < 0)
			fail("netlink: sendto", errno);
		std::vector<uint8_t> rb(65536);
		for (;;) {
			ssize_t n = ::recv(fd_.get(), rb.data(), rb.size(), 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0)
				fail("netlink: waiting for the kernel's answer", errno);
			int len = int(n);
			// (NLMSG_OK compares the u32 nlmsg_len with the int length, as netlink(7) shows
			// it used: clang's -Wsign-compare flags the macro.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
			for (auto *nh = reinterpret_cast<nlmsghdr *>(rb.data()); NLMSG_OK(nh, len);
			     nh = NLMSG_NEXT(nh, len)) {
				if (nh->nlmsg_type == NLMSG_ERROR) {
					auto *e = static_cast<nlmsgerr *>(NLMSG_DATA(nh));
					return -e->error;
				}
				if (nh->nlmsg_type == NLMSG_DONE)
					return 0;
				const auto *p = static_cast<const uint8_t *>(NLMSG_DATA(nh)) + GENL_HDRLEN;
				int alen = int(nh->nlmsg_len) - int(NLMSG_HDRLEN + GENL_HDRLEN);
				for (auto *a = reinterpret_cast<const nlattr *>(p); alen >= int(NLA_HDRLEN) && a->nla_len >= NLA_HDRLEN && a->nla_len <= alen;
				     alen -= NLA_ALIGN(a->nla_len), a = reinterpret_cast<const nlattr *>(reinterpret_cast<const uint8_t *>(a) + NLA_ALIGN(a->nla_len)))
					on_attr(a);
			}
#pragma GCC diagnostic pop
		}
	}

private:
	Fd fd_;
};

} // namespace rdmaswap::nbd
