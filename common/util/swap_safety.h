// SPDX-License-Identifier: MIT
// What a process on the swap path (nbdkit with the plugin, a memserver on the same host) does so
// that serving a page-out never waits on the reclaim that the page-out is meant to satisfy.
#pragma once

#include <cstddef>
#include <string>

#include "common/util/result.h"

namespace rdmaswap {

// PR_SET_IO_FLUSHER (Linux >= 5.6, needs CAP_SYS_RESOURCE) on the calling thread: its memory
// allocations do no I/O in reclaim (PF_MEMALLOC_NOIO) and it is not throttled by other writers'
// dirty pages. Threads created afterwards inherit it, so call it before starting any.
// Fails, saying why, if it cannot.
Result<Ok> set_io_flusher();

// SCHED_RR at `priority` (1-99) for the calling thread; threads created afterwards inherit it,
// so call it before starting any. Needs CAP_SYS_NICE or a sufficient RLIMIT_RTPRIO. Besides
// the scheduling, the page allocator lets real-time tasks take pages below the min watermark
// (a quarter of vm.min_free_kbytes), which ordinary tasks cannot: when the whole host is short
// of memory and every page-out waits on this process, its socket buffers and kernel objects
// still come from that reserve instead of waiting on the reclaim that waits on it.
// Fails, saying why, if it cannot.
Result<Ok> set_realtime(int priority = 1);

// Locks the pages mapped now (MCL_CURRENT) and makes every later mapping locked as it is faulted
// in (MCL_FUTURE | MCL_ONFAULT: a new 8 MiB thread stack does not get populated at once).
// Fails, saying why, if it cannot.
Result<Ok> lock_memory_onfault();

// Touches `bytes` of the calling thread's stack now, so that serving requests later does not
// fault in stack pages (under MCL_FUTURE | MCL_ONFAULT they then stay locked). A page fault on
// the swap path needs a free page exactly when there may be none. Call first thing in a thread.
void prefault_stack(size_t bytes = 256 * 1024);

// VmLck of this process in KiB (from /proc/self/status; 0 if unknown).
long locked_kib();

} // namespace rdmaswap
