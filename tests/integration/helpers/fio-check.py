#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# fio-check.py FIO_JSON MIN_READ_BYTES [MIN_WRITE_BYTES]: fail unless every fio job in the JSON
# output ended without error and the jobs together read (verified) and wrote at least the given bytes.
import json, sys

text = open(sys.argv[1]).read()
# fio may print notices ("fio: connected to NBD server") before the JSON object.
doc = json.loads(text[text.index("{"):])
min_read = int(sys.argv[2])
min_write = int(sys.argv[3]) if len(sys.argv) > 3 else 0
read = write = 0
for job in doc["jobs"]:
    if job["error"] != 0:
        sys.exit("fio job %s: error %d" % (job["jobname"], job["error"]))
    read += job["read"]["io_bytes"]
    write += job["write"]["io_bytes"]
print("fio: %d jobs, read %d bytes, wrote %d bytes" % (len(doc["jobs"]), read, write))
if read < min_read:
    sys.exit("fio read (verified) only %d bytes, expected >= %d" % (read, min_read))
if write < min_write:
    sys.exit("fio wrote only %d bytes, expected >= %d" % (write, min_write))
