// SPDX-License-Identifier: MIT
// Unit tests for logging: LogLimiter, the logger table (lookup, level, threads) and the
// default sink's line format.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <spdlog/sinks/sink.h>

#include "common/obs/log.h"

using rdmaswap::LogLimiter;

TEST_CASE("log limiter: a burst per period, then a count of what was dropped", "[log]")
{
	LogLimiter lim(3, std::chrono::seconds(1));
	uint64_t suppressed = 99;
	for (int i = 0; i < 3; i++) {
		REQUIRE(lim.allow(suppressed));
		CHECK(suppressed == 0);
	}
	for (int i = 0; i < 50; i++)
		CHECK_FALSE(lim.allow(suppressed));
	std::this_thread::sleep_for(std::chrono::milliseconds(1100));
	REQUIRE(lim.allow(suppressed));
	CHECK(suppressed == 50); // said once, with the first message of the next period
	REQUIRE(lim.allow(suppressed));
	CHECK(suppressed == 0);
}

namespace {

// Counts the messages that reach it, per level. Thread-safe.
class CountingSink final : public spdlog::sinks::sink {
public:
	void log(const spdlog::details::log_msg &msg) override { count[msg.level]++; }
	void flush() override {}
	void set_pattern(const std::string &) override {}
	void set_formatter(std::unique_ptr<spdlog::formatter>) override {}
	std::atomic<int> count[spdlog::level::n_levels] = {};
};

// Installs `sink` for the loggers created in the test; restores the default sink and level
// when the test ends, however it ends.
struct SinkGuard {
	explicit SinkGuard(spdlog::sink_ptr sink) { rdmaswap::set_log_sink(std::move(sink)); }
	~SinkGuard()
	{
		rdmaswap::set_log_sink(nullptr);
		rdmaswap::set_log_level("info");
	}
};

} // namespace

TEST_CASE("logger: one logger per name, the same on every lookup", "[log]")
{
	auto *a = rdmaswap::logger("test-same-a").get();
	auto *b = rdmaswap::logger("test-same-b").get();
	REQUIRE(a != nullptr);
	REQUIRE(b != nullptr);
	CHECK(a != b);
	CHECK(a->name() == "test-same-a");
	CHECK(rdmaswap::logger("test-same-a").get() == a);
	CHECK(rdmaswap::logger(std::string("test-same-") + "b").get() == b);
	// A name longer than kMaxLoggerName is cut, and still found again (not re-created).
	const std::string long_name(rdmaswap::kMaxLoggerName + 10, 'x');
	auto *l = rdmaswap::logger(long_name).get();
	CHECK(l->name() == long_name.substr(0, rdmaswap::kMaxLoggerName));
	CHECK(rdmaswap::logger(long_name).get() == l);
}

TEST_CASE("logger: the configured level holds for existing and new loggers", "[log]")
{
	auto sink = std::make_shared<CountingSink>();
	SinkGuard guard(sink);
	REQUIRE(rdmaswap::set_log_level("info")); // the default
	const auto &l = rdmaswap::logger("test-level");
	l->debug("not shown at info");
	l->info("shown");
	CHECK(sink->count[spdlog::level::debug] == 0);
	CHECK(sink->count[spdlog::level::info] == 1);

	REQUIRE(rdmaswap::set_log_level("warn"));
	l->info("not shown at warn");
	l->warn("shown");
	const auto &later = rdmaswap::logger("test-level-later"); // created after the change
	later->info("not shown at warn");
	later->error("shown");
	CHECK(sink->count[spdlog::level::info] == 1);
	CHECK(sink->count[spdlog::level::warn] == 1);
	CHECK(sink->count[spdlog::level::err] == 1);

	REQUIRE(rdmaswap::set_log_level("debug"));
	l->debug("shown at debug");
	later->debug("shown at debug");
	CHECK(sink->count[spdlog::level::debug] == 2);

	CHECK_FALSE(rdmaswap::set_log_level("loud"));
	CHECK(l->level() == spdlog::level::debug); // an unknown name changes nothing
}

