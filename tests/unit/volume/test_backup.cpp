// SPDX-License-Identifier: MIT
// Unit tests for common/volume/backup: entries from several queues reach the file in the order
// they were queued, reads wait for what was queued for their own bytes (not for other ranges),
// punches zero and re-trust a slab, the header refuses another volume's file, a clean close is
// trusted only by the next run, and a writer thread that throws fails the backup (its
// exception boundary).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/volume/backup.h"

using namespace rdmaswap;
using namespace std::chrono_literals;

namespace {

struct TmpDir {
	std::filesystem::path path;
	TmpDir()
	{
		char tmpl[] = "/tmp/rdmaswap-backup-test.XXXXXX";
		REQUIRE(mkdtemp(tmpl) != nullptr);
		path = tmpl;
	}
	~TmpDir() { std::filesystem::remove_all(path); }
};

BackupOptions options(const std::string &path, uint64_t run = 1, uint64_t previous = 0)
{
	BackupOptions o;
	o.path = path;
	o.volume = "vol";
	o.size = 4 << 20;
	o.slab_size = 1 << 20;
	o.chunk = 64 * 1024;
	o.queues = 3;
	o.queue_bytes = 1 << 20;
	o.run_id = run;
	o.previous_run_id = previous;
	return o;
}

auto soon() { return std::chrono::steady_clock::now() + 5s; }
auto all = [](uint64_t) { return true; };
auto none = [](uint64_t) { return false; };

std::vector<std::byte> fill(size_t n, int v)
{
	return std::vector<std::byte>(n, std::byte(v));
}

} // namespace

TEST_CASE("backup: later writes win across queues; reads wait for the queue", "[backup]")
{
	TmpDir d;
	Backup b(options((d.path / "f").string()));
	b.start(true, all, none);
	// Many rounds of the same range from alternating queues: the last one queued must win.
	for (int round = 0; round < 200; round++) {
		const auto data = fill(64 * 1024, round & 0xff);
		REQUIRE(b.put(unsigned(round % 3), 1 << 20, data.data(), uint32_t(data.size()), soon()) == 0);
	}
	std::vector<std::byte> got(64 * 1024);
	REQUIRE(b.read(got.data(), uint32_t(got.size()), 1 << 20, soon()) == 0);
	CHECK(got == fill(64 * 1024, 199 & 0xff));
	// Threads on their own queues, each writing its own range: each reads back its last.
	// (Catch's assertions are not thread-safe: the threads count their failures.)
	std::atomic<int> put_failures{0};
	std::vector<std::thread> ts;
	for (unsigned q = 0; q < 3; q++)
		ts.emplace_back([&, q] {
			for (int i = 0; i < 100; i++) {
				const auto data = fill(4096, int(q * 50 + i % 50));
				if (b.put(q, (2 << 20) + q * 4096, data.data(), 4096, soon()) != 0)
					put_failures++;
			}
		});
	for (auto &t : ts)
		t.join();
	REQUIRE(put_failures == 0);
	for (unsigned q = 0; q < 3; q++) {
		std::vector<std::byte> r(4096);
		REQUIRE(b.read(r.data(), 4096, (2 << 20) + q * 4096, soon()) == 0);
		CHECK(r == fill(4096, int(q * 50 + 49)));
	}
	// Zeros (a null put) and a punch read zeros; a punched whole slab is trusted again.
	REQUIRE(b.put(0, 1 << 20, nullptr, 4096, soon()) == 0);
	REQUIRE(b.read(got.data(), 4096, 1 << 20, soon()) == 0);
	CHECK(std::vector<std::byte>(got.begin(), got.begin() + 4096) == fill(4096, 0));
	b.distrust(1);
	CHECK(!b.trusted(1));
	CHECK(b.untrusted_count() == 1);
	REQUIRE(b.punch(1 << 20, 1 << 20, soon()) == 0);
	REQUIRE(b.read(got.data(), uint32_t(got.size()), 1 << 20, soon()) == 0); // (waits for it)
	CHECK(got == fill(64 * 1024, 0));
	CHECK(b.trusted(1));
	CHECK(b.write_errors() == 0);
}

