// SPDX-License-Identifier: MIT
// Unit tests for the Prometheus text helper (common/obs/metrics_text.h): family headers, labels and
// their escaping, number formatting, cumulative histogram buckets and the latency buckets.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "common/obs/metrics_text.h"

using namespace rdmaswap;

TEST_CASE("metrics text: HELP and TYPE, then samples with and without labels", "[metrics]")
{
	MetricsText m;
	m.family("rdmaswap_x_bytes_total", "counter", "Bytes.");
	m.sample("rdmaswap_x_bytes_total", {{"transport", "tcp"}, {"direction", "read"}},
		 uint64_t(18446744073709551615ull));
	m.sample("rdmaswap_x_bytes_total", {}, uint64_t(0));
	m.single("rdmaswap_y", "gauge", "One.", 7);
	CHECK(m.text() == "# HELP rdmaswap_x_bytes_total Bytes.\n"
			  "# TYPE rdmaswap_x_bytes_total counter\n"
			  "rdmaswap_x_bytes_total{transport=\"tcp\",direction=\"read\"} "
			  "18446744073709551615\n"
			  "rdmaswap_x_bytes_total 0\n"
			  "# HELP rdmaswap_y One.\n"
			  "# TYPE rdmaswap_y gauge\n"
			  "rdmaswap_y 7\n");
}

TEST_CASE("metrics text: label values and help are escaped", "[metrics]")
{
	CHECK(metrics_escape("a\\b\"c\nd", true) == "a\\\\b\\\"c\\nd");
	CHECK(metrics_escape("a\\b\"c\nd", false) == "a\\\\b\"c\\nd");
	MetricsText m;
	m.family("rdmaswap_z", "gauge", "Line one\nline \\two");
	m.sample("rdmaswap_z", {{"donor", "host\"1\":7471"}}, uint64_t(1));
	CHECK(m.text() == "# HELP rdmaswap_z Line one\\nline \\\\two\n"
			  "# TYPE rdmaswap_z gauge\n"
			  "rdmaswap_z{donor=\"host\\\"1\\\":7471\"} 1\n");
}

TEST_CASE("metrics text: doubles read back the same", "[metrics]")
{
	MetricsText m;
	m.sample("a", {}, 0.5);
	m.sample("b", {}, 1e-05);
	m.sample("c", {}, 3.0);
	CHECK(m.text() == "a 0.5\nb 1e-05\nc 3\n");
}

TEST_CASE("latency buckets: le bounds are inclusive, the last is +Inf", "[metrics]")
{
	CHECK(latency_bucket(0) == 0);
	CHECK(latency_bucket(10'000) == 0);       // le 10 us
	CHECK(latency_bucket(10'001) == 1);       // le 25 us
	CHECK(latency_bucket(1'000'000'000) == kLatencyBoundsNs.size() - 1); // le 1 s
	CHECK(latency_bucket(1'000'000'001) == kLatencyBuckets - 1);          // +Inf
	CHECK(latency_bucket(UINT64_MAX) == kLatencyBuckets - 1);
	for (size_t i = 1; i < kLatencyBoundsNs.size(); i++)
		CHECK(kLatencyBoundsNs[i - 1] < kLatencyBoundsNs[i]);
}

TEST_CASE("metrics text: a histogram's buckets are cumulative, sum in seconds", "[metrics]")
{
	LatencyHistogram h;
	h.record(5'000);         // 10 us bucket
	h.record(20'000);        // 25 us
	h.record(20'000);        // 25 us
	h.record(2'000'000'000); // +Inf
	LatencySnapshot s = h.snapshot();
	CHECK(s.count() == 4);
	CHECK(s.sum_ns == 2'000'045'000);
	LatencySnapshot twice = s;
	twice += s;
	CHECK(twice.count() == 8);
	MetricsText m;
	m.histogram("rdmaswap_d_seconds", {{"direction", "write"}}, s);
	const std::string t = m.text();
	CHECK(t.find("rdmaswap_d_seconds_bucket{direction=\"write\",le=\"1e-05\"} 1\n") !=
	      std::string::npos);
	CHECK(t.find("rdmaswap_d_seconds_bucket{direction=\"write\",le=\"2.5e-05\"} 3\n") !=
	      std::string::npos);
	CHECK(t.find("rdmaswap_d_seconds_bucket{direction=\"write\",le=\"1\"} 3\n") !=
	      std::string::npos);
	CHECK(t.find("rdmaswap_d_seconds_bucket{direction=\"write\",le=\"+Inf\"} 4\n") !=
	      std::string::npos);
	CHECK(t.find("rdmaswap_d_seconds_sum{direction=\"write\"} 2.000045\n") != std::string::npos);
	CHECK(t.find("rdmaswap_d_seconds_count{direction=\"write\"} 4\n") != std::string::npos);
	// One line per bucket, plus _sum and _count.
	CHECK(std::count(t.begin(), t.end(), '\n') == long(kLatencyBuckets + 2));
}

TEST_CASE("latency histogram: records from many threads are all counted", "[metrics]")
{
	LatencyHistogram h;
	std::vector<std::thread> ts;
	for (int t = 0; t < 4; t++)
		ts.emplace_back([&h] {
			for (int i = 0; i < 10000; i++)
				h.record(uint64_t(i) * 1000);
		});
	for (auto &t : ts)
		t.join();
	const LatencySnapshot s = h.snapshot();
	CHECK(s.count() == 40000);
	CHECK(s.sum_ns == 4 * 1000ull * (9999ull * 10000 / 2));
}
