// SPDX-License-Identifier: MIT
// write_new_file, replace_file, read_small_file, private_file_problem (private_file.h).
#include "common/util/private_file.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "common/util/err_text.h"
#include "common/util/fd.h"

namespace rdmaswap {

namespace {

std::string errno_text(const char *what)
{
	return std::string(what) + ": " + err_text(errno);
}

} // namespace

Result<Ok> write_new_file(const std::string &path, std::string_view bytes, FileMode how)
{
	const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
			      how.mode);
	if (fd < 0)
		return Result<Ok>::fail("open " + path + ": " + err_text(errno));
	std::string err;
	if (::fchmod(fd, how.mode) != 0) // exactly this mode, whatever the umask
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
	if (err.empty() && how.durable && ::fsync(fd) != 0)
		err = errno_text("fsync");
	if (::close(fd) != 0 && err.empty())
		err = errno_text("close");
	if (err.empty())
		return Result<Ok>::of({});
	::unlink(path.c_str());
	return Result<Ok>::fail(std::move(err));
}

Result<Ok> replace_file(const std::string &path, std::string_view bytes, FileMode how)
{
	using R = Result<Ok>;
	std::random_device rd;
	const std::string tmp = fmt::format("{}.tmp-{}-{:08x}", path, ::getpid(), rd());
	if (auto w = write_new_file(tmp, bytes, how); !w)
		return w;
	if (::rename(tmp.c_str(), path.c_str()) != 0) {
		std::string err = errno_text("rename");
		::unlink(tmp.c_str());
		return R::fail(std::move(err));
	}
	if (!how.durable)
		return R::of({});
	// The rename is an entry of the directory: durable only once the directory is synced.
	const size_t slash = path.rfind('/');
	const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/"
									    : path.substr(0, slash);
	const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return R::fail("open " + dir + ": " + err_text(errno));
	const Fd closer(fd);
	if (::fsync(fd) != 0)
		return R::fail("fsync " + dir + ": " + err_text(errno));
	return R::of({});
}

Result<std::optional<std::string>> read_small_file(const std::string &path, size_t max_bytes)
{
	using R = Result<std::optional<std::string>>;
	const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0 && errno == ENOENT)
		return R::of(std::nullopt);
	if (fd < 0 && errno == ELOOP)
		return R::fail("a symbolic link");
	if (fd < 0)
		return R::fail(err_text(errno));
	const Fd closer(fd);
	struct stat st {};
	if (::fstat(fd, &st) != 0)
		return R::fail(errno_text("fstat"));
	if (!S_ISREG(st.st_mode))
		return R::fail("not a regular file");
	if (uint64_t(st.st_size) > max_bytes)
		return R::fail(fmt::format("larger than {} bytes", max_bytes));
	std::string text(size_t(st.st_size), '\0');
	if (const int e = read_fd_into(fd, text); e != 0)
		return R::fail(std::string("read: ") + err_text(e));
	return R::of(std::move(text));
}

int read_fd_into(int fd, std::string &text)
{
	size_t done = 0;
	while (done < text.size()) {
		const ssize_t r = ::read(fd, text.data() + done, text.size() - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return errno;
		if (r == 0)
			break;
		done += size_t(r);
	}
	text.resize(done);
	return 0;
}

std::string user_text(uid_t uid)
{
	long len = ::sysconf(_SC_GETPW_R_SIZE_MAX);
	std::vector<char> buf(len > 0 ? size_t(len) : 16384);
	struct passwd pw {};
	struct passwd *found = nullptr;
	if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found && found->pw_name)
		return fmt::format("{} (uid {})", found->pw_name, unsigned(uid));
	return fmt::format("uid {}", unsigned(uid));
}

const char *file_kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
		return "a regular file";
	case S_IFDIR:
		return "a directory";
	case S_IFIFO:
		return "a FIFO";
	case S_IFSOCK:
		return "a socket";
	case S_IFCHR:
		return "a character device";
	case S_IFBLK:
		return "a block device";
	case S_IFLNK:
		return "a symbolic link";
	default:
		return "an unknown kind of file";
	}
}

std::string private_file_problem(const struct stat &st)
{
	const uid_t me = ::geteuid();
	const bool foreign = st.st_uid != me;
	const bool open_mode = (st.st_mode & 077) != 0;
	if (!foreign && !open_mode)
		return "";
	std::string text = fmt::format("owned by {}, mode {:04o}:", user_text(st.st_uid),
				       unsigned(st.st_mode & 07777));
	if (foreign)
		text += fmt::format(" not owned by {}, the user this process runs as{}",
				    user_text(me), open_mode ? ";" : "");
	if (open_mode)
		text += " open to its group or others (mode 0600 or stricter needed)";
	return text;
}

} // namespace rdmaswap