TEST_CASE("backup: a read waits for what was queued for its own bytes, not for other ranges",
	  "[backup]")
{
	TmpDir d;
	// The writer stops before each entry while `hold` is set (10 s at most).
	std::atomic<bool> hold{false};
	auto o = options((d.path / "f").string());
	o.fault = [&] {
		for (int i = 0; i < 10000 && hold.load(); i++)
			std::this_thread::sleep_for(1ms);
	};
	Backup b(o);
	b.start(true, all, none);
	const auto old = fill(4096, 7);
	REQUIRE(b.put(0, 2 << 20, old.data(), 4096, soon()) == 0);
	std::vector<std::byte> got(8192);
	REQUIRE(b.read(got.data(), 4096, 2 << 20, soon()) == 0); // (applied: the writer is free)
	// The writer is held with writes to [0, 4 KiB) and [128 KiB, 132 KiB) queued (64 KiB
	// chunks: ranges of 64 KiB).
	hold = true;
	const auto young = fill(4096, 9);
	REQUIRE(b.put(1, 0, young.data(), 4096, soon()) == 0);
	REQUIRE(b.put(2, 128 << 10, young.data(), 4096, soon()) == 0);
	auto shortly = [] { return std::chrono::steady_clock::now() + 300ms; };
	// Another range is read at once, with the bytes it had...
	REQUIRE(b.read(got.data(), 4096, 2 << 20, shortly()) == 0);
	CHECK(std::vector<std::byte>(got.begin(), got.begin() + 4096) == old);
	REQUIRE(b.read(got.data(), 4096, 64 << 10, shortly()) == 0);
	CHECK(std::vector<std::byte>(got.begin(), got.begin() + 4096) == fill(4096, 0));
	// ...but a read of a range with a write queued waits for it (here: beyond its deadline),
	// and so does one that spans into such a range (64 KiB + 60 KiB, 8 KiB).
	CHECK(b.read(got.data(), 4096, 0, shortly()) == EIO);
	CHECK(b.read(got.data(), 8192, (64 + 60) << 10, shortly()) == EIO);
	hold = false;
	REQUIRE(b.read(got.data(), 4096, 0, soon()) == 0);
	CHECK(std::vector<std::byte>(got.begin(), got.begin() + 4096) == young);
	REQUIRE(b.read(got.data(), 8192, (64 + 60) << 10, soon()) == 0);
	CHECK(std::vector<std::byte>(got.begin(), got.begin() + 4096) == fill(4096, 0));
	CHECK(std::vector<std::byte>(got.begin() + 4096, got.end()) == young);
	CHECK(b.write_errors() == 0);
}

TEST_CASE("backup: the header: another volume is refused; a clean close is trusted by the next run only",
	  "[backup]")
{
	TmpDir d;
	const std::string path = (d.path / "f").string();
	{
		Backup b(options(path, 11));
		b.start(true, all, none);
		const auto data = fill(4096, 7);
		REQUIRE(b.put(0, 3 << 20, data.data(), 4096, soon()) == 0);
		b.set_live(3, true);
	} // clean close
	{
		BackupOptions o = options(path, 12, 11);
		o.volume = "other";
		CHECK_THROWS_WITH(Backup(o), Catch::Contains("made for volume 'vol'"));
		o = options(path, 12, 11);
		o.size = 8 << 20;
		CHECK_THROWS_WITH(Backup(o), Catch::Contains("made for volume"));
	}
	{
		Backup b(options(path, 12, 11)); // the next run: trusted, with its live slabs
		CHECK(b.clean());
		CHECK(b.live_at_close(3));
		CHECK(!b.live_at_close(2));
		b.start(false, all, none);
		std::vector<std::byte> r(4096);
		REQUIRE(b.read(r.data(), 4096, 3 << 20, soon()) == 0);
		CHECK(r == fill(4096, 7));
	} // closed cleanly by run 12
	{
		Backup b(options(path, 14, 13)); // run 13 (without backup=) came in between
		CHECK(!b.clean());
		// Not closed cleanly: slabs restored from donors are distrusted, empty ones zeroed.
		b.start(false, none, [](uint64_t s) { return s != 3; });
		CHECK(!b.trusted(3));
		CHECK(b.trusted(2));
	} // not clean: an untrusted slab
	{
		Backup b(options(path, 15, 14));
		CHECK(!b.clean());
	}
	// Not a backup file at all: refused, the file left alone.
	const std::string junk = (d.path / "junk").string();
	{
		FILE *f = std::fopen(junk.c_str(), "w");
		REQUIRE(f);
		std::fputs("precious data", f);
		std::fclose(f);
	}
	REQUIRE(chmod(junk.c_str(), 0600) == 0);
	CHECK_THROWS_WITH(Backup(options(junk)), Catch::Contains("not an rdmaswap backup file"));
	CHECK(std::filesystem::file_size(junk) == 13);
}

namespace {
std::string open_error(const std::string &path)
{
	try {
		Backup b(options(path));
	} catch (const std::runtime_error &e) {
		return e.what();
	}
	return "";
}
mode_t mode_of(const std::string &path)
{
	struct stat st {};
	REQUIRE(lstat(path.c_str(), &st) == 0);
	return st.st_mode & 07777;
}
} // namespace

