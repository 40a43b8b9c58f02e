// SPDX-License-Identifier: MIT
// The holders record of a volume (issue 14): every donor that may hold slabs of the volume,
// written by the plugin before a donor can get its first slab of it, kept under the volume in
// etcd and in a local file beside the volume key, so that a restarted plugin contacts only
// those donors (with etcd down too) and counts as missing only those. It stays bounded (issue
// 29): a recorded donor a start cannot reach is dropped once it has been unreachable for
// longer than the lease (age_record). Control path only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/cluster/discovery.h"
#include "common/util/config.h"
#include "common/wire/volume_key.h"

namespace rdmaswap::holders {

// ---- The record ----
// JSON: {"version":1,"volume":"NAME","donors":["HOST:PORT",...],
// "unreachable_since":{"HOST:PORT":SECONDS,...}}, the donors as Endpoint::str(), sorted (by
// that text) and without duplicates. The same text in the file and in etcd. An empty list is
// a valid record: the volume holds nothing. "unreachable_since" (absent when empty: the
// format before issue 29, which older plugins read as it is) names the recorded donors that
// the last start could not reach, and since when (the wall clock, seconds since the epoch, as
// the start that first found it so read it).

// Recorded donors a start could not reach, by Endpoint::str(): since when (seconds since the
// epoch).
using Unreachable = std::map<std::string, int64_t>;

// The record's text; `unreachable` entries naming a donor not in `donors` are left out.
std::string record_text(std::string_view volume, std::span<const Endpoint> donors,
			const Unreachable &unreachable = {});

// The donors of the record `text`, sorted and without duplicates as record_text writes them
// (an entry named twice is dropped, an unsorted list accepted), and in `*unreachable` (if
// given; cleared first) its "unreachable_since" entries that name a donor of the list (others
// are dropped; a record without the field gives none). Fails, saying why, if `text` is not
// such a document: not a JSON object, no "version" 1, no "volume" or one other than `volume`,
// no "donors" list, an entry that is not a string HOST:PORT with an explicit port 1..65535, or
// an "unreachable_since" that is not an object of integers 0..2^62. Unknown fields are
// ignored.
Result<std::vector<Endpoint>> parse_record(std::string_view text, std::string_view volume,
					   Unreachable *unreachable = nullptr);

// ---- Bounded (issue 29) ----

// The record a start stores, from the one it read: the donors `reached` now (this run's
// donors, which a start just connected) are kept, and their unreachable time is cleared; of
// the other donors of `recorded` (the start could not reach them: they hold nothing this run)
// one is dropped
// - with `lease` 0 at once (nothing of a volume outlives a run with lease 0),
// - otherwise once `now` - its unreachable time > `lease`: it has not been reachable for
//   longer than the lease, so whatever it held of the volume is gone. Its time is the one
//   `unreachable` gives, or `now` (first found unreachable now, or a record written before
//   the field existed);
// and of those left at most `max_unreachable`, the first by name. Times are seconds on the
// wall clock (a clock set back makes a donor look unreachable for less long: it is kept).
struct AgedRecord {
	std::vector<Endpoint> donors;     // sorted by name, no duplicates
	Unreachable unreachable;          // for the donors kept that were not reached
	size_t dropped_lease = 0;         // unreachable for longer than the lease (or lease 0)
	size_t dropped_cap = 0;           // beyond max_unreachable
};
AgedRecord age_record(std::span<const Endpoint> recorded, std::span<const Endpoint> reached,
		      const Unreachable &unreachable, int64_t now, unsigned lease,
		      size_t max_unreachable);

// ---- The local file ----

// Write the record to `path` whole and durably (discovery::write_donor_file: a temporary file
// in the same directory, mode 0600, fsync'd, renamed over `path`, the directory fsync'd). The
// directory must exist. Throws std::runtime_error naming the path and what failed (the
// temporary file is removed).
void write_file(const std::string &path, std::string_view volume,
		std::span<const Endpoint> donors, const Unreachable &unreachable = {});

// The recorded donors (and in `*unreachable`, if given, their unreachable times), or nullopt
// if `path` does not exist (discovery::read_donor_file). Throws std::runtime_error naming the
// path if it cannot be read (a symbolic link, not a regular file, larger than 1 MiB, an I/O
// error) or parse_record refuses it (another volume's record included).
std::optional<std::vector<Endpoint>> read_file(const std::string &path, std::string_view volume,
					       Unreachable *unreachable = nullptr);

// Where the file of `volume` lives: discovery::state_file_path(default_key_path, volume,
// ".holders"), beside the volume key and the donor cache ("a/b" gives "<dir>/a%2Fb.holders").
std::string default_path(std::string_view default_key_path, std::string_view volume);

// ---- etcd ----

// The record's key: `<prefix>volumes/<escape_name(volume)>/holders` (prefix e.g. "/rdmaswap/").
// No lease: the record outlives the plugin, as the slabs do.
std::string etcd_key(std::string_view prefix, std::string_view volume);

// Signed copies (issue 26, docs/security.md "etcd"): etcd's copy is record_text's object with
// "sig" added: the base64 of the volume key's Ed25519 signature of signed_message(the etcd
// key, the object without "sig" as nlohmann::json::dump() writes it: compact, keys sorted).
// So it covers the label, the key (a record copied under another volume's key does not
// verify) and every field. Only a copy signed by this volume's own key is read: another
// volume's key (another host's, or another name's) does not verify. The local file is not
// signed (it is 0600 in the state directory); a signed text reads as a file too.
inline constexpr std::string_view kHoldersLabel = "rdmaswap-holders-v1";
// etcd_signed_message(kHoldersLabel, key, text).
std::vector<std::byte> signed_message(std::string_view key, std::string_view text);
// record_text(volume, donors, unreachable) signed for `key` by `volume_key`. Throws
// std::runtime_error if libcrypto fails.
std::string signed_text(std::string_view key, std::string_view volume,
			std::span<const Endpoint> donors, const Unreachable &unreachable,
			const VolumeKey &volume_key);
// Whether `text` carries a valid "sig" for `key` under `pub`; if not, the failure says why
// (unsigned, or not signed by this key for this key and content). Never throws but
// std::bad_alloc.
Result<Ok> verify_signed(std::string_view key, std::string_view text, const VolumePubKey &pub);

// Put the record at etcd_key(opts.prefix, volume), no lease, signed by `volume_key`
// (signed_text; null: unsigned, for tests only). Fails, saying why, unless etcd stored it (no
// endpoint answered within opts.timeout, or etcd answered an error). Bounded by opts.timeout
// overall (each attempt as discovery::client_options says). Never throws but std::bad_alloc.
Result<Ok> put_etcd(const discovery::ListOptions &opts, std::string_view volume,
		    std::span<const Endpoint> donors, const Unreachable &unreachable = {},
		    const VolumeKey *volume_key = nullptr);

// What get_etcd found.
struct EtcdRecord {
	enum class Status {
		Failed, // no answer within the bound, an error of etcd, or a record parse_record
			// refuses: `why` says which
		Absent, // etcd answered: there is no record of the volume
		Found,  // etcd answered with the record: `donors`
		Ignored, // etcd answered with a copy not signed by the volume key (`why`): to be
			 // treated as Absent, and counted
	} status = Status::Failed;
	std::vector<Endpoint> donors; // Found: sorted, no duplicates (may be empty)
	Unreachable unreachable;      // Found: the record's unreachable times
	std::string why;              // Failed, Ignored: why
};

// Read the record at etcd_key(opts.prefix, volume); with `pub` (the volume's public key) a
// copy that verify_signed refuses is Ignored (null: no check, for tests only). Bounded by
// opts.timeout overall. Never throws but std::bad_alloc.
EtcdRecord get_etcd(const discovery::ListOptions &opts, std::string_view volume,
		    const VolumePubKey *pub = nullptr);

} // namespace rdmaswap::holders
