#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Which sanitizer reports of an integration test (functions.sh's cleanup, ASan build) fail it:
#   sanitizer-reports.py REPORT...
# Prints the reports that count and exits 1 if there is one. Every ASan error, UBSan report
# and sanitizer CHECK counts. A LeakSanitizer report counts unless each of its leaks was
# allocated with no rdmaswap frame on the stack: those are nbdkit's own (its binary is not
# built with ASan and has no symbols, but with libasan preloaded its allocations are tracked
# too). This is instead of an LSan suppressions file: a suppression can only name a module,
# and "nbdkit" would also hide our leaks, whose stacks end in nbdkit's frames that called us.
import re
import sys

OURS = re.compile(r"rdmaswap|\.\./(common|memserver|nbdkit-plugin|tools)/")
LEAK = re.compile(r"^(Direct|Indirect) leak of ", re.M)

failed = False
for path in sys.argv[1:]:
    with open(path, errors="replace") as f:
        text = f.read()
    if "LeakSanitizer: detected memory leaks" not in text:
        print(f"---- sanitizer report {path} ----\n{text}")
        failed = True
        continue
    starts = [m.start() for m in LEAK.finditer(text)] + [text.find("SUMMARY:")]
    blocks = [text[a:b] for a, b in zip(starts, starts[1:])]
    ours = [b for b in blocks if OURS.search(b)]
    theirs = len(blocks) - len(ours)
    if theirs:
        print(f"{path}: {theirs} leak(s) allocated by nbdkit itself, not counted")
    if ours or not blocks:
        print(f"---- sanitizer report {path}: leaks in rdmaswap ----\n" + "".join(ours or [text]))
        failed = True
sys.exit(1 if failed else 0)
