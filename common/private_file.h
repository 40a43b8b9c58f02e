// SPDX-License-Identifier: MIT
// Files only their owner may read, written whole and synced: the volume key, the donor cache.
#pragma once

#include <string>
#include <string_view>

namespace rdmaswap {

// Create `path` (O_EXCL and O_NOFOLLOW: never an existing file, never through a symbolic link)
// with mode exactly 0600 whatever the umask, write `bytes` whole, fsync and close it. Returns
// "" on success; otherwise what failed ("open PATH: ...", "write: ...", "fsync: ..."), and a
// file this call created is removed again. The caller renames or links it into place.
std::string write_private_file(const std::string &path, std::string_view bytes);

} // namespace rdmaswap
