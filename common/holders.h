// SPDX-License-Identifier: MIT
// The holders record of a volume (issue 14): every donor that may hold slabs of the volume,
// written by the plugin before a donor can get its first slab of it, kept under the volume in
// etcd and in a local file beside the volume key, so that a restarted plugin contacts only
// those donors (with etcd down too) and counts as missing only those. Control path only.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "common/discovery.h"

namespace rdmaswap::holders {

// ---- The record ----
// JSON: {"version":1,"volume":"NAME","donors":["HOST:PORT",...]}, the donors as
// Endpoint::str(), sorted (by that text) and without duplicates. The same text in the file
// and in etcd. An empty list is a valid record: the volume holds nothing.

std::string record_text(std::string_view volume, std::span<const Endpoint> donors);

// The donors of the record `text`, sorted and without duplicates as record_text writes them
// (an entry named twice is dropped, an unsorted list accepted). nullopt, with `why` set, if
// `text` is not such a document: not a JSON object, no "version" 1, no "volume" or one other
// than `volume`, no "donors" list, or an entry that is not a string HOST:PORT with an explicit
// port 1..65535. Unknown fields are ignored.
std::optional<std::vector<Endpoint>> parse_record(std::string_view text, std::string_view volume,
						  std::string &why);

// ---- The local file ----

// Write the record to `path` whole and durably (discovery::write_donor_file: a temporary file
// in the same directory, mode 0600, fsync'd, renamed over `path`, the directory fsync'd). The
// directory must exist. Throws std::runtime_error naming the path and what failed (the
// temporary file is removed).
void write_file(const std::string &path, std::string_view volume,
		std::span<const Endpoint> donors);

// The recorded donors, or nullopt if `path` does not exist (discovery::read_donor_file).
// Throws std::runtime_error naming the path if it cannot be read (a symbolic link, not a
// regular file, larger than 1 MiB, an I/O error) or parse_record refuses it (another volume's
// record included).
std::optional<std::vector<Endpoint>> read_file(const std::string &path, std::string_view volume);

// Where the file of `volume` lives: discovery::state_file_path(default_key_path, volume,
// ".holders"), beside the volume key and the donor cache ("a/b" gives "<dir>/a%2Fb.holders").
std::string default_path(std::string_view default_key_path, std::string_view volume);

// ---- etcd ----

// The record's key: `<prefix>volumes/<escape_name(volume)>/holders` (prefix e.g. "/rdmaswap/").
// No lease: the record outlives the plugin, as the slabs do.
std::string etcd_key(std::string_view prefix, std::string_view volume);

// Put the record at etcd_key(opts.prefix, volume), no lease. Returns "" when etcd stored it,
// otherwise why not (no endpoint answered within opts.timeout, or etcd answered an error).
// Bounded by opts.timeout overall (each attempt as discovery::client_options says). Never
// throws but std::bad_alloc.
std::string put_etcd(const discovery::ListOptions &opts, std::string_view volume,
		     std::span<const Endpoint> donors);

// What get_etcd found.
struct EtcdRecord {
	enum class Status {
		Failed, // no answer within the bound, an error of etcd, or a record parse_record
			// refuses: `why` says which
		Absent, // etcd answered: there is no record of the volume
		Found,  // etcd answered with the record: `donors`
	} status = Status::Failed;
	std::vector<Endpoint> donors; // Found: sorted, no duplicates (may be empty)
	std::string why;              // Failed: why
};

// Read the record at etcd_key(opts.prefix, volume). Bounded by opts.timeout overall. Never
// throws but std::bad_alloc.
EtcdRecord get_etcd(const discovery::ListOptions &opts, std::string_view volume);

} // namespace rdmaswap::holders
