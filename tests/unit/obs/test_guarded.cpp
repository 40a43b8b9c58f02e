// SPDX-License-Identifier: MIT
// Unit tests for the thread exception boundary (common/obs/guarded_main.h, issue 29): what a
// thread's body throws, of any type, is caught and logged once as an error naming the thread
// and what follows; the callback decides whether the body runs again or the thread ends; a
// throwing callback ends it too; guarded_call reports a failure to its caller. Nothing reaches
// std::terminate (the test would abort).
#include <catch2/catch.hpp>

#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/sink.h>

#include "common/obs/guarded_main.h"
#include "common/obs/log.h"

using namespace rdmaswap;

namespace {

// Keeps each message's level and text. Thread-safe.
class RecordingSink final : public spdlog::sinks::sink {
public:
	void log(const spdlog::details::log_msg &msg) override
	{
		std::lock_guard lock(mu);
		lines.emplace_back(msg.level, std::string(msg.payload.data(), msg.payload.size()));
	}
	void flush() override {}
	void set_pattern(const std::string &) override {}
	void set_formatter(std::unique_ptr<spdlog::formatter>) override {}
	std::vector<std::pair<spdlog::level::level_enum, std::string>> taken()
	{
		std::lock_guard lock(mu);
		auto out = std::move(lines);
		lines.clear();
		return out;
	}
	std::mutex mu;
	std::vector<std::pair<spdlog::level::level_enum, std::string>> lines;
};

// The loggers of these tests, made once with the recording sink (a logger keeps the sink it
// was made with).
RecordingSink &sink()
{
	static auto s = [] {
		auto r = std::make_shared<RecordingSink>();
		set_log_sink(r);
		logger("guarded-test");
		set_log_sink(nullptr);
		return r;
	}();
	return *s;
}

struct Odd {}; // an exception of no std type

} // namespace

TEST_CASE("guarded_thread: a failure is logged once naming the thread; Again runs the body "
	  "again, End ends the thread",
	  "[guarded][boundary]")
{
	RecordingSink &s = sink();
	s.taken();
	set_log_level("debug");
	int runs = 0, callbacks = 0;
	std::vector<std::string> whats;
	std::thread t([&] {
		guarded_thread(
			"guarded-test", "the test thread", "it starts again",
			[&] {
				switch (++runs) {
				case 1:
					throw std::runtime_error("first");
				case 2:
					throw Odd{};
				case 3:
					throw 7;
				default:
					return; // the fourth run ends normally: the thread ends
				}
			},
			[&](const char *what) {
				callbacks++;
				whats.emplace_back(what);
				return AfterFailure::Again;
			});
	});
	t.join();
	set_log_level("info");
	CHECK(runs == 4);
	CHECK(callbacks == 3);
	CHECK(whats == std::vector<std::string>{"first", "an exception of an unknown type",
						"an exception of an unknown type"});
	const auto lines = s.taken();
	REQUIRE(lines.size() == 3);
	CHECK(lines[0].first == spdlog::level::err);
	CHECK(lines[0].second == "the test thread failed: first; it starts again");
	// Failing again: debug lines, not errors (one error line per failing thread).
	CHECK(lines[1].first == spdlog::level::debug);
	CHECK(lines[1].second == "the test thread failed again: an exception of an unknown type");
	CHECK(lines[2].first == spdlog::level::debug);

	// End: the body does not run again.
	runs = 0;
	guarded_thread(
		"guarded-test", "the second thread", "it ends",
		[&] {
			runs++;
			throw std::logic_error("a bug");
		},
		[](const char *) { return AfterFailure::End; });
	CHECK(runs == 1);
	const auto more = s.taken();
	REQUIRE(more.size() == 1);
	CHECK(more[0].second == "the second thread failed: a bug; it ends");

	// A callback that throws ends the thread rather than std::terminate.
	runs = 0;
	guarded_thread(
		"guarded-test", "the third thread", "it ends",
		[&] {
			runs++;
			throw std::runtime_error("x");
		},
		[](const char *) -> AfterFailure { throw std::runtime_error("the callback too"); });
	CHECK(runs == 1);
	s.taken();
}

TEST_CASE("guarded_call: false and one error line when the body throws", "[guarded][boundary]")
{
	RecordingSink &s = sink();
	s.taken();
	int v = 0;
	CHECK(guarded_call("guarded-test", "a callback", [&] { v = 1; }));
	CHECK(v == 1);
	CHECK(s.taken().empty());
	CHECK_FALSE(guarded_call("guarded-test", "a callback",
				 [] { throw std::out_of_range("map::at"); }));
	const auto lines = s.taken();
	REQUIRE(lines.size() == 1);
	CHECK(lines[0].first == spdlog::level::err);
	CHECK(lines[0].second == "a callback failed: map::at");
}
