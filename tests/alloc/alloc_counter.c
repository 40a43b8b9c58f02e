// SPDX-License-Identifier: MIT
// LD_PRELOAD shim that counts heap allocations of a whole process while counting is on.
//
//   mkfifo CTL
//   LD_PRELOAD=librdmaswap-alloc-counter.so ALLOC_COUNTER_CTL=CTL ALLOC_COUNTER_OUT=FILE
//       [ALLOC_COUNTER_TRACE=FILE] [ALLOC_COUNTER_COMM=prog] prog
//   echo 1 >CTL   reset the counters and start counting; FILE then holds "counting"
//   echo 0 >CTL   stop counting; FILE then holds "allocs=N frees=M"
//
// A thread of the shim reads the FIFO, so the program sees no signal (a signal would interrupt
// its system calls and could make it allocate: nbdkit's accept loop does after EINTR). The
// process must not fork after start (run nbdkit with -f).
//
// Every call of malloc, calloc, realloc, reallocarray, memalign, aligned_alloc, posix_memalign,
// valloc and pvalloc counts as one allocation (glibc routes its own internal allocations, and
// libstdc++'s operator new, through these symbols). With ALLOC_COUNTER_TRACE, the backtraces of
// the first 16 counted allocations are written to that file, so that a failure names the code.
// Memory comes from glibc's allocator (__libc_malloc and friends), so nothing else changes.
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t size);
extern void *__libc_valloc(size_t size);
extern void *__libc_pvalloc(size_t size);

#define EXPORT __attribute__((visibility("default")))
enum { kMaxTraces = 16, kMaxFrames = 48 };

static atomic_int counting;
static atomic_ulong allocs, frees;
static atomic_int traces_left;
static int trace_fd = -1;
static const char *out_path;
// Set while this thread writes a backtrace (which may itself allocate).
static __thread int in_trace __attribute__((tls_model("initial-exec")));

static void put(int fd, const char *s)
{
	size_t len = strlen(s);
	while (len > 0) {
		const ssize_t n = write(fd, s, len);
		if (n <= 0)
			return;
		s += n;
		len -= (size_t)n;
	}
}

// Decimal digits of v into buf (at least 21 bytes); async-signal-safe.
static const char *num(unsigned long v, char *buf)
{
	char *p = buf + 20;
	*p = '\0';
	do {
		*--p = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	return p;
}

static void note_alloc(const char *what, size_t size)
{
	if (!atomic_load_explicit(&counting, memory_order_relaxed) || in_trace)
		return;
	atomic_fetch_add(&allocs, 1);
	if (trace_fd < 0 || atomic_fetch_sub(&traces_left, 1) <= 0)
		return;
	in_trace = 1;
	void *frames[kMaxFrames];
	const int n = backtrace(frames, kMaxFrames);
	char b1[21], b2[21];
	put(trace_fd, "---- ");
	put(trace_fd, what);
	put(trace_fd, "(");
	put(trace_fd, num(size, b1));
	put(trace_fd, ") in thread ");
	put(trace_fd, num((unsigned long)gettid(), b2));
	put(trace_fd, "\n");
	backtrace_symbols_fd(frames, n, trace_fd);
	in_trace = 0;
}

static void write_out(const char *a, const char *b, const char *c, const char *d)
{
	if (!out_path)
		return;
	const int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	put(fd, a);
	put(fd, b);
	put(fd, c);
	put(fd, d);
	close(fd);
}

static void *control(void *arg)
{
	const int fd = *(int *)arg;
	for (;;) {
		char c;
		const ssize_t n = read(fd, &c, 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n != 1)
			return NULL;
		if (c == '1') {
			atomic_store(&allocs, 0);
			atomic_store(&frees, 0);
			atomic_store(&counting, 1);
			write_out("counting\n", "", "", "");
		} else if (c == '0') {
			atomic_store(&counting, 0);
			char b1[21], b2[21];
			write_out("allocs=", num(atomic_load(&allocs), b1), " frees=",
				  num(atomic_load(&frees), b2));
		}
	}
}

__attribute__((constructor)) static void init(void)
{
	// Only in the named program, not in the helpers a test script starts with the same
	// environment.
	const char *comm = getenv("ALLOC_COUNTER_COMM");
	if (comm && strcmp(comm, program_invocation_short_name) != 0)
		return;
	out_path = getenv("ALLOC_COUNTER_OUT");
	const char *trace = getenv("ALLOC_COUNTER_TRACE");
	if (trace && *trace) {
		trace_fd = open(trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		atomic_store(&traces_left, kMaxTraces);
		// The first backtrace() loads libgcc's unwinder: do it now, not while counting.
		void *frames[2];
		backtrace(frames, 2);
	}
	const char *ctl = getenv("ALLOC_COUNTER_CTL");
	if (!ctl || !*ctl)
		return;
	// O_RDWR: the FIFO never reports end of file when a writer closes it.
	static int ctl_fd;
	ctl_fd = open(ctl, O_RDWR | O_CLOEXEC);
	if (ctl_fd < 0)
		return;
	// The control thread blocks every signal, so the program's signals go to its own threads.
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_create(&t, &attr, control, &ctl_fd);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

EXPORT void *malloc(size_t size)
{
	note_alloc("malloc", size);
	return __libc_malloc(size);
}

EXPORT void *calloc(size_t n, size_t size)
{
	note_alloc("calloc", n * size);
	return __libc_calloc(n, size);
}

EXPORT void *realloc(void *p, size_t size)
{
	note_alloc("realloc", size);
	return __libc_realloc(p, size);
}

EXPORT void *reallocarray(void *p, size_t n, size_t size)
{
	if (size && n > SIZE_MAX / size) {
		errno = ENOMEM;
		return NULL;
	}
	note_alloc("reallocarray", n * size);
	return __libc_realloc(p, n * size);
}

EXPORT void free(void *p)
{
	if (p && atomic_load_explicit(&counting, memory_order_relaxed))
		atomic_fetch_add(&frees, 1);
	__libc_free(p);
}

EXPORT void *memalign(size_t align, size_t size)
{
	note_alloc("memalign", size);
	return __libc_memalign(align, size);
}

EXPORT void *aligned_alloc(size_t align, size_t size)
{
	note_alloc("aligned_alloc", size);
	return __libc_memalign(align, size);
}

EXPORT int posix_memalign(void **out, size_t align, size_t size)
{
	if (align < sizeof(void *) || (align & (align - 1)) != 0)
		return EINVAL;
	note_alloc("posix_memalign", size);
	void *p = __libc_memalign(align, size);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

EXPORT void *valloc(size_t size)
{
	note_alloc("valloc", size);
	return __libc_valloc(size);
}

EXPORT void *pvalloc(size_t size)
{
	note_alloc("pvalloc", size);
	return __libc_pvalloc(size);
}
