// SPDX-License-Identifier: Apache-2.0
#include "tools/harness/host_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pooler::harness {

double bf16_value(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::uint16_t bf16_round(float value) {
  std::uint32_t u;
  std::memcpy(&u, &value, sizeof u);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

std::uint16_t bf16_round_positive_zero(float value) {
  const std::uint16_t bits = bf16_round(value);
  return bits == 0x8000 ? std::uint16_t{0} : bits;
}

long long count_gemm_disagreements(std::span<const std::uint16_t> got, std::span<const std::uint16_t> reference) {
  double largest = 0;
  for (std::uint16_t v : reference) largest = std::max(largest, std::fabs(bf16_value(v)));
  long long disagreements = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double expected = bf16_value(reference[i]);
    const double ulp = expected == 0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, std::ilogb(expected) - 7);
    const double difference = std::fabs(bf16_value(got[i]) - expected);
    if (!(difference <= 2 * ulp || difference <= largest * std::ldexp(1.0, -10))) ++disagreements;
  }
  return disagreements;
}

}  // namespace pooler::harness
