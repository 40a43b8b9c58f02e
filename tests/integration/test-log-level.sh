#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The plugin's log level: warnings always reach nbdkit's log; the project's debug messages only
# with -D rdmaswap.debug=1 (nbdkit's debug flag), not by default (info). Both runs use -v, or
# nbdkit would print no debug or info message at all.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_build memserver plugin

start_memserver 16M 1M
# A debug message of the plugin's loggers (RemoteServer, at session start), as nbdkit prints it.
debug_line='debug: client: memserver .* session '
# A warning of the plugin's loggers (a fresh volume starts empty), written to nbdkit's log
# destination as a warning, without nbdkit_error's "error:" (issue 29).
warn_line='rdmaswap: warning: volume: no memserver kept anything'

start_nbdkit info -v -- server="$MEMSERVER_ADDR" size=4M volume=info
info_log=$NBDKIT_LOG
wait_until 20 "the plugin's start-up debug line" grep -q 'rdmaswap: volume of' "$info_log"
grep -q "$warn_line" "$info_log" || fail "no warning in nbdkit's log: $warn_line"
if grep -q "$debug_line" "$info_log"; then
	grep "$debug_line" "$info_log" >&2
	fail "debug messages logged without -D rdmaswap.debug=1"
fi

start_nbdkit debug -v -D rdmaswap.debug=1 -- server="$MEMSERVER_ADDR" size=4M volume=debug
wait_until 20 "the plugin's start-up debug line" grep -q 'rdmaswap: volume of' "$NBDKIT_LOG"
grep -q "$warn_line" "$NBDKIT_LOG" || fail "no warning in nbdkit's log: $warn_line"
grep -q "$debug_line" "$NBDKIT_LOG" || fail "no debug message with -D rdmaswap.debug=1"
log "default: warnings, no debug; -D rdmaswap.debug=1: $(grep -c "$debug_line" "$NBDKIT_LOG") debug line(s)"
exit 0
