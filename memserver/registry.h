// SPDX-License-Identifier: MIT
// --etcd: the memserver's registration in etcd, kept by a background thread of its own (a key
// under a lease, kept alive; free capacity and client sessions published as hints; removed on a
// clean stop).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/net/etcd.h"
#include "common/wire/donor_cert.h"

namespace rdmaswap {

struct RegistryOptions {
	std::vector<std::string> endpoints; // etcd client URLs (etcd::parse_endpoints)
	std::string prefix = "/rdmaswap/";  // the key is <prefix>donors/<advertise>
	std::string advertise;              // HOST:PORT that clients dial
	std::string transport;              // "tcp", "rdma" or "auto": what is served
	bool auth = true;                   // false: --insecure
	uint64_t slab_size = 0;
	uint32_t slabs_total = 0;
	uint64_t boot_id = 0; // random per start: a new one tells clients the slabs are gone
	// --donor-key, --donor-cert: the registration is signed (sign_registration),
	// so that plugins with donor-ca= use it. Null: unsigned (they ignore it).
	std::shared_ptr<const SigningKey> donor_key;
	std::vector<std::byte> donor_cert;
	std::chrono::seconds ttl{10};                 // the lease's TTL
	std::chrono::milliseconds keepalive{3000};    // keepalive period
	std::chrono::milliseconds poll{500};          // how often the hints are looked at
	std::chrono::milliseconds min_update{2000};   // re-puts at most this often
	std::chrono::milliseconds settle{5000};       // any smaller change is put after this
	std::chrono::milliseconds backoff_max{5000};  // retry period cap while etcd is away
	std::chrono::milliseconds timeout{2000};      // each etcd request, per endpoint
	std::chrono::milliseconds stop_bound{2000};   // the deregistration at stop
	// TLS and etcd auth (--etcd-cacert ... --etcd-password-file), read at start; null: none.
	std::shared_ptr<const etcd::Credentials> credentials;
};

// What the value says that changes while the memserver runs: hints for the clients' choice of
// donors, never promises (an ALLOC still decides).
struct RegistryHints {
	uint32_t slabs_free = 0;
	uint32_t sessions = 0; // client sessions, attached or detached (STATS sessions=)
};

// A random 64-bit boot id (never 0).
uint64_t make_boot_id();
// The key and the JSON value the memserver registers (tests/unit/net/test_etcd.cpp reads them):
// {"addr","boot_id","transport","slab_size","slabs_total","slabs_free","sessions","auth","ts"}
// with `ts_ms` (unix milliseconds; 0: now), and with a donor key "cert" and "sig"
// (sign_registration over the key and every field). Throws std::runtime_error if
// signing fails.
std::string registry_key(const RegistryOptions &o);
std::string registry_value(const RegistryOptions &o, const RegistryHints &h, int64_t ts_ms = 0);

class Registry {
public:
	// Starts the registry thread. `hints` is called on that thread only (every `poll`); it
	// must not block on anything the data path holds. The value is put again when slabs_free
	// moved by 5 % of slabs_total or more, or sessions changed at all, at most every
	// `min_update`; a smaller change of slabs_free is put `settle` after the last put, so the
	// value converges on the truth once the memserver is quiet. Throws only if the etcd client
	// cannot be made (libcurl).
	Registry(RegistryOptions opts, std::function<RegistryHints()> hints);
	~Registry(); // stop()
	Registry(const Registry &) = delete;
	Registry &operator=(const Registry &) = delete;

	// Stop the thread and, if registered, delete the key and revoke the lease, all within
	// opts.stop_bound (then it gives up: the lease expires by itself within its TTL).
	// Idempotent.
	void stop();

private:
	void run();
	// Wait until `until` or stop(); true if stopping.
	bool sleep_until(std::chrono::steady_clock::time_point until);

	const RegistryOptions opts_;
	const std::string key_;
	std::function<RegistryHints()> hints_;
	etcd::Client client_;
	std::mutex mu_;
	std::condition_variable cv_;
	bool stopping_ = false; // under mu_
	std::chrono::steady_clock::time_point stop_deadline_{}; // under mu_, set by stop()
	std::thread thread_;
};

} // namespace rdmaswap
