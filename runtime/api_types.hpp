// SPDX-License-Identifier: Apache-2.0
// The public API's value types (include/pooler/pooler.hpp: DType, TensorView, PoolerLayer and
// pooler_layer), implemented in api_types.cpp, and the check of a tensor view that the Pooler's
// translation units share.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "pooler/pooler.hpp"

namespace pooler {

// Throws InvalidArgument unless `view` is a contiguous `dtype` tensor of `shape`
// (a -1 dimension matches anything), aligned to `alignment` bytes.
void expect(const TensorView& view, const std::string& what, DType dtype, std::initializer_list<std::int64_t> shape,
            int alignment);

}  // namespace pooler
