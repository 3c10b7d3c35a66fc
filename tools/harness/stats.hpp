// The median the benchmark tools report: the middle sample, or the mean of the
// two middle ones; 0 for no samples.
#pragma once

#include <algorithm>
#include <vector>

namespace pooler::bench {

inline double median(std::vector<double> samples) {
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 == 1 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

}  // namespace pooler::bench
