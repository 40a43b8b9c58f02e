// SPDX-License-Identifier: MIT
// Unit tests for common/volume/state_files (issue 29): the volume's file names, the run file (ids,
// its text old and new, its lock, a clean stop), and what `rdmaswapctl state` sees of a
// directory and may prune: never a running volume's files, a stopped one's only after its
// lease, an unclean one's only with older-than=, the run file of a volume with a backup
// file never, and nothing that is not a volume's.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/volume/state_files.h"
#include "tests/support/state_file_helpers.h"

using namespace rdmaswap;
using namespace rdmaswap::state;
using rdmaswap::test::TempDir;

namespace {

int64_t wall_now()
{
	return std::chrono::duration_cast<std::chrono::seconds>(
		       std::chrono::system_clock::now().time_since_epoch())
		.count();
}

void put(const std::string &path, const std::string &text)
{
	std::ofstream(path) << text;
}

std::string slurp(const std::string &path)
{
	std::ifstream f(path);
	return std::string(std::istreambuf_iterator<char>(f), {});
}

bool exists(const std::string &path)
{
	struct stat st {};
	return ::lstat(path.c_str(), &st) == 0;
}

// Sets the modification time of `path` to `t`.
void set_mtime(const std::string &path, int64_t t)
{
	timeval tv[2] = {{t, 0}, {t, 0}};
	REQUIRE(::utimes(path.c_str(), tv) == 0);
}

const VolumeFiles *find(const std::vector<VolumeFiles> &vs, const std::string &volume)
{
	for (const auto &v : vs)
		if (v.volume == volume)
			return &v;
	return nullptr;
}

} // namespace

TEST_CASE("state files: names beside the volume key", "[state]")
{
	// FNV-1a 64 with the offset basis the plugin has always used (1469598103934665603, a
	// digit short of the standard one): the names of existing files must not change.
	CHECK(volume_hash("") == 1469598103934665603ull);
	CHECK(volume_hash("a") == 0x44bd8ad473cd9906ull);
	CHECK(volume_file("/var/lib/rdmaswap/volume.key", "a", "run") ==
	      "/var/lib/rdmaswap/volume.key.44bd8ad473cd9906.run");
	CHECK(volume_file("k", "a", "holders") == "k.44bd8ad473cd9906.holders");
}

TEST_CASE("state files: the run file's text, and an older plugin's", "[state]")
{
	RunInfo r;
	r.id = 0x0123456789abcdefull;
	r.volume = "host1 \"swap\"";
	r.lease = 60;
	r.started = 1700000000;
	const std::string text = run_file_text(r);
	CHECK(text.rfind("0123456789abcdef\n{", 0) == 0);
	RunInfo back = parse_run_file(text);
	CHECK(back.id == r.id);
	CHECK(back.described);
	CHECK(back.volume == r.volume);
	CHECK(back.lease == 60);
	CHECK(back.started == 1700000000);
	CHECK(back.stopped == 0);
	CHECK(back.backup.empty());
	r.stopped = 1700000100;
	r.backup = "/b/f";
	back = parse_run_file(run_file_text(r));
	CHECK(back.stopped == 1700000100);
	CHECK(back.backup == "/b/f");
	// What plugins before issue 29 wrote (and read: the id on the first line).
	back = parse_run_file("00000000000000ff\n");
	CHECK(back.id == 0xff);
	CHECK_FALSE(back.described);
	// Damaged: what cannot be read keeps its default.
	back = parse_run_file("zz\n{not json");
	CHECK(back.id == 0);
	CHECK_FALSE(back.described);
	CHECK(parse_run_file("").id == 0);
}

TEST_CASE("state files: the run file: ids, its lock while it lives, a clean stop", "[state]")
{
	TempDir dir;
	const std::string path = dir.path / "volume.key.44bd8ad473cd9906.run";
	// The format of older plugins: its id is this run's previous one.
	put(path, "00000000000000ff\n");
	uint64_t first = 0;
	{
		RunFile run(path, "a", 30, "");
		CHECK(run.previous() == 0xff);
		CHECK(run.id() != 0);
		CHECK(run.id() != 0xff);
		first = run.id();
		const RunInfo info = parse_run_file(slurp(path));
		CHECK(info.id == first);
		CHECK(info.volume == "a");
		CHECK(info.lease == 30);
		CHECK(std::abs(info.started - wall_now()) <= 2);
		CHECK(info.stopped == 0);
		struct stat st {};
		REQUIRE(::stat(path.c_str(), &st) == 0);
		CHECK((st.st_mode & 0777) == 0600);
		// Locked: seen running; an exclusive lock (what prune takes) is refused.
		const auto vs = scan(dir.path);
		REQUIRE(vs.size() == 1);
		CHECK(vs[0].use == VolumeFiles::Use::Running);
		CHECK(keep_reason(vs[0], wall_now() + 100000, 0) ==
		      "its nbdkit runs (the run file is locked)");
		const Pruned p = prune(vs[0], wall_now() + 100000, 0);
		CHECK(p.removed.empty());
		CHECK(exists(path));
		run.stopped();
		CHECK(std::abs(parse_run_file(slurp(path)).stopped - wall_now()) <= 2);
	}
	// Unlocked once it is gone; a new run learns the last id.
	auto vs = scan(dir.path);
	REQUIRE(vs.size() == 1);
	CHECK(vs[0].use == VolumeFiles::Use::Stopped);
	{
		RunFile run(path, "a", 30, "");
		CHECK(run.previous() == first);
		CHECK(run.id() != first);
		// Not stopped cleanly (the process died): it stays "unclean" once unlocked.
	}
	vs = scan(dir.path);
	REQUIRE(vs.size() == 1);
	CHECK(vs[0].use == VolumeFiles::Use::Unclean);
}

