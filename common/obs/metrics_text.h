// SPDX-License-Identifier: MIT
// Prometheus text exposition (format 0.0.4) for the memserver's /metrics and the plugin's
// metrics-file=, and the latency histogram the plugin records on its data path.
//
// Contracts:
// - MetricsText writes each family as `# HELP`, `# TYPE`, then its samples, in the order the
//   caller gives them; a family must be started once, before its samples (the format forbids
//   splitting a family). Label values and help texts are escaped as the format says
//   (backslash, double quote, newline). Control path only: it allocates.
// - LatencyHistogram::record() neither allocates nor locks: a few relaxed atomic additions,
//   safe from any thread; snapshot() reads them relaxed (a snapshot taken while requests
//   finish may count one in a bucket but not yet in the sum: a scrape is never exact).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace rdmaswap {

// Upper bounds of the latency buckets, in nanoseconds: 10 us to 1 s, and +Inf after them.
inline constexpr std::array<uint64_t, 16> kLatencyBoundsNs = {
	10'000,     25'000,     50'000,      100'000,     250'000,     500'000,
	1'000'000,  2'500'000,  5'000'000,   10'000'000,  25'000'000,  50'000'000,
	100'000'000, 250'000'000, 500'000'000, 1'000'000'000,
};
inline constexpr size_t kLatencyBuckets = kLatencyBoundsNs.size() + 1; // the last: +Inf

// The bucket of a latency of `ns`: the first whose bound is >= ns (Prometheus' `le`).
inline size_t latency_bucket(uint64_t ns)
{
	size_t i = 0;
	while (i < kLatencyBoundsNs.size() && ns > kLatencyBoundsNs[i])
		i++;
	return i;
}

// A point-in-time copy of a LatencyHistogram (or a sum of several).
struct LatencySnapshot {
	std::array<uint64_t, kLatencyBuckets> buckets{}; // per bucket, not cumulative
	uint64_t sum_ns = 0;
	LatencySnapshot &operator+=(const LatencySnapshot &o);
	uint64_t count() const;
};

// Request latencies in fixed buckets (kLatencyBoundsNs).
class LatencyHistogram {
public:
	void record(uint64_t ns)
	{
		buckets_[latency_bucket(ns)].fetch_add(1, std::memory_order_relaxed);
		sum_ns_.fetch_add(ns, std::memory_order_relaxed);
	}
	LatencySnapshot snapshot() const;

private:
	std::array<std::atomic<uint64_t>, kLatencyBuckets> buckets_{};
	std::atomic<uint64_t> sum_ns_{0};
};

// Labels of one sample: {{"direction", "read"}, ...}, written in this order.
using MetricLabels = std::initializer_list<std::pair<std::string_view, std::string_view>>;

// Builds one exposition.
class MetricsText {
public:
	// Start family `name` ("rdmaswap_..."), `type` "counter", "gauge" or "histogram".
	void family(std::string_view name, std::string_view type, std::string_view help);
	// One sample `name{labels} value`. `name` is the family's (or, for a histogram, its
	// _bucket/_sum/_count series). Integers are written exactly; doubles as the shortest
	// text that reads back the same.
	void sample(std::string_view name, MetricLabels labels, uint64_t value);
	void sample(std::string_view name, MetricLabels labels, double value);
	// A family with one sample and no labels.
	void single(std::string_view name, std::string_view type, std::string_view help,
		    uint64_t value);
	// The series of histogram family `name` for `labels` (the family started already):
	// cumulative `_bucket{...,le="..."}` samples in seconds, `_sum` in seconds, `_count`.
	void histogram(std::string_view name, MetricLabels labels, const LatencySnapshot &h);
	const std::string &text() const { return out_; }
	std::string take() { return std::move(out_); }

private:
	void series(std::string_view name, MetricLabels labels, std::string_view le);
	std::string out_;
};

// A label value or help text escaped for the text format: `\` and newline, and in label
// values also `"`.
std::string metrics_escape(std::string_view s, bool label_value);

} // namespace rdmaswap
