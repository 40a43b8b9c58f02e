// SPDX-License-Identifier: MIT
// The slab bytes are the clients' business: under ThreadSanitizer the memserver's copies into
// and out of slabs (a WRITE's payload, a READ's reply) are not checked.
#pragma once

// Two connections may touch the same slab bytes at once (another channel of the same client; a
// repair copy reading a block while a write lands in it): the client orders what it needs and
// copies again what changed, like a disk's sectors, and RDMA does the same in the NIC, out of
// any sanitizer's sight. What the memserver itself shares between connections (ownership,
// in-flight counts, sessions) is atomic or locked and stays checked: only the accesses made
// inside an UncheckedSlabBytes scope, on this thread, are left out.
//
// A suppression (tests/tsan.supp) would hide the reports too, but ThreadSanitizer still builds
// and symbolizes a report for every new racy address before it matches it: with slabs copied
// by the MiB under load, the loops spent seconds in it and clients timed out (the give-back
// tests under TSan).

#if defined(__SANITIZE_THREAD__)
#define RDMASWAP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RDMASWAP_TSAN 1
#endif
#endif

#ifdef RDMASWAP_TSAN
extern "C" {
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
}
#endif

namespace rdmaswap {

// Scope in which this thread's memory accesses (including those of the system calls it makes,
// e.g. recv into a slab or sendmsg from one) are not checked by ThreadSanitizer. Nothing in
// other builds.
class UncheckedSlabBytes {
public:
#ifdef RDMASWAP_TSAN
	UncheckedSlabBytes()
	{
		AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
		AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
	}
	~UncheckedSlabBytes()
	{
		AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
		AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
	}
#else
	// User-provided (not `= default`), so that a scope's otherwise unused guard is no
	// unused-variable warning in other builds.
	UncheckedSlabBytes() {}
	~UncheckedSlabBytes() {}
#endif
	UncheckedSlabBytes(const UncheckedSlabBytes &) = delete;
	UncheckedSlabBytes &operator=(const UncheckedSlabBytes &) = delete;
};

} // namespace rdmaswap
