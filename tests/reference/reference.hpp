// SPDX-License-Identifier: Apache-2.0
// The CPU reference of docs/design/numerics.md: the pooler GEMM, pre_expert_norm and the NVFP4
// quantizer, written for clarity rather than speed.
//
// Its scalar conversions are deliberately a second, independent implementation of
// the ones in kernel_templates/common/numerics.cuh (nearest-value searches in double instead
// of integer rounding), so that the exhaustive tests compare two derivations of the
// same contract. Where the GPU uses approximate instructions (rsqrt, rcp) the
// reference uses correctly rounded operations instead: it is the exact-arithmetic
// yardstick, not a bit-exact twin of the stock kernels.
#pragma once

#include <cstdint>
#include <vector>

namespace pooler::reference {

// Columns per NVFP4 scale block.
inline constexpr int kNvfp4Block = 16;

// ---- scalar conversions ----------------------------------------------------------

// BF16 -> FP32 (exact).
float ref_bf16_to_float(std::uint16_t h);
// FP32 -> BF16, round to nearest even, no flush, overflow to inf, NaN -> 0x7FFF.
std::uint16_t ref_bf16_round(float x);
// FP32 -> E4M3 (e4m3fn), round to nearest even, saturate to +-448, NaN -> 0x7F.
std::uint8_t ref_e4m3_encode(float x);
// E4M3 -> FP32 (exact); 0x7F / 0xFF give a quiet NaN with the code's sign.
float ref_e4m3_decode(std::uint8_t b);
// FP32 -> E2M1 code (low nibble, sign in bit 3), nearest even, saturate to +-6, NaN -> 0x7.
std::uint8_t ref_e2m1_encode(float x);
// E2M1 code (low nibble) -> FP32 (exact).
float ref_e2m1_decode(std::uint8_t code);

// ---- the pooler's operations -----------------------------------------------------

// c[i][j] = sum over t of x[i][t] * w[j][t] for x [b, k] and w [n, k] BF16, summed in
// double and returned as float (not rounded to BF16: tests allow one BF16 ulp).
std::vector<float> gemm(const std::uint16_t* x, const std::uint16_t* w, int b, int n, int k);

// pre_expert_norm of b rows of p BF16 values with a BF16 weight [p]:
// var = float(sum(xf*xf) / p) (sum in double), inv = correctly rounded 1/sqrt(var + eps)
// (var + eps added in FP32), y = bf16_rn((xf * inv) * (float(w) + gain_center)) in FP32.
std::vector<std::uint16_t> rms_norm(const std::uint16_t* rows, int b, int p, const std::uint16_t* weight, float eps,
                                    float gain_center);

// NVFP4 expert input: packed codes [b, p/2] (column 2k in the low nibble of byte k) and
// E4M3 block scales [b, p/16], row-major.
struct Nvfp4 {
  std::vector<std::uint8_t> packed;
  std::vector<std::uint8_t> scales;
};

// docs/design/numerics.md steps 1-6 with correctly rounded reciprocals (1.0f / x) in place of
// rcp.approx.ftz. p must be a multiple of 16.
Nvfp4 nvfp4_quantize(const std::uint16_t* y, int b, int p, float global_scale);

// The values an NVFP4 tensor stands for: code * scale / global_scale, [b, p] row-major.
std::vector<float> nvfp4_dequantize(const Nvfp4& q, int b, int p, float global_scale);

}  // namespace pooler::reference
