// SPDX-License-Identifier: MIT
// The plugin's per-volume state files (state_files.h): names, the run file and its lock, and
// rdmaswapctl state's view of a directory of them.
#include "common/volume/state_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/util/err_text.h"
#include "common/util/hash.h"
#include "common/util/private_file.h"

namespace rdmaswap::state {

namespace {

using nlohmann::json;

constexpr size_t kMaxRunFile = 4096;

// Closes a descriptor at the end of a scope (unless released).
struct FdGuard {
	int fd = -1;
	FdGuard() = default;
	explicit FdGuard(int f) : fd(f) {}
	FdGuard(const FdGuard &) = delete;
	FdGuard &operator=(const FdGuard &) = delete;
	~FdGuard()
	{
		if (fd >= 0)
			::close(fd);
	}
	int release()
	{
		const int f = fd;
		fd = -1;
		return f;
	}
};

std::runtime_error error(const std::string &path, const std::string &what, int err = 0)
{
	return std::runtime_error(err ? fmt::format("run file {}: {}: {}", path, what, err_text(err))
				      : fmt::format("run file {}: {}", path, what));
}

int64_t wall_now()
{
	return std::chrono::duration_cast<std::chrono::seconds>(
		       std::chrono::system_clock::now().time_since_epoch())
		.count();
}

// Up to kMaxRunFile bytes of `fd` from its start. False on a read error (errno set).
bool read_fd(int fd, std::string &out)
{
	out.assign(kMaxRunFile, '\0');
	size_t got = 0;
	while (got < out.size()) {
		const ssize_t n = ::pread(fd, out.data() + got, out.size() - got, off_t(got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return false;
		if (n == 0)
			break;
		got += size_t(n);
	}
	out.resize(got);
	return true;
}

// `text` in place of `fd`'s contents, synced. False on an error (errno set).
bool write_fd(int fd, const std::string &text)
{
	for (size_t done = 0; done < text.size();) {
		const ssize_t n = ::pwrite(fd, text.data() + done, text.size() - done, off_t(done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return false;
		done += size_t(n);
	}
	return ::ftruncate(fd, off_t(text.size())) == 0 && ::fdatasync(fd) == 0;
}

// The inverse of discovery::escape_name ("a%2Fb" gives "a/b"); nullopt if `s` is not one of
// its results.
std::optional<std::string> unescape_name(std::string_view s)
{
	std::string out;
	for (size_t i = 0; i < s.size(); i++) {
		if (s[i] != '%') {
			out += s[i];
			continue;
		}
		if (i + 2 >= s.size())
			return std::nullopt;
		unsigned v = 0;
		for (size_t k = i + 1; k <= i + 2; k++) {
			const char c = s[k];
			v <<= 4;
			if (c >= '0' && c <= '9')
				v |= unsigned(c - '0');
			else if (c >= 'A' && c <= 'F')
				v |= unsigned(c - 'A' + 10);
			else
				return std::nullopt;
		}
		out += char(v);
		i += 2;
	}
	return out;
}

bool is_hex16(std::string_view s)
{
	return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// What a file name in a state directory is.
struct Name {
	enum class Kind { Other, Run, Holders, Donors } kind = Kind::Other;
	std::string key; // Run, Holders: "KEY.HASH"; Donors: the escaped volume name
	bool temporary = false; // a leftover of a replacement (.tmp-*, .new)
};

Name classify(std::string_view name)
{
	Name n;
	// Leftovers of a replacement: NAME.tmp-PID-RANDOM (replace_private_file), NAME.new (the
	// run file of plugins before issue 29).
	std::string_view base = name;
	if (const size_t t = base.rfind(".tmp-");
	    t != std::string_view::npos && base.find('.', t + 1) == std::string_view::npos) {
		base = base.substr(0, t);
		n.temporary = true;
	} else if (base.size() > 4 && base.substr(base.size() - 4) == ".new") {
		base = base.substr(0, base.size() - 4);
		n.temporary = true;
	}
	const auto ends = [&](std::string_view suffix) {
		return base.size() > suffix.size() && base.substr(base.size() - suffix.size()) == suffix;
	};
	if (ends(".donors")) {
		n.kind = Name::Kind::Donors;
		n.key = std::string(base.substr(0, base.size() - 7));
		return n;
	}
	std::string_view key;
	if (ends(".run")) {
		n.kind = Name::Kind::Run;
		key = base.substr(0, base.size() - 4);
	} else if (ends(".holders")) {
		n.kind = Name::Kind::Holders;
		key = base.substr(0, base.size() - 8);
	} else {
		return Name{};
	}
	const size_t dot = key.rfind('.');
	if (dot == std::string_view::npos || dot == 0 || !is_hex16(key.substr(dot + 1)))
		return Name{}; // not KEY.HASH
	n.key = std::string(key);
	return n;
}

std::string hash_of_key(const std::string &key)
{
	return key.substr(key.rfind('.') + 1);
}

std::string hex16(uint64_t v)
{
	return fmt::format("{:016x}", v);
}

// The "volume" of a holders record, or "".
std::string holders_volume(const std::string &path)
{
	const auto text = read_small_file(path, kMaxStateFile);
	if (!text || !*text)
		return "";
	const json o = json::parse(**text, nullptr, false);
	if (!o.is_object())
		return "";
	const auto v = o.find("volume");
	return v != o.end() && v->is_string() ? v->get<std::string>() : "";
}

// Opens run file `path` (never through a link, a regular file only) and tries its exclusive
// lock without waiting. -1 with `why` set if it cannot be opened; `locked` false if a plugin
// holds it.
int open_locked(const std::string &path, bool &locked, std::string &why)
{
	locked = false;
	FdGuard fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
	if (fd.fd < 0) {
		why = fmt::format("cannot open {}: {}", path, err_text(errno));
		return -1;
	}
	struct stat st {};
	if (::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		why = fmt::format("{} is not a regular file", path);
		return -1;
	}
	if (::flock(fd.fd, LOCK_EX | LOCK_NB) == 0) {
		locked = true;
	} else if (errno != EWOULDBLOCK) {
		why = fmt::format("cannot lock {}: {}", path, err_text(errno));
		return -1;
	}
	return fd.release();
}

std::string age_text(int64_t s)
{
	if (s < 120)
		return fmt::format("{} s", s);
	if (s < 7200)
		return fmt::format("{} min", s / 60);
	if (s < 172800)
		return fmt::format("{} h", s / 3600);
	return fmt::format("{} days", s / 86400);
}

} // namespace

uint64_t volume_hash(std::string_view volume)
{
	// (The offset basis is a digit short of FNV's 14695981039346656037: so the plugin has
	// always named these files, and so it must go on naming them.)
	return fnv1a64(volume, 1469598103934665603ull);
}

std::string volume_file(std::string_view key_path, std::string_view volume,
			std::string_view suffix)
{
	return fmt::format("{}.{}.{}", key_path, hex16(volume_hash(volume)), suffix);
}

std::string run_file_text(const RunInfo &r)
{
	json o{{"volume", r.volume}, {"lease", r.lease}, {"started", r.started}};
	if (r.stopped)
		o["stopped"] = r.stopped;
	if (!r.backup.empty())
		o["backup"] = r.backup;
	return hex16(r.id) + "\n" + o.dump() + "\n";
}

RunInfo parse_run_file(std::string_view text)
{
	RunInfo r;
	const size_t nl = text.find('\n');
	const std::string first(text.substr(0, nl));
	if (!first.empty() && first.size() <= 16 &&
	    first.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos)
		r.id = std::strtoull(first.c_str(), nullptr, 16);
	if (nl == std::string_view::npos)
		return r;
	const json o = json::parse(text.substr(nl + 1), nullptr, false);
	if (!o.is_object())
		return r;
	const auto str = [&](const char *k, std::string &out) {
		if (const auto it = o.find(k); it != o.end() && it->is_string())
			out = it->get<std::string>();
	};
	const auto num = [&](const char *k, uint64_t max, auto &out) {
		if (const auto it = o.find(k);
		    it != o.end() && it->is_number_unsigned() && it->get<uint64_t>() <= max)
			out = static_cast<std::remove_reference_t<decltype(out)>>(it->get<uint64_t>());
	};
	if (const auto it = o.find("volume"); it == o.end() || !it->is_string())
		return r;
	r.described = true;
	str("volume", r.volume);
	str("backup", r.backup);
	num("lease", UINT32_MAX, r.lease);
	num("started", uint64_t(INT64_MAX), r.started);
	num("stopped", uint64_t(INT64_MAX), r.stopped);
	return r;
}

RunFile::RunFile(const std::string &path, std::string_view volume, unsigned lease,
		 std::string_view backup)
	: path_(path)
{
	const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
	for (;;) {
		FdGuard fd(::open(path.c_str(),
				  O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY,
				  0600));
		if (fd.fd < 0) {
			const int e = errno;
			struct stat lst {};
			if (e == ELOOP && ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
				throw error(path, "a symbolic link, which is not followed");
			throw error(path, "cannot open", e);
		}
		struct stat st {};
		if (::fstat(fd.fd, &st) != 0)
			throw error(path, "fstat", errno);
		if (!S_ISREG(st.st_mode))
			throw error(path, std::string("not a regular file (") + file_kind(st.st_mode) + ")");
		if ((st.st_mode & 07777) != 0600 && ::fchmod(fd.fd, 0600) != 0) // as every state file
			throw error(path, "fchmod", errno);
		if (::flock(fd.fd, LOCK_SH | LOCK_NB) != 0) {
			if (errno != EWOULDBLOCK)
				throw error(path, "flock", errno);
			// `rdmaswapctl state prune` holds it for a moment: wait for it.
			if (std::chrono::steady_clock::now() >= give_up)
				throw error(path, "locked by another process for more than 2 s "
						  "(rdmaswapctl state prune?)");
			std::this_thread::sleep_for(std::chrono::milliseconds(20));
			continue;
		}
		// Pruned between the open and the lock: make it again.
		struct stat now {};
		if (::stat(path.c_str(), &now) != 0 || now.st_ino != st.st_ino ||
		    now.st_dev != st.st_dev) {
			if (std::chrono::steady_clock::now() >= give_up)
				throw error(path, "removed again and again while it was being opened");
			continue;
		}
		std::string text;
		if (!read_fd(fd.fd, text))
			throw error(path, "read", errno);
		previous_ = parse_run_file(text).id;
		fd_ = fd.release();
		break;
	}
	try {
		std::random_device rd;
		while (info_.id == 0 || info_.id == previous_)
			info_.id = (uint64_t(rd()) << 32) ^ rd();
		info_.described = true;
		info_.volume = volume;
		info_.lease = lease;
		info_.backup = backup;
		info_.started = wall_now();
		write();
	} catch (...) {
		::close(fd_);
		throw;
	}
}

RunFile::~RunFile()
{
	::close(fd_);
}

void RunFile::write()
{
	if (!write_fd(fd_, run_file_text(info_)))
		throw error(path_, "write", errno);
}

void RunFile::stopped() noexcept
{
	try {
		info_.stopped = std::max<int64_t>(wall_now(), 1);
		write();
	} catch (...) { // best effort: it then reads as a run that did not stop cleanly
	}
}

std::vector<VolumeFiles> scan(const std::string &dir)
{
	DIR *d = ::opendir(dir.c_str());
	if (!d)
		throw std::runtime_error(fmt::format("cannot read the directory {}: {}", dir,
						     err_text(errno)));
	std::map<std::string, VolumeFiles> by_key;     // KEY.HASH
	std::map<std::string, VolumeFiles> donor_only; // escaped volume name
	std::vector<std::pair<std::string, std::string>> donors; // (escaped name, file name)
	const std::string prefix = dir.empty() || dir.back() == '/' ? dir : dir + "/";
	try {
		errno = 0;
		while (const dirent *e = ::readdir(d)) { // NOLINT(concurrency-mt-unsafe): its own DIR
			const std::string name = e->d_name;
			const Name n = classify(name);
			if (n.kind == Name::Kind::Other)
				continue;
			if (n.kind == Name::Kind::Donors) {
				donors.emplace_back(n.key, name);
				continue;
			}
			VolumeFiles &v = by_key[n.key];
			v.key = n.key;
			if (n.kind == Name::Kind::Run && !n.temporary)
				v.run = prefix + name;
			else
				v.files.push_back(prefix + name);
		}
	} catch (...) {
		::closedir(d);
		throw;
	}
	::closedir(d);
	// Each volume with a key: its run file's content and lock, its name.
	for (auto &[key, v] : by_key) {
		if (!v.run.empty()) {
			bool locked = false;
			FdGuard fd(open_locked(v.run, locked, v.why));
			std::string text;
			if (fd.fd < 0) {
				v.use = VolumeFiles::Use::Unknown;
			} else if (!read_fd(fd.fd, text)) {
				v.use = VolumeFiles::Use::Unknown;
				v.why = fmt::format("cannot read {}: {}", v.run, err_text(errno));
			} else {
				v.info = parse_run_file(text);
				v.use = !locked ? VolumeFiles::Use::Running
					: v.info->described && v.info->stopped
						? VolumeFiles::Use::Stopped
						: VolumeFiles::Use::Unclean;
				if (v.info->described)
					v.volume = v.info->volume;
			}
		}
		if (v.volume.empty())
			for (const auto &f : v.files)
				if (f.size() > 8 && f.substr(f.size() - 8) == ".holders")
					v.volume = holders_volume(f);
	}
	// The donor caches: with the volume of the same name (or, when its name is not known,
	// of the same hash), else on their own.
	for (const auto &[escaped, file] : donors) {
		const auto volume = unescape_name(escaped);
		VolumeFiles *owner = nullptr;
		if (volume) {
			const std::string hash = hex16(volume_hash(*volume));
			for (auto &[key, v] : by_key)
				if (hash_of_key(key) == hash && (v.volume.empty() || v.volume == *volume)) {
					owner = &v;
					break;
				}
		}
		if (!owner) {
			owner = &donor_only[escaped];
			if (volume)
				owner->volume = *volume;
		}
		owner->files.push_back(prefix + file);
	}
	std::vector<VolumeFiles> out;
	for (auto *m : {&by_key, &donor_only})
		for (auto &[key, v] : *m) {
			if (!v.run.empty())
				v.files.push_back(v.run);
			for (const auto &f : v.files) {
				struct stat st {};
				if (::lstat(f.c_str(), &st) == 0)
					v.newest = std::max<int64_t>(v.newest, st.st_mtime);
			}
			out.push_back(std::move(v));
		}
	return out;
}

std::string keep_reason(const VolumeFiles &v, int64_t now, std::optional<int64_t> older_than)
{
	using Use = VolumeFiles::Use;
	switch (v.use) {
	case Use::Running:
		return "its nbdkit runs (the run file is locked)";
	case Use::Unknown:
		return v.why;
	case Use::NoRunFile:
		return "no run file here, so whether its nbdkit runs cannot be told (its volume key "
		       "may be elsewhere): remove it by hand once the volume is gone";
	case Use::Stopped: {
		const int64_t gone = now - v.info->stopped;
		if (gone <= int64_t(v.info->lease))
			return fmt::format("stopped {} ago, within its lease of {} s", age_text(gone),
					   v.info->lease);
		if (older_than && gone <= *older_than)
			return fmt::format("stopped {} ago, not more than older-than={}",
					   age_text(gone), *older_than);
		return "";
	}
	case Use::Unclean:
		break;
	}
	const int64_t age = now - v.newest;
	const bool lease_known = v.info && v.info->described;
	const char *what = lease_known ? "it did not stop cleanly (killed or crashed): when it "
					 "stopped is not known"
				       : "its run file was written by an older plugin: whether it "
					 "stopped, and when, is not known";
	if (!older_than)
		return fmt::format("{}; older-than= removes it once its files are that old (the "
				   "newest is {} old)",
				   what, age_text(age));
	if (age <= *older_than)
		return fmt::format("{}, and its newest file is {} old, not more than older-than={}",
				   what, age_text(age), *older_than);
	if (lease_known && age <= int64_t(v.info->lease))
		return fmt::format("{}, and its newest file is {} old, within its lease of {} s",
				   what, age_text(age), v.info->lease);
	return "";
}

Pruned prune(const VolumeFiles &v, int64_t now, std::optional<int64_t> older_than)
{
	Pruned out;
	if (out.kept = keep_reason(v, now, older_than); !out.kept.empty())
		return out;
	// Decide again under the lock, from the run file as it is now.
	VolumeFiles again = v;
	bool locked = false;
	FdGuard fd(open_locked(v.run, locked, again.why));
	std::string text;
	if (fd.fd < 0) {
		out.kept = again.why;
		return out;
	}
	if (!locked) {
		out.kept = "its nbdkit runs (the run file is locked)";
		return out;
	}
	if (!read_fd(fd.fd, text)) {
		out.kept = fmt::format("cannot read {}: {}", v.run, err_text(errno));
		return out;
	}
	again.info = parse_run_file(text);
	again.use = again.info->described && again.info->stopped ? VolumeFiles::Use::Stopped
								  : VolumeFiles::Use::Unclean;
	struct stat st {};
	if (::fstat(fd.fd, &st) == 0)
		again.newest = std::max<int64_t>(again.newest, st.st_mtime);
	if (out.kept = keep_reason(again, now, older_than); !out.kept.empty())
		return out;
	struct stat bst {};
	const bool keep_run = !again.info->backup.empty() &&
			      ::stat(again.info->backup.c_str(), &bst) == 0;
	for (const auto &f : again.files) {
		if (f == again.run && keep_run)
			continue;
		if (::unlink(f.c_str()) == 0 || errno == ENOENT)
			out.removed.push_back(f);
		else if (out.error.empty())
			out.error = fmt::format("cannot remove {}: {}", f, err_text(errno));
	}
	if (keep_run)
		out.kept = fmt::format("the run file stays: its backup={} exists, which a restart "
				       "trusts only with it",
				       again.info->backup);
	return out;
}

} // namespace rdmaswap::state
