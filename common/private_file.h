// SPDX-License-Identifier: MIT
// Files only their owner may read, written whole and synced (the volume key, the donor cache,
// the holders record), and small state files read back with bounds.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace rdmaswap {

// Create `path` (O_EXCL and O_NOFOLLOW: never an existing file, never through a symbolic link)
// with mode exactly 0600 whatever the umask, write `bytes` whole, fsync and close it. Returns
// "" on success; otherwise what failed ("open PATH: ...", "write: ...", "fsync: ..."), and a
// file this call created is removed again. The caller renames or links it into place.
std::string write_private_file(const std::string &path, std::string_view bytes);

// Replace `path` whole and durably: write_private_file to a temporary file in the same
// directory (`PATH.tmp-PID-RANDOM`), rename it over `path`, then fsync the directory so that
// the rename survives a crash. A reader sees the old file or the new one, never half of one.
// The directory must exist. Returns "" on success; otherwise what failed ("open ...",
// "rename: ...", "fsync DIR: ..."), and the temporary file is not left behind.
std::string replace_private_file(const std::string &path, std::string_view bytes);

// The bound of read_small_file for the plugin's state files (donor cache, holders record).
inline constexpr size_t kMaxStateFile = 1 << 20;

// Read the file `path` whole into `bytes`. It must be a regular file (opened with O_NOFOLLOW:
// a symbolic link is refused; O_NONBLOCK: a FIFO does not block the open) of at most
// `max_bytes` bytes. Returns "" with `bytes` set to its contents, or "" with `bytes` nullopt
// if `path` does not exist; otherwise what failed ("a symbolic link", "not a regular file",
// "larger than N bytes", "read: ...") and `bytes` is nullopt.
std::string read_small_file(const std::string &path, size_t max_bytes,
			    std::optional<std::string> &bytes);

} // namespace rdmaswap
