// SPDX-License-Identifier: MIT
// The plugin's per-volume state files beside the volume key (docs/operations.md, "The state
// directory"): their names, the run file (this run's id, locked for as long as nbdkit runs),
// and what `rdmaswapctl state list` and `state prune` see of a directory of them and may
// remove. Control path only.
//
// Contracts:
// - A volume's files beside the volume key KEY are KEY.HASH.run and KEY.HASH.holders (HASH:
//   volume_hash of its name), and its donor cache ESCAPED.donors (discovery::state_file_path)
//   in the directory of the default volume key; the volume key itself is every volume's and
//   is never a volume's file here.
// - A running plugin holds a shared flock(2) on its run file from config_complete until it
//   exits (the descriptor survives nbdkit's fork; the kernel drops the lock when the process
//   ends, however it ends). Pruning takes an exclusive one, without waiting, and holds it
//   while it removes the volume's files, the run file last: so it never removes a file of a
//   volume whose nbdkit runs, and a plugin that starts meanwhile waits for it and then makes
//   its run file anew.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rdmaswap::state {

// FNV-1a (64 bits, with the offset basis the plugin has always used) of the volume's name:
// what names its files beside the volume key.
uint64_t volume_hash(std::string_view volume);
// "`key_path`.HASH.`suffix`", HASH being volume_hash(volume) as 16 lower-case hex digits:
// the volume's holders record (suffix "holders") and its run file ("run").
std::string volume_file(std::string_view key_path, std::string_view volume,
			std::string_view suffix);

// ---- The run file ----

// Its text: line 1 the run id, 16 hex digits (all that plugins before issue 29 wrote, and all
// they read: they still read this one), line 2 a JSON object
// {"volume":NAME,"lease":SECONDS,"started":T,"stopped":T,"backup":PATH} (times in seconds
// since the epoch; "stopped" only once the run stopped cleanly, "backup" only with backup=).
struct RunInfo {
	uint64_t id = 0;
	bool described = false; // line 2 was read (false: a file of an older plugin, or damaged)
	std::string volume;
	unsigned lease = 0;
	int64_t started = 0;
	int64_t stopped = 0; // 0: running, or it did not stop cleanly (killed, crashed)
	std::string backup;  // the backup= file ("": none)
};
std::string run_file_text(const RunInfo &r);
// What `text` says; never fails: a field it cannot read keeps its default (a line 2 that is
// not such an object leaves `described` false).
RunInfo parse_run_file(std::string_view text);

// The run file of this run, locked (shared) for as long as the object lives.
class RunFile {
public:
	// Opens `path`, or creates it, mode 0600 (an existing file is made so), never through a
	// symbolic link and only as a regular file (a FIFO is refused, not waited on); locks it
	// shared (waiting up to 2 s for a prune that holds it); reads the previous run's id (0 if
	// none) and writes this run's in place (a new random id, never 0 nor the previous one, with `volume`, `lease`,
	// `backup` and the time now), so that the lock stays on the file that names this run.
	// A crash in the middle of that write can leave it unreadable: the next run then finds no
	// previous id (a backup file is then not trusted: safe). Throws std::runtime_error naming
	// the path and what failed.
	RunFile(const std::string &path, std::string_view volume, unsigned lease,
		std::string_view backup);
	~RunFile(); // closes it: the lock goes (with the process's last copy of the descriptor)
	RunFile(const RunFile &) = delete;
	RunFile &operator=(const RunFile &) = delete;

	uint64_t id() const { return info_.id; }
	uint64_t previous() const { return previous_; }
	const std::string &path() const { return path_; }
	// A clean stop: writes "stopped" (the time now) into the file, so that its volume's files
	// may be pruned once it has been stopped for longer than its lease. Best effort: never
	// throws (an error leaves the file as a run that did not stop cleanly).
	void stopped() noexcept;

private:
	void write(); // info_ into the file, in place; throws
	std::string path_;
	int fd_ = -1;
	RunInfo info_;
	uint64_t previous_ = 0;
};

// ---- A state directory, as rdmaswapctl state sees it ----

// One volume's files in a directory.
struct VolumeFiles {
	enum class Use {
		Running,   // its run file is locked: its nbdkit runs
		Stopped,   // not running, and its run file says it stopped cleanly, and when
		Unclean,   // not running, and its run file has no clean stop (killed, crashed, or
			   // written by an older plugin): when it stopped is not known
		NoRunFile, // no run file here (e.g. a donor cache whose volume key is elsewhere):
			   // whether its nbdkit runs cannot be told
		Unknown,   // its run file could not be opened or locked (`why`)
	};
	std::string key;             // "KEY.HASH" of its run file and holders record ("" none)
	std::string run;             // its run file's path ("" none)
	std::optional<RunInfo> info; // the run file's content
	// Its name: the run file's, else its holders record's, else its donor cache's ("": not
	// known).
	std::string volume;
	std::vector<std::string> files; // its files here (paths), the run file last
	int64_t newest = 0;             // the latest modification time among them
	Use use = Use::NoRunFile;
	std::string why; // Unknown: why
};

// Every volume with files in `dir`, in the order of their keys (then donor caches by name).
// A volume's files: its run file, holders record, donor cache and the temporary files left
// of them (NAME.tmp-*, NAME.new); nothing else in `dir` is a volume's (the volume key is
// not). Each run file's lock is tried (exclusive, without waiting, released at once) to tell
// Running from the rest. Throws std::runtime_error if `dir` cannot be read.
std::vector<VolumeFiles> scan(const std::string &dir);

// Why `v`'s files must stay at `now` (seconds since the epoch), or "" if prune may remove
// them. They stay while its nbdkit runs, or whether it does cannot be told (no run file here,
// or it cannot be locked); once it stopped cleanly, until it has been stopped for longer than
// its lease (and than `older_than`, if given); when it did not stop cleanly (or its run file
// is an older plugin's), only `older_than` lets them go, once every file of it is older than
// that (and than its lease, if known).
std::string keep_reason(const VolumeFiles &v, int64_t now, std::optional<int64_t> older_than);

// The outcome of prune() for one volume.
struct Pruned {
	std::vector<std::string> removed;
	std::string kept; // why files stay ("" if none did)
	std::string error; // a removal that failed ("" none)
};
// Remove `v`'s files if keep_reason allows, deciding again under its run file's exclusive
// lock (taken without waiting: a plugin that holds it runs), from the run file as it is then;
// the run file goes last. A run file naming a backup= file that exists stays (a restart
// trusts that file only with it); the other files go.
Pruned prune(const VolumeFiles &v, int64_t now, std::optional<int64_t> older_than);

} // namespace rdmaswap::state
