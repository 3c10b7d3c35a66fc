// SPDX-License-Identifier: Apache-2.0
// The statistics the benchmark tools report over timed samples.
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

namespace pooler::harness {

// The middle sample, or the mean of the two middle ones; 0 for no samples.
inline double median(std::vector<double> samples) {
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 == 1 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

struct Spread {
  double median = 0, p10 = 0, p90 = 0, min = 0, max = 0, mean = 0;
};

// The spread of `samples`; empty gives zeros. p10 and p90 are the nearest-rank samples.
inline Spread spread_of(std::vector<double> samples) {
  Spread s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  auto at = [&](double q) {
    return samples[std::min(n - 1, static_cast<std::size_t>(q * static_cast<double>(n - 1) + 0.5))];
  };
  s.median = median(samples);
  s.p10 = at(0.10);
  s.p90 = at(0.90);
  s.min = samples.front();
  s.max = samples.back();
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(n);
  return s;
}

}  // namespace pooler::harness
