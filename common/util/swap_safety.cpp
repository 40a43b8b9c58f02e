// SPDX-License-Identifier: MIT
#include "common/util/swap_safety.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#include <cerrno>
#include <cstdio>
#include <cstddef>
#include <cstring>

#include "common/util/err_text.h"

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57
#endif
#ifndef MCL_ONFAULT
#define MCL_ONFAULT 4
#endif

namespace rdmaswap {

Result<Ok> set_io_flusher()
{
	if (prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) != 0)
		return Result<Ok>::fail(std::string("PR_SET_IO_FLUSHER: ") + err_text(errno));
	return Result<Ok>::of({});
}

Result<Ok> set_realtime(int priority)
{
	sched_param sp{};
	sp.sched_priority = priority;
	if (sched_setscheduler(0, SCHED_RR, &sp) != 0)
		return Result<Ok>::fail("sched_setscheduler(SCHED_RR, " + std::to_string(priority) +
					"): " + err_text(errno));
	return Result<Ok>::of({});
}

Result<Ok> lock_memory_onfault()
{
	// Two calls: MCL_FUTURE without MCL_CURRENT only changes the default for new mappings,
	// so the pages locked by the first call stay populated.
	if (mlockall(MCL_CURRENT) != 0)
		return Result<Ok>::fail(std::string("mlockall(MCL_CURRENT): ") + err_text(errno));
	if (mlockall(MCL_FUTURE | MCL_ONFAULT) != 0)
		return Result<Ok>::fail(std::string("mlockall(MCL_FUTURE|MCL_ONFAULT): ") +
					err_text(errno));
	return Result<Ok>::of({});
}

void prefault_stack(size_t bytes)
{
	// A variable-length array would do it in one frame; a fixed chunk per recursion level
	// keeps the compiler from folding it away and stays within the requested depth.
	constexpr size_t kChunk = 16 * 1024;
	volatile unsigned char chunk[kChunk];
	for (size_t i = 0; i < kChunk; i += 4096)
		chunk[i] = 0;
	if (bytes > kChunk)
		prefault_stack(bytes - kChunk);
	chunk[0] = chunk[kChunk - 1];
}

long locked_kib()
{
	FILE *f = std::fopen("/proc/self/status", "re");
	if (!f)
		return 0;
	char line[256];
	long kb = 0;
	while (std::fgets(line, sizeof line, f))
		if (std::sscanf(line, "VmLck: %ld kB", &kb) == 1)
			break;
	std::fclose(f);
	return kb;
}

} // namespace rdmaswap