TEST_CASE("state files: the run file is never a link, a FIFO or a directory", "[state]")
{
	TempDir dir;
	const std::string target = dir.path / "target", link = dir.path / "k.0000000000000000.run";
	put(target, "00000000000000ff\n");
	std::filesystem::create_symlink(target, link);
	CHECK_THROWS_WITH(RunFile(link, "a", 1, ""),
			  Catch::Contains(link) && Catch::Contains("symbolic link"));
	CHECK(slurp(target) == "00000000000000ff\n");
	const std::string fifo = dir.path / "fifo.run";
	REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
	CHECK_THROWS_WITH(RunFile(fifo, "a", 1, ""),
			  Catch::Contains(fifo) && Catch::Contains("not a regular file"));
	CHECK_THROWS_WITH(RunFile(dir.path, "a", 1, ""), Catch::Contains(dir.path.string()));
}

TEST_CASE("state files: a start waits for a prune that holds the run file, then makes it anew",
	  "[state]")
{
	TempDir dir;
	const std::string path = dir.path / "k.44bd8ad473cd9906.run";
	put(path, "00000000000000ff\n");
	const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
	REQUIRE(fd >= 0);
	REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
	// The prune removes the file under its lock, then lets go.
	std::thread pruner([&] {
		std::this_thread::sleep_for(std::chrono::milliseconds(300));
		::unlink(path.c_str());
		::close(fd);
	});
	const auto t0 = std::chrono::steady_clock::now();
	{
		RunFile run(path, "a", 1, "");
		CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(250));
		CHECK(run.previous() == 0); // the file it read was made anew
		CHECK(parse_run_file(slurp(path)).id == run.id());
	}
	pruner.join();
	// One that never lets go: the start fails after 2 s, saying so.
	const int held = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
	REQUIRE(held >= 0);
	REQUIRE(::flock(held, LOCK_EX | LOCK_NB) == 0);
	CHECK_THROWS_WITH(RunFile(path, "a", 1, ""), Catch::Contains("locked by another process"));
	::close(held);
}