TEST_CASE("backup: only a private file of this user is used: never another user's, one others "
	  "may read, a symbolic link or a FIFO",
	  "[backup]")
{
	TmpDir d;
	// A new file is made mode 0600 whatever the umask.
	const std::string made = (d.path / "new").string();
	const mode_t old_umask = umask(0);
	CHECK(open_error(made).empty());
	umask(old_umask);
	CHECK(mode_of(made) == 0600);
	CHECK(open_error(made).empty()); // and it is used again

	// An existing empty file others may read (before: adopted, and filled with swap pages).
	const std::string readable = (d.path / "readable").string();
	std::FILE *f = std::fopen(readable.c_str(), "w");
	REQUIRE(f);
	std::fclose(f);
	for (const mode_t mode : {0644, 0640, 0604, 0660}) {
		REQUIRE(chmod(readable.c_str(), mode) == 0);
		const std::string e = open_error(readable);
		INFO(e);
		CHECK(e.find("backup=" + readable + ": ") == 0);
		char m[16];
		std::snprintf(m, sizeof m, "mode %04o", unsigned(mode));
		CHECK(e.find(m) != std::string::npos);
		CHECK(e.find("open to its group or others") != std::string::npos);
		CHECK(e.find("plaintext") != std::string::npos);
		CHECK(std::filesystem::file_size(readable) == 0); // left alone
	}
	REQUIRE(chmod(readable.c_str(), 0600) == 0);
	CHECK(open_error(readable).empty()); // the operator's own empty 0600 file is fine

	// Another user's empty file, even mode 0600 (they could read it, or fill it later).
	if (geteuid() == 0) {
		const std::string theirs = (d.path / "theirs").string();
		f = std::fopen(theirs.c_str(), "w");
		REQUIRE(f);
		std::fclose(f);
		for (const mode_t mode : {0644, 0600}) {
			REQUIRE(chown(theirs.c_str(), 65534, 65534) == 0);
			REQUIRE(chmod(theirs.c_str(), mode) == 0);
			const std::string e = open_error(theirs);
			INFO(e);
			CHECK(e.find("backup=" + theirs + ": owned by") == 0);
			CHECK(e.find("uid 65534") != std::string::npos);
			CHECK(e.find("not owned by") != std::string::npos);
			CHECK(std::filesystem::file_size(theirs) == 0);
		}
	} else {
		WARN("not root: cannot give a file to another user, not checked");
	}

	// A symbolic link: never followed, to a good backup file or to a place to create one.
	const std::string link = (d.path / "link").string(), dangling = (d.path / "dangling").string();
	REQUIRE(symlink(made.c_str(), link.c_str()) == 0);
	CHECK(open_error(link).find("is a symbolic link") != std::string::npos);
	const std::string target = (d.path / "made-through-link").string();
	REQUIRE(symlink(target.c_str(), dangling.c_str()) == 0);
	CHECK(open_error(dangling).find("is a symbolic link") != std::string::npos);
	CHECK(!std::filesystem::exists(target));

	// A FIFO: refused at once.
	const std::string fifo = (d.path / "fifo").string();
	REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
	CHECK(open_error(fifo).find("not a regular file (a FIFO)") != std::string::npos);
}

TEST_CASE("backup: a writer thread that throws fails the backup: no slab is trusted, reads "
	  "that need it fail at once, writes go on, the file is not marked clean",
	  "[backup][boundary]")
{
	TmpDir d;
	const std::string path = (d.path / "f").string();
	// The fault fires at the writer's 3rd entry: it throws once, from the writer thread.
	std::atomic<int> entries{0};
	BackupOptions o = options(path, 7, 0);
	o.queue_bytes = 6 * 64 * 1024; // 2 slots per queue: a full queue waits for the writer
	o.fault = [&] {
		if (++entries == 3)
			throw std::runtime_error("test fault (backup writer)");
	};
	{
		Backup b(o);
		b.start(true, all, none);
		const auto data = fill(64 * 1024, 0x5a);
		for (int i = 0; i < 2; i++)
			REQUIRE(b.put(0, uint64_t(i) << 16, data.data(), uint32_t(data.size()), soon()) == 0);
		std::vector<std::byte> got(64 * 1024);
		REQUIRE(b.read(got.data(), uint32_t(got.size()), 0, soon()) == 0);
		CHECK(got == data);
		CHECK(b.trusted(0));
		CHECK_FALSE(b.broken());
		// The third entry makes the writer throw.
		REQUIRE(b.put(1, 2 << 20, data.data(), uint32_t(data.size()), soon()) == 0);
		const auto t0 = std::chrono::steady_clock::now();
		while (!b.broken() && std::chrono::steady_clock::now() - t0 < 5s)
			std::this_thread::sleep_for(1ms);
		REQUIRE(b.broken());
		// Every slab distrusted: a read that needs the file fails, at once (not at its
		// deadline); so does a punch.
		for (uint64_t s = 0; s < 4; s++)
			CHECK_FALSE(b.trusted(s));
		CHECK(b.untrusted_count() == 4);
		const auto t1 = std::chrono::steady_clock::now();
		CHECK(b.read(got.data(), uint32_t(got.size()), 0, soon()) == EIO);
		CHECK(b.punch(0, 1 << 20, soon()) == EIO);
		// Writes no longer need the file: put() returns at once, even on a queue the dead
		// writer left full.
		for (int i = 0; i < 8; i++)
			CHECK(b.put(2, 3 << 20, data.data(), uint32_t(data.size()), soon()) == 0);
		CHECK(std::chrono::steady_clock::now() - t1 < 1s);
	} // (the destructor returns: it does not wait for the dead writer's queue)
	// Not marked clean: the next run does not trust it.
	Backup next(options(path, 8, 7));
	CHECK_FALSE(next.clean());
}
