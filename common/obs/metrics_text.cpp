// SPDX-License-Identifier: MIT
// Prometheus text exposition and the latency histogram (contracts in metrics_text.h).
#include "common/obs/metrics_text.h"

#include <fmt/format.h>

namespace rdmaswap {

LatencySnapshot &LatencySnapshot::operator+=(const LatencySnapshot &o)
{
	for (size_t i = 0; i < kLatencyBuckets; i++)
		buckets[i] += o.buckets[i];
	sum_ns += o.sum_ns;
	return *this;
}

uint64_t LatencySnapshot::count() const
{
	uint64_t n = 0;
	for (uint64_t b : buckets)
		n += b;
	return n;
}

LatencySnapshot LatencyHistogram::snapshot() const
{
	LatencySnapshot s;
	for (size_t i = 0; i < kLatencyBuckets; i++)
		s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
	s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
	return s;
}

std::string metrics_escape(std::string_view s, bool label_value)
{
	std::string out;
	out.reserve(s.size());
	for (char c : s) {
		if (c == '\\')
			out += "\\\\";
		else if (c == '\n')
			out += "\\n";
		else if (c == '"' && label_value)
			out += "\\\"";
		else
			out += c;
	}
	return out;
}

void MetricsText::family(std::string_view name, std::string_view type, std::string_view help)
{
	fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name,
		       metrics_escape(help, false), name, type);
}

void MetricsText::series(std::string_view name, MetricLabels labels, std::string_view le)
{
	out_ += name;
	if (labels.size() == 0 && le.empty())
		return;
	char sep = '{';
	for (const auto &[k, v] : labels) {
		fmt::format_to(std::back_inserter(out_), "{}{}=\"{}\"", sep, k,
			       metrics_escape(v, true));
		sep = ',';
	}
	if (!le.empty())
		fmt::format_to(std::back_inserter(out_), "{}le=\"{}\"", sep, le);
	out_ += '}';
}

void MetricsText::sample(std::string_view name, MetricLabels labels, uint64_t value)
{
	series(name, labels, {});
	fmt::format_to(std::back_inserter(out_), " {}\n", value);
}

void MetricsText::sample(std::string_view name, MetricLabels labels, double value)
{
	series(name, labels, {});
	fmt::format_to(std::back_inserter(out_), " {}\n", value);
}

void MetricsText::single(std::string_view name, std::string_view type, std::string_view help,
			 uint64_t value)
{
	family(name, type, help);
	sample(name, {}, value);
}

void MetricsText::histogram(std::string_view name, MetricLabels labels, const LatencySnapshot &h)
{
	const std::string base(name);
	uint64_t cumulative = 0;
	for (size_t i = 0; i < kLatencyBuckets; i++) {
		cumulative += h.buckets[i];
		const std::string le = i < kLatencyBoundsNs.size()
					       ? fmt::format("{}", double(kLatencyBoundsNs[i]) / 1e9)
					       : std::string("+Inf");
		series(base + "_bucket", labels, le);
		fmt::format_to(std::back_inserter(out_), " {}\n", cumulative);
	}
	sample(base + "_sum", labels, double(h.sum_ns) / 1e9);
	sample(base + "_count", labels, cumulative);
}

} // namespace rdmaswap
