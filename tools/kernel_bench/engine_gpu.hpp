// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --engine: what every rank of the engine rig shares on the GPU.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "runtime/gather/gather_kernels.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/pooler_forms.hpp"
#include "tools/harness/bench_forms.hpp"
#include "tools/harness/cublas_gemm.hpp"
#include "tools/kernel_bench/engine.hpp"

namespace pooler::bench {

// What every rank shares on the GPU: the loaded surrogates, cuBLAS, the fill, the read ceiling.
struct Gpu {
  const EngineOptions& o;
  KernelCache& cache;
  const std::string& arch;
  const DeviceInfo& info;
  CUcontext context;
  const Stream& stream;
  harness::CublasGemm cublas;
  LoadedForm surrogates, fill_loaded, norm_loaded, quantize_loaded;
  Kernel norm, attention, allreduce, null, router, experts, fill;
  StockNormLauncher stock_norm;
  StockQuantizeLauncher stock_quantize;
  double ceiling_gbps = 0;

  Gpu(const EngineOptions& options, KernelCache& c, const std::string& a, const DeviceInfo& i, CUcontext ctx,
      const Stream& s)
      : o(options),
        cache(c),
        arch(a),
        info(i),
        context(ctx),
        stream(s),
        cublas(s.get()),
        surrogates(load(engine_surrogate_form(o.hidden, o.pooled, o.experts))),
        fill_loaded(load(fill_form())),
        norm_loaded(load(stock_norm_form(o.pooled, NormConstants{}.eps, NormConstants{}.gain_center))),
        quantize_loaded(load(stock_quantize_form(o.pooled))),
        norm(surrogates.kernel(kEngineNormEntry)),
        attention(surrogates.kernel(kEngineAttentionEntry)),
        allreduce(surrogates.kernel(kEngineAllReduceEntry)),
        null(surrogates.kernel(kEngineNullEntry)),
        router(surrogates.kernel(kEngineRouterEntry)),
        experts(surrogates.kernel(kEngineExpertsEntry)),
        fill(fill_loaded.kernel(kFillEntry)),
        stock_norm(norm_loaded, o.pooled, kEngineMaxRows),
        stock_quantize(quantize_loaded, o.pooled, kEngineMaxRows) {}

  LoadedForm load(const Form& form) const { return LoadedForm(*cache.get(form, arch).entry, context); }

  void fill_bf16(CUdeviceptr out, std::size_t count, unsigned long long seed, float deviation) const {
    LaunchShape shape;
    shape.block_x = static_cast<unsigned>(kFillThreads);
    const std::size_t blocks = (count + kFillThreads - 1) / kFillThreads;
    shape.grid_x =
        static_cast<unsigned>(std::min<std::size_t>(blocks, static_cast<std::size_t>(16) * info.multiprocessors));
    const unsigned long long n = count, first = 0;
    fill(stream.get(), shape, out, n, first, seed + o.seed * 1000, deviation, 0.0f);
  }
};

}  // namespace pooler::bench