TEST_CASE("logger: lookups and logging from many threads at once", "[log]")
{
	auto sink = std::make_shared<CountingSink>();
	SinkGuard guard(sink);
	REQUIRE(rdmaswap::set_log_level("info"));
	constexpr int kThreads = 8, kNames = 6, kRounds = 2000;
	// Every thread looks up the same new names (each created once, by whichever thread comes
	// first) while another thread changes the level; all must agree on each name's logger.
	spdlog::logger *seen[kThreads][kNames] = {};
	std::atomic<bool> go{false};
	std::vector<std::thread> threads;
	for (int t = 0; t < kThreads; t++)
		threads.emplace_back([&, t] {
			while (!go.load())
				std::this_thread::yield();
			for (int r = 0; r < kRounds; r++) {
				const int i = (r + t) % kNames;
				const char name[] = {'t', 'e', 's', 't', '-', 'm', 't', char('0' + i), 0};
				auto *l = rdmaswap::logger(name).get();
				if (seen[t][i] && seen[t][i] != l)
					FAIL_CHECK("a second logger for " << name);
				seen[t][i] = l;
				if (r % 100 == 0)
					l->warn("thread {} round {}", t, r);
			}
		});
	std::thread level([&] {
		while (!go.load())
			std::this_thread::yield();
		for (int r = 0; r < 200; r++)
			rdmaswap::set_log_level(r % 2 ? "warn" : "info");
	});
	go = true;
	for (auto &th : threads)
		th.join();
	level.join();
	for (int i = 0; i < kNames; i++)
		for (int t = 1; t < kThreads; t++)
			CHECK(seen[t][i] == seen[0][i]);
	CHECK(sink->count[spdlog::level::warn] == kThreads * kRounds / 100);
}

TEST_CASE("logger: a lookup waits for no lock, not even spdlog's registry", "[log]")
{
	const auto &l = rdmaswap::logger("test-nolock");
	// spdlog::apply_all holds the registry's mutex while it calls us (for each registered
	// logger: register one so that it calls us at all). Meanwhile another thread looks up a
	// known logger; it must not wait for that mutex (the lookup used to).
	auto dummy = std::make_shared<spdlog::logger>("test-nolock-registry");
	spdlog::register_logger(dummy);
	std::atomic<bool> done{false};
	bool done_in_time = false;
	std::thread t;
	spdlog::apply_all([&](const std::shared_ptr<spdlog::logger> &) {
		if (t.joinable())
			return; // called once per registered logger: once is enough
		t = std::thread([&] {
			CHECK(rdmaswap::logger("test-nolock") == l);
			done = true;
		});
		for (int i = 0; i < 200 && !done; i++)
			std::this_thread::sleep_for(std::chrono::milliseconds(10));
		done_in_time = done;
	});
	t.join(); // on failure it was blocked until apply_all returned
	spdlog::drop("test-nolock-registry");
	CHECK(done_in_time);
}

TEST_CASE("logger: the default sink writes each message as one line", "[log]")
{
	int fds[2];
	REQUIRE(pipe(fds) == 0);
	spdlog::logger own("test-fd", rdmaswap::make_fd_sink(fds[1]));
	own.warn("value {} of {}", 1, "two");
	own.error("{}", std::string(5000, 'z')); // cut, not overflowing the stack buffer
	close(fds[1]);
	std::string out;
	char buf[4096];
	for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;)
		out.append(buf, size_t(n));
	close(fds[0]);
	const auto nl = out.find('\n');
	REQUIRE(nl != std::string::npos);
	const std::string first = out.substr(0, nl);
	// "2025-01-31T12:00:00.123 warning [test-fd] value 1 of two"
	REQUIRE(first.size() > 24);
	CHECK(first[4] == '-');
	CHECK(first[10] == 'T');
	CHECK(first[19] == '.');
	CHECK(first.substr(23) == " warning [test-fd] value 1 of two");
	const std::string second = out.substr(nl + 1);
	CHECK(second.find(" error [test-fd] zzz") == 23);
	CHECK(second.size() < 1100);
	CHECK(second.substr(second.size() - 5) == "z...\n");
}

TEST_CASE("log_summary: many failures as one line, the first few named", "[log]")
{
	using rdmaswap::log_summary;
	using Items = std::vector<std::pair<std::string, std::string>>;
	CHECK(log_summary(Items{}) == "");
	CHECK(log_summary(Items{{"a:1", "refused"}}) == "a:1 (refused)");
	CHECK(log_summary(Items{{"a:1", "refused"}, {"b:2", ""}}) == "a:1 (refused) and b:2");
	CHECK(log_summary(Items{{"a", "x"}, {"b", "y"}, {"c", "z"}}) == "a (x), b (y) and c (z)");
	Items many;
	for (int i = 0; i < 19; i++)
		many.emplace_back("h" + std::to_string(i), "refused");
	const std::string s = log_summary(many, 3);
	CHECK(s == "h0 (refused), h1 (refused), h2 (refused) and 16 more");
}
