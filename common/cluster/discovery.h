// SPDX-License-Identifier: MIT
// The plugin's donor discovery at start (etcd=): the donors registered in etcd
// (memserver/registry.h writes them), merged into the server= list, and a local cache of the
// last listing so that a restart works with etcd down. Control path only, before nbdkit forks.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/net/etcd.h"
#include "common/util/config.h"
#include "common/util/result.h"
#include "common/wire/donor_cert.h"
#include "common/wire/registration.h"

namespace rdmaswap::discovery {

inline constexpr std::string_view kDefaultPrefix = "/rdmaswap/";

// One registered donor: the key `<prefix>donors/<addr>` and its JSON value
// {"addr","boot_id","transport","slab_size","slabs_total","slabs_free","sessions","auth"}
// ("sessions" is optional: memservers before it do not publish it), and from a certified
// memserver "ts", "cert" and "sig" (signed registrations, below). `addr` says whom to ask;
// the rest are hints, which decide nothing alone (etcd is discovery only: a donor proves itself
// with the cluster key when the plugin probes or connects it, and a new `boot_id` is only a
// reason to ask it: Membership).
struct Donor {
	Endpoint addr;
	uint64_t boot_id = 0;
	std::string transport; // "tcp", "rdma" or "auto"
	uint64_t slab_size = 0;
	uint32_t slabs_total = 0, slabs_free = 0;
	uint32_t sessions = 0; // its client sessions, attached or detached (0 if not published)
	bool auth = true;
	int64_t ts = 0; // "ts": when the memserver wrote it (unix ms; 0 if not published)
};

// The key prefix under which donors register: `prefix` + "donors/".
std::string donors_prefix(std::string_view prefix);

// ---- Bounds (issue 26): what anyone who can write to etcd can make a plugin spend ----

// A registration's value at most (what a memserver writes is about 200 bytes): a larger one is
// ignored without being parsed.
inline constexpr size_t kMaxValue = 4096;
// Donors a listing keeps (the first by key; Membership's table holds as many), and keys it
// reads at most (valid or not).
inline constexpr size_t kMaxListed = 8192;
inline constexpr size_t kMaxScanned = 4 * kMaxListed;
// A listing reads the prefix in pages of at most kPageKeys keys and kPageBytes bytes of reply
// (fewer keys when a page would be larger); a watch message larger than kPageBytes ends the
// watch (Membership lists again).
inline constexpr int64_t kPageKeys = 256;
inline constexpr size_t kPageBytes = size_t(1) << 20;

// Entries ignored, by reason, with a few examples for the log.
struct Ignored {
	uint64_t invalid = 0;   // not a registration (parse_donor refuses it)
	uint64_t too_large = 0; // a value over kMaxValue (or a key and value over kPageBytes)
	uint64_t beyond = 0;    // valid, beyond kMaxListed (or beyond kMaxScanned keys read)
	// With donor-ca= (verify_registration): unsigned, a certificate refused, a bad signature;
	// and (Membership) older than a registration of the same donor seen before.
	uint64_t unsigned_ = 0, bad_cert = 0, bad_signature = 0, replayed = 0;
	static constexpr size_t kExamples = 3;
	std::vector<std::string> examples; // "<key>: <why>", the first kExamples
	uint64_t total() const
	{
		return invalid + too_large + beyond + unsigned_ + bad_cert + bad_signature + replayed;
	}
	void note(std::string_view key, std::string_view why);
	// "3 entries ignored (1 malformed, 1 larger than 4096 bytes, 1 beyond the first 8192
	// donors), e.g. KEY: WHY; ..." ("1 entry ignored (...)"; empty when none).
	std::string summary() const;
	// Add `o`'s counts and examples (up to kExamples) to these.
	void add(const Ignored &o);
};

// The donor of the entry `key` = `value` (listed or watched) or nullopt, counted in `ignored`:
// too_large when `value` is over kMaxValue (not parsed), invalid when parse_donor refuses it,
// and with a `verifier` (donor-ca=) unsigned, bad_cert or bad_signature when
// verify_registration refuses it. Without one, unsigned registrations are accepted.
std::optional<Donor> check_donor(std::string_view prefix, std::string_view key,
				 std::string_view value, Ignored &ignored,
				 DonorVerifier *verifier = nullptr);
// The address a donor key names (`donors_prefix(prefix)` + HOST:PORT), or nullopt.
std::optional<Endpoint> donor_key_addr(std::string_view prefix, std::string_view key);

// Parse the entry `key` = `value` listed under donors_prefix(`prefix`). Fails, saying why,
// if the value is not a JSON object with every field above (but "sessions", which may be
// absent: 0) of the right type (addr a HOST:PORT with an explicit port 1..65535, boot_id 16 hex
// digits and not 0, transport one of the three names, the counts and sessions non-negative
// integers that fit, slabs_free <= slabs_total, auth a boolean, "ts" if present an integer
// 1..2^62), or if `key` is not donors_prefix(prefix) + addr exactly. Unknown fields are
// ignored (the signature, if checked, covers them).
Result<Donor> parse_donor(std::string_view prefix, std::string_view key, std::string_view value);

// The servers to use: `servers` (server=, in their order), then each of `donors` that no
// earlier entry names (same host string and port), in their order. Never reorders or drops a
// server= entry.
std::vector<Endpoint> merge(std::span<const Endpoint> servers, std::span<const Endpoint> donors);

// ---- The cache file ----
// JSON: {"version":1,"prefix":"/rdmaswap/","donors":["HOST:PORT",...]}: the donors of the last
// listing that gave at least one (not the server= entries).

// The document {"version":1,"<field>":"<value>","donors":["HOST:PORT",...]} with `donors` in
// their order: the cache's (field "prefix") and the holders record's (common/cluster/holders.h, field
// "volume").
std::string donor_document_text(std::string_view field, std::string_view value,
				std::span<const Endpoint> donors);
// Its donors in their order, and the string `field` in `value`. Fails, saying why, if `text`
// is not a JSON object with "version" 1, the string `field` and a "donors" list of HOST:PORT
// strings with an explicit port (1..65535). Unknown fields are ignored.
Result<std::vector<Endpoint>> parse_donor_document(std::string_view text, const char *field,
						   std::string &value);

// Write such a document `text` to `path` whole and durably (replace_private_file,
// common/util/private_file.h: a temporary file in the same directory, mode 0600, fsync'd, renamed
// over `path`, the directory fsync'd). The directory must exist. Throws std::runtime_error
// "cannot write the WHAT PATH: ..." (the temporary file is removed).
void write_donor_file(const std::string &path, std::string_view what, std::string_view text);
// The donors `parse` finds in the file `path`, or nullopt if it does not exist. Throws
// std::runtime_error "WHAT PATH: ..." if it cannot be read (read_small_file: a symbolic link,
// not a regular file, larger than kMaxStateFile = 1 MiB, an I/O error) or `parse` refuses it
// (fails).
using DocumentParser = std::function<Result<std::vector<Endpoint>>(std::string_view text)>;
std::optional<std::vector<Endpoint>> read_donor_file(const std::string &path, std::string_view what,
						     const DocumentParser &parse);

std::string cache_text(std::string_view prefix, std::span<const Endpoint> donors);
// Fails, saying why, if `text` is not such a document (version other than 1, an entry that is
// not a HOST:PORT with a port, a prefix other than `prefix`).
Result<std::vector<Endpoint>> parse_cache(std::string_view text, std::string_view prefix);

// Write the cache to `path` with write_donor_file: whole and durably, mode 0600, so a reader
// never sees half a file. The directory must exist. Throws std::runtime_error naming the path
// and what failed (the temporary file is removed).
void write_cache(const std::string &path, std::string_view prefix,
		 std::span<const Endpoint> donors);
// The cached donors, or nullopt if `path` does not exist (read_donor_file). Throws
// std::runtime_error naming the path if it cannot be read (a symbolic link, not a regular
// file, larger than 1 MiB, an I/O error) or parse_cache refuses it.
std::optional<std::vector<Endpoint>> read_cache(const std::string &path, std::string_view prefix);

// `name` with every byte other than [A-Za-z0-9._-] written %XX (upper-case hex): "a/b c%" gives
// "a%2Fb%20c%25". Distinct names give distinct results, none contains '/'; used for file names
// and etcd key components made of a volume name.
std::string escape_name(std::string_view name);

// A state file of `volume` beside the volume key: `<dir>/<escape_name(volume)><suffix>`, where
// <dir> is the directory of `default_key_path` (the plugin passes default_volume_key_path(),
// common/wire/volume_key.h: systemd's StateDirectory=, /var/lib/rdmaswap for root, else the XDG
// state directory).
std::string state_file_path(std::string_view default_key_path, std::string_view volume,
			    std::string_view suffix);

// Where the cache of `volume` lives when donor-cache= is not given:
// state_file_path(default_key_path, volume, ".donors") (so "a/b" gives "<dir>/a%2Fb.donors").
std::string default_cache_path(std::string_view default_key_path, std::string_view volume);

// ---- The listing ----

struct ListOptions {
	std::vector<std::string> endpoints; // etcd::parse_endpoints
	std::string prefix{kDefaultPrefix};
	// The whole listing ends within `timeout` (timeout= of the plugin); each attempt on one
	// endpoint within min(timeout, 2 s) (connect: min(timeout, 1 s)), so a dead first member
	// leaves time for the others.
	std::chrono::milliseconds timeout{10000};
	// donor-ca=: only registrations signed by a certified donor are used (check_donor);
	// null: unsigned ones are used too (the behaviour before issue 26).
	std::shared_ptr<DonorVerifier> verifier;
	// etcd-cacert= ... etcd-password-file=: TLS and etcd auth, the files read once at
	// configuration; null: none.
	std::shared_ptr<const etcd::Credentials> credentials;
};

// The etcd client options of `opts`: each attempt within min(timeout, 2 s), its connect within
// min(timeout, 1 s), with its credentials. The caller bounds the whole call with a deadline of
// now + opts.timeout. Every etcd client of the plugin is made with these.
etcd::ClientOptions client_options(const ListOptions &opts);

struct Listing {
	std::vector<Donor> donors; // the valid entries, in key order, at most kMaxListed
	Ignored ignored;           // the entries left out (the caller logs ignored.summary())
	int64_t revision = 0;      // the store's revision the listing shows (a watch goes on
				   // from the next)
};

// List donors_prefix(prefix) in etcd: in pages (kPageKeys keys, fewer when a page's reply
// would exceed kPageBytes; a key whose entry alone exceeds it is skipped: too_large) that make
// one snapshot (the first page's revision; listed again from the start, within the bound, if
// it is compacted away meanwhile), each entry through check_donor, at most kMaxListed donors
// and kMaxScanned keys (the rest counted as beyond). So a listing reads at most about
// kMaxScanned entries and holds at most one page of reply, whatever etcd holds. Fails, saying
// why, if no endpoint answered within the bound (or etcd answered with an error). Never throws
// but std::bad_alloc (a libcurl that cannot be initialised is a failure like any other).
Result<Listing> list_donors(const ListOptions &opts);

// ---- Discovery at start: the listing, the cache, server= ----

struct DiscoverOptions {
	ListOptions list;
	std::vector<Endpoint> servers; // server= (may be empty)
	std::string cache_path;        // the donor cache (donor-cache= or default_cache_path)
};

// What discover() decided. `servers` = merge(server=, donors), never empty.
struct Discovered {
	enum class Source { Etcd, Cache, ServersOnly } source = Source::Etcd;
	std::vector<Endpoint> donors; // what etcd (or the cache) gave
	std::vector<Endpoint> servers;
	std::vector<Donor> registered; // etcd's entries with their hints (Source::Etcd only)
	Ignored ignored;               // the entries the listing left out (Source::Etcd only)
	int64_t revision = 0;          // the listing's revision (Source::Etcd only)
};

// The servers of a plugin started with etcd=, logged through logger("discovery"):
// - etcd answers: its valid donors (one warning for all the entries ignored, an info line
//   with how many), written to the cache when there is at least one (a cache that cannot be
//   written is a warning: the listing stands); none is a warning.
// - etcd does not answer within opts.list.timeout (every member down, or no quorum): the
//   donors of the cache, with a warning saying so; with no usable cache (missing, damaged,
//   another prefix) the server= entries alone, with a warning.
// Fails, with a message naming the cause, when that leaves no server at all (etcd lists none and
// server= is empty; etcd unreachable, no usable cache, no server=). Never throws but
// std::bad_alloc.
Result<Discovered> discover(const DiscoverOptions &opts);

} // namespace rdmaswap::discovery
