// SPDX-License-Identifier: MIT
// Files only their owner may read, written whole and synced (the volume key, the donor cache,
// the holders record), small state files read back with bounds, and the check that a file
// holding secrets (a key, the backup file's swapped pages) is private to this process's user.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "common/util/result.h"

namespace rdmaswap {

// How write_new_file and replace_file make a file: its mode, set exactly whatever the umask,
// and whether it is synced (the file, and after a rename its directory) before they return.
struct FileMode {
	mode_t mode = 0600;
	bool durable = true;
};
inline constexpr FileMode kPrivateFile{0600, true};

// Create `path` (O_EXCL and O_NOFOLLOW: never an existing file, never through a symbolic link)
// with `how.mode`, write `bytes` whole, fsync it if `how.durable`, and close it. Fails saying
// what failed ("open PATH: ...", "write: ...", "fsync: ..."), and a file this call created is
// removed again. The caller renames or links it into place.
Result<Ok> write_new_file(const std::string &path, std::string_view bytes, FileMode how);
inline Result<Ok> write_private_file(const std::string &path, std::string_view bytes)
{
	return write_new_file(path, bytes, kPrivateFile);
}

// Replace `path` whole: write_new_file to a temporary file in the same directory
// (`PATH.tmp-PID-RANDOM`: a name ending in the random hex, so a reader of `*.prom` files never
// sees it), rename it over `path`, then, if `how.durable`, fsync the directory so that the
// rename survives a crash. A reader sees the old file or the new one, never half of one. The
// directory must exist. Fails saying what failed ("open ...", "rename: ...", "fsync DIR: ..."),
// and the temporary file is not left behind.
Result<Ok> replace_file(const std::string &path, std::string_view bytes, FileMode how);
// replace_file with mode 0600, durably (the volume key, the donor cache, the holders record).
inline Result<Ok> replace_private_file(const std::string &path, std::string_view bytes)
{
	return replace_file(path, bytes, kPrivateFile);
}

// The bound of read_small_file for the plugin's state files (donor cache, holders record).
inline constexpr size_t kMaxStateFile = 1 << 20;

// Read the file `path` whole. It must be a regular file (opened with O_NOFOLLOW: a symbolic
// link is refused; O_NONBLOCK: a FIFO does not block the open) of at most `max_bytes` bytes.
// Its contents, or nullopt if `path` does not exist; fails saying what failed ("a symbolic
// link", "not a regular file", "larger than N bytes", "read: ...").
Result<std::optional<std::string>> read_small_file(const std::string &path, size_t max_bytes);
// Read `fd` into `text` (sized by the caller, e.g. from fstat) until it is full or the file
// ends (then `text` is cut to what was read), retrying EINTR. 0, or the errno of a failed read
// (`text` then holds what was read so far, at its full size: wipe it if it is secret).
int read_fd_into(int fd, std::string &text);

// Whether the file `st` describes (fstat of a descriptor opened with O_NOFOLLOW) may hold
// secrets of this process: "" if it is owned by the process's effective user and has no group
// or other permission bits (mode 0600 or stricter); otherwise what is wrong, naming the owner
// and the mode, e.g. "owned by nobody (uid 65534), mode 0644: not owned by root (uid 0), the
// user this process runs as; open to its group or others (mode 0600 or stricter needed)".
// Does not look at the file's type (callers check S_ISREG first).
std::string private_file_problem(const struct stat &st);

// "a FIFO", "a directory", "a socket", "a character device", "a block device", "a symbolic
// link", "a regular file" (or "an unknown kind of file"), for error messages.
const char *file_kind(mode_t mode);

// "nobody (uid 65534)", or "uid 1234" when the user has no name.
std::string user_text(uid_t uid);

} // namespace rdmaswap
