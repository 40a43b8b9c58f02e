#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-giveback.sh with replicas=1 (two memservers): each moved slab is copied from the
# wanted slab itself.
exec "$(dirname "$0")/test-giveback.sh" 1
