#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-replica-failover.sh with a hung donor (SIGSTOP) instead of a dead one.
exec "$(dirname "$0")/test-replica-failover.sh" stop