TEST_CASE("state files: scan groups a volume's files; prune keeps what may still be needed",
	  "[state]")
{
	TempDir dir;
	const std::string d = dir.path.string() + "/";
	const int64_t now = wall_now();
	// The volume key and files that are no volume's: never listed, never removed.
	put(d + "volume.key", "secret");
	put(d + "notes.txt", "x");
	put(d + "volume.key.tmp-1-2", "x");
	// "stopped": stopped cleanly 100 s ago, lease 60; a holders record, a donor cache, a
	// leftover temporary file.
	RunInfo r;
	r.id = 1;
	r.volume = "stopped/vol";
	r.lease = 60;
	r.started = now - 1000;
	r.stopped = now - 100;
	const std::string s_run = volume_file(d + "volume.key", r.volume, "run");
	const std::string s_holders = volume_file(d + "volume.key", r.volume, "holders");
	put(s_run, run_file_text(r));
	put(s_holders, R"({"version":1,"volume":"stopped/vol","donors":[]})");
	put(s_holders + ".tmp-123-abcdef01", "x");
	put(d + "stopped%2Fvol.donors", R"({"version":1,"prefix":"/rdmaswap/","donors":[]})");
	// "recent": stopped 10 s ago, lease 60.
	r.volume = "recent";
	r.stopped = now - 10;
	const std::string recent_run = volume_file(d + "volume.key", r.volume, "run");
	put(recent_run, run_file_text(r));
	// "crashed": no clean stop; its files 2 h old.
	r.volume = "crashed";
	r.stopped = 0;
	const std::string c_run = volume_file(d + "volume.key", r.volume, "run");
	const std::string c_holders = volume_file(d + "volume.key", r.volume, "holders");
	put(c_run, run_file_text(r));
	put(c_holders, R"({"version":1,"volume":"crashed","donors":["h:1"]})");
	set_mtime(c_run, now - 7200);
	set_mtime(c_holders, now - 7200);
	// "old": an older plugin's run file (an id only) and holders record, 3 days old.
	const std::string o_run = volume_file(d + "volume.key", "old", "run");
	const std::string o_holders = volume_file(d + "volume.key", "old", "holders");
	put(o_run, "00000000000000aa\n");
	put(o_run + ".new", "00000000000000ab\n");
	put(o_holders, R"({"version":1,"volume":"old","donors":[]})");
	for (const auto &f : {o_run, o_run + ".new", o_holders})
		set_mtime(f, now - 3 * 86400);
	// "backed": stopped long ago, with a backup file that exists.
	r.volume = "backed";
	r.stopped = now - 86400;
	r.backup = d + "backup.img";
	put(r.backup, "data");
	const std::string b_run = volume_file(d + "volume.key", r.volume, "run");
	const std::string b_holders = volume_file(d + "volume.key", r.volume, "holders");
	put(b_run, run_file_text(r));
	put(b_holders, R"({"version":1,"volume":"backed","donors":[]})");
	// "lonely": a donor cache with no run file here (its volume key elsewhere).
	put(d + "lonely.donors", R"({"version":1,"prefix":"/rdmaswap/","donors":[]})");
	set_mtime(d + "lonely.donors", now - 30 * 86400);

	auto vs = scan(dir.path);
	CHECK(vs.size() == 6);
	const VolumeFiles *st = find(vs, "stopped/vol");
	REQUIRE(st);
	CHECK(st->use == VolumeFiles::Use::Stopped);
	CHECK(st->run == s_run);
	CHECK(st->files.back() == s_run); // the run file last
	CHECK(st->files.size() == 4);
	CHECK(std::count(st->files.begin(), st->files.end(), d + "stopped%2Fvol.donors") == 1);
	REQUIRE(find(vs, "old"));
	CHECK(find(vs, "old")->use == VolumeFiles::Use::Unclean); // (named by its holders record)
	CHECK(find(vs, "old")->files.size() == 3);
	REQUIRE(find(vs, "lonely"));
	CHECK(find(vs, "lonely")->use == VolumeFiles::Use::NoRunFile);

	// Without older-than=: only the volume stopped for longer than its lease goes (and the
	// files of the one with a backup, but its run file).
	std::vector<std::string> removed;
	std::vector<std::string> kept;
	for (const auto &v : vs) {
		const Pruned p = prune(v, now, std::nullopt);
		CHECK(p.error.empty());
		removed.insert(removed.end(), p.removed.begin(), p.removed.end());
		if (!p.kept.empty())
			kept.push_back(v.volume + ": " + p.kept);
	}
	std::sort(removed.begin(), removed.end());
	std::vector<std::string> expect{s_run, s_holders, s_holders + ".tmp-123-abcdef01",
					d + "stopped%2Fvol.donors", b_holders};
	std::sort(expect.begin(), expect.end());
	CHECK(removed == expect);
	for (const auto &f : expect)
		CHECK_FALSE(exists(f));
	CHECK(exists(b_run));
	CHECK(exists(recent_run));
	CHECK(exists(c_run));
	CHECK(exists(o_run));
	CHECK(exists(d + "volume.key"));
	CHECK(exists(d + "volume.key.tmp-1-2"));
	CHECK(exists(d + "notes.txt"));
	INFO(Catch::Detail::stringify(kept));
	CHECK(std::any_of(kept.begin(), kept.end(), [](const std::string &k) {
		return k.find("recent: stopped 10 s ago, within its lease of 60 s") == 0;
	}));
	CHECK(std::any_of(kept.begin(), kept.end(), [](const std::string &k) {
		return k.find("crashed: it did not stop cleanly") == 0;
	}));
	CHECK(std::any_of(kept.begin(), kept.end(), [](const std::string &k) {
		return k.find("backed: the run file stays: its backup=") == 0;
	}));

	// older-than=1d: the volume that did not stop cleanly 2 h ago stays; the older plugin's,
	// 3 days old, goes. The donor cache without a run file stays whatever its age.
	vs = scan(dir.path);
	for (const auto &v : vs)
		prune(v, now, 86400);
	CHECK(exists(c_run));
	CHECK_FALSE(exists(o_run));
	CHECK_FALSE(exists(o_run + ".new"));
	CHECK_FALSE(exists(o_holders));
	CHECK(exists(d + "lonely.donors"));
	// older-than=1h: now the crashed one too.
	vs = scan(dir.path);
	for (const auto &v : vs)
		prune(v, now, 3600);
	CHECK_FALSE(exists(c_run));
	CHECK_FALSE(exists(c_holders));
	CHECK(exists(recent_run));
	CHECK(exists(b_run));
	CHECK(exists(d + "lonely.donors"));
	CHECK(exists(d + "volume.key"));
}
