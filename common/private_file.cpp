// SPDX-License-Identifier: MIT
// write_private_file, replace_private_file, read_small_file (private_file.h).
#include "common/private_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>

namespace rdmaswap {

namespace {

std::string errno_text(const char *what)
{
	return std::string(what) + ": " + std::strerror(errno);
}

// Closes a descriptor at the end of a scope.
struct FdCloser {
	int fd;
	~FdCloser() { ::close(fd); }
};

} // namespace

std::string write_private_file(const std::string &path, std::string_view bytes)
{
	const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
			      0600);
	if (fd < 0)
		return "open " + path + ": " + std::strerror(errno);
	std::string err;
	if (::fchmod(fd, 0600) != 0) // exactly 0600, whatever the umask
		err = errno_text("fchmod");
	for (size_t done = 0; err.empty() && done < bytes.size();) {
		const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			err = errno_text("write");
		else
			done += size_t(w);
	}
	if (err.empty() && ::fsync(fd) != 0)
		err = errno_text("fsync");
	if (::close(fd) != 0 && err.empty())
		err = errno_text("close");
	if (!err.empty())
		::unlink(path.c_str());
	return err;
}

std::string replace_private_file(const std::string &path, std::string_view bytes)
{
	std::random_device rd;
	const std::string tmp = fmt::format("{}.tmp-{}-{:08x}", path, ::getpid(), rd());
	if (std::string err = write_private_file(tmp, bytes); !err.empty())
		return err;
	if (::rename(tmp.c_str(), path.c_str()) != 0) {
		std::string err = errno_text("rename");
		::unlink(tmp.c_str());
		return err;
	}
	// The rename is an entry of the directory: durable only once the directory is synced.
	const size_t slash = path.rfind('/');
	const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/"
									    : path.substr(0, slash);
	const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return "open " + dir + ": " + std::strerror(errno);
	FdCloser closer{fd};
	if (::fsync(fd) != 0)
		return "fsync " + dir + ": " + std::strerror(errno);
	return "";
}

std::string read_small_file(const std::string &path, size_t max_bytes,
			    std::optional<std::string> &bytes)
{
	bytes.reset();
	const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0 && errno == ENOENT)
		return "";
	if (fd < 0 && errno == ELOOP)
		return "a symbolic link";
	if (fd < 0)
		return std::strerror(errno);
	FdCloser closer{fd};
	struct stat st {};
	if (::fstat(fd, &st) != 0)
		return errno_text("fstat");
	if (!S_ISREG(st.st_mode))
		return "not a regular file";
	if (uint64_t(st.st_size) > max_bytes)
		return fmt::format("larger than {} bytes", max_bytes);
	std::string text(size_t(st.st_size), '\0');
	size_t done = 0;
	while (done < text.size()) {
		const ssize_t r = ::read(fd, text.data() + done, text.size() - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return errno_text("read");
		if (r == 0)
			break;
		done += size_t(r);
	}
	text.resize(done);
	bytes = std::move(text);
	return "";
}

} // namespace rdmaswap
