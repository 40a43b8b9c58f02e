// SPDX-License-Identifier: MIT
// write_private_file (private_file.h).
#include "common/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rdmaswap {

std::string write_private_file(const std::string &path, std::string_view bytes)
{
	const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
			      0600);
	if (fd < 0)
		return "open " + path + ": " + std::strerror(errno);
	std::string err;
	if (::fchmod(fd, 0600) != 0) // exactly 0600, whatever the umask
		err = std::string("fchmod: ") + std::strerror(errno);
	for (size_t done = 0; err.empty() && done < bytes.size();) {
		const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			err = std::string("write: ") + std::strerror(errno);
		else
			done += size_t(w);
	}
	if (err.empty() && ::fsync(fd) != 0)
		err = std::string("fsync: ") + std::strerror(errno);
	if (::close(fd) != 0 && err.empty())
		err = std::string("close: ") + std::strerror(errno);
	if (!err.empty())
		::unlink(path.c_str());
	return err;
}

} // namespace rdmaswap
