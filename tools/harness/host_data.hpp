// SPDX-License-Identifier: Apache-2.0
// Host-side data helpers of the tests and tools: BF16 bits and values, and how
// far two GEMM results may differ by summation order alone.
#pragma once

#include <cstdint>
#include <span>

namespace pooler::harness {

// The value of BF16 bits (exact in a double).
double bf16_value(std::uint16_t bits);

// The BF16 bits of a finite float, rounded to nearest even.
std::uint16_t bf16_round(float value);

// bf16_round with -0.0 made +0.0: inputs with no -0.0 keep the fused outputs
// equal to the stock ones bit for bit (a projected -0.0 is the one documented
// exception).
std::uint16_t bf16_round_positive_zero(float value);

// The outputs of `got` that differ from `reference` (same length, BF16) by more
// than 2 BF16 ulps of the reference value and by more than 2^-10 of the
// reference's largest magnitude: two GEMMs that sum in FP32 in different orders
// differ by an ulp or two, more only where a sum nearly cancels.
long long count_gemm_disagreements(std::span<const std::uint16_t> got, std::span<const std::uint16_t> reference);

}  // namespace pooler::harness
