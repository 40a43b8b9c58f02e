// SPDX-License-Identifier: MIT
// rdmaswapctl's certificate commands (ca, donor-key, cert, crl): see rdmaswapctl(8).
#pragma once

namespace rdmaswap {

// True if argv[1] names one of these commands.
bool is_cert_command(const char *cmd);
// Run it: 0, 1 (failed), 2 (usage).
int cert_command(int argc, char **argv);

} // namespace rdmaswap
