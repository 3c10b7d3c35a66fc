// SPDX-License-Identifier: Apache-2.0
// The public API's value types: the DType helpers, TensorView, and PoolerLayer with pooler_layer
// (include/pooler/pooler.hpp).
#include "runtime/api_types.hpp"

#include <fmt/format.h>

#include "pooler/error.hpp"

namespace pooler {

// ---- views ------------------------------------------------------------------------------

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return "BF16";
    case DType::f32:
      return "FP32";
    case DType::u8:
      return "U8";
    case DType::e4m3:
      return "E4M3";
  }
  return "?";
}

int element_bytes(DType dtype) { return dtype == DType::f32 ? 4 : dtype == DType::bf16 ? 2 : 1; }

TensorView TensorView::matrix(CUdeviceptr data, DType dtype, std::int64_t rows, std::int64_t cols) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.dims = 2;
  view.shape[0] = rows;
  view.shape[1] = cols;
  view.stride[0] = cols;
  view.stride[1] = 1;
  return view;
}

TensorView TensorView::vector(CUdeviceptr data, DType dtype, std::int64_t length) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.dims = 1;
  view.shape[0] = length;
  view.stride[0] = 1;
  return view;
}

bool TensorView::contiguous() const { return dims == 1 ? stride[0] == 1 : (stride[1] == 1 && stride[0] == shape[1]); }

std::string TensorView::describe() const {
  if (dims == 1) {
    return fmt::format("{} [{}] stride [{}] at {:#x}", to_string(dtype), shape[0], stride[0], data);
  }
  return fmt::format("{} [{}, {}] strides [{}, {}] at {:#x}", to_string(dtype), shape[0], shape[1], stride[0],
                     stride[1], data);
}

// Throws InvalidArgument unless `view` is a contiguous `dtype` tensor of `shape`
// (a -1 dimension matches anything), aligned to `alignment` bytes.
void expect(const TensorView& view, const std::string& what, DType dtype, std::initializer_list<std::int64_t> shape,
            int alignment) {
  std::string wanted = fmt::format("{} [", to_string(dtype));
  int index = 0;
  bool ok = view.dtype == dtype && view.dims == static_cast<int>(shape.size());
  for (std::int64_t extent : shape) {
    wanted += fmt::format("{}{}", index == 0 ? "" : ", ", extent < 0 ? std::string("any") : std::to_string(extent));
    ok = ok && (extent < 0 || (index < view.dims && view.shape[index] == extent));
    ++index;
  }
  wanted += "], contiguous";
  if (!ok || !view.contiguous()) {
    throw InvalidArgument(fmt::format("{} is {}; expected {}", what, view.describe(), wanted));
  }
  if (view.data == 0) {
    throw InvalidArgument(fmt::format("{} is a null pointer", what));
  }
  if (view.data % static_cast<CUdeviceptr>(alignment) != 0) {
    throw InvalidArgument(fmt::format("{} at {:#x} is not aligned to {} bytes", what, view.data, alignment));
  }
}

PoolerLayer pooler_layer(const TensorView& weight, const TensorView& norm_weight, float eps, float gain_center,
                         const std::optional<TensorView>& global_scale, int tp, int rank) {
  if (tp < 1 || rank < 0 || rank >= tp) {
    throw InvalidArgument(fmt::format("rank {} of tp {}: expected 0 <= rank < tp", rank, tp));
  }
  if (weight.dims != 2 || weight.dtype != DType::bf16 || !weight.contiguous()) {
    throw InvalidArgument(fmt::format("pooler weight is {}; expected a contiguous BF16 [P, H]", weight.describe()));
  }
  if (weight.data == 0 || weight.data % 16 != 0) {
    throw InvalidArgument(
        fmt::format("pooler weight at {:#x}: expected a non-null, 16-byte aligned pointer", weight.data));
  }
  const std::int64_t pooled = weight.shape[0];
  const std::int64_t hidden = weight.shape[1];
  if (pooled % tp != 0) {
    throw InvalidArgument(fmt::format("pooler weight has P = {} rows, not divisible by tp {}", pooled, tp));
  }
  expect(norm_weight, "pre_expert_norm weight", DType::bf16, {pooled}, 16);
  if (global_scale) {
    expect(*global_scale, "NVFP4 input global scale", DType::f32, {1}, 4);
  }
  const std::int64_t shard = pooled / tp;
  PoolerLayer layer;
  layer.weight =
      TensorView::matrix(weight.data + static_cast<CUdeviceptr>(rank * shard * hidden * 2), DType::bf16, shard, hidden);
  layer.norm_weight = norm_weight;
  layer.eps = eps;
  layer.gain_center = gain_center;
  layer.global_scale = global_scale;
  return layer;
}

}  // namespace pooler
