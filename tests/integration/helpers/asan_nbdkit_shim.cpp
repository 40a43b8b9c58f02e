// SPDX-License-Identifier: MIT
// Preloaded (after libasan or libtsan) into nbdkit by the integration tests of an ASan or TSan
// build only; see tests/integration/meson.build. It defines swift_demangle, which ASan (and
// TSan) looks up with dlsym() as it initializes. A libasan preloaded into an uninstrumented nbdkit initializes lazily, at the
// first malloc, which is inside libp11-kit's constructor (nbdkit -> gnutls -> p11-kit) while
// newlocale() holds glibc's locale lock; the failed lookup's dlerror() takes that lock again and
// leaves it broken, and nbdkit then hangs at exit (p11-kit's destructor waits on the lock for
// ever). Found there, not in rdmaswap: `nbdkit memory` hangs the same way. With the symbol
// present the lookup succeeds and nothing touches the lock.
#include <cstddef>
#include <cstdint>

extern "C" __attribute__((visibility("default"))) char *
swift_demangle(const char *, size_t, char *, size_t *, uint32_t)
{
	return nullptr; // "not a Swift name": ASan then prints the name as it is
}
