// pooler-kernel-bench: the pooler GEMM against the GPU's streaming-read
// ceiling and against cuBLAS, side by side, on one GPU.
//
//   1. The ceiling: a read-only kernel (kernel_templates/bench_read.cu) over
//      about 4 GB, in a few launch shapes; the best GB/s is the ceiling.
//   2. The pooler GEMM for each batch and width at K = 8192, with cold
//      weights: launches rotate through enough weight copies that they add up
//      to at least 4x the L2 (and 256 MB), so every launch reads its weights
//      from HBM. Many launches are captured in one CUDA graph; each replay is
//      timed with events and the median per launch is reported, with PDL off
//      and on (on: each launch's weight prologue overlaps the previous one's
//      tail, as in the engine).
//   3. cuBLAS (cublasGemmEx, BF16 in and out, FP32 compute) on the same shapes
//      and the same rotation, as c^T = w * x^T in column-major terms.
//
// cuBLAS is used here only; the library never links it. The CUDA runtime and
// pooler's driver-API code share device 0's primary context.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/device.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel.hpp"
#include "runtime/kernel_cache.hpp"
#include "runtime/pooler_gemm.hpp"

using namespace pooler;

namespace {

const char* kUsage = R"(usage: pooler-kernel-bench [options]

Measures, on GPU 0: the streaming-read bandwidth ceiling, the pooler GEMM
c[b, N] = x[b, K] @ w[N, K].T with cold weights (PDL off and on), and cuBLAS on
the same shapes. Without a GPU it compiles the forms, says so and exits 0.

options:
  --batches LIST    batches b, comma-separated (default 1,2,4,8,16)
  --widths LIST     widths N, comma-separated (default 512,1024,2048,4096)
  -k K              the reduction length (default 8192)
  --launches L      launches captured per graph, at least the weight copies (default 128)
  --replays R       timed replays of each graph; the median is reported (default 15)
  --read-gb G       size of the read-ceiling buffer in GB (default 4)
  --cold-mb M       least total size of the rotated weight copies in MB (default 256, raised to 4x L2)
  --no-cublas       skip cuBLAS
  --sweep           also time alternative launch shapes per (b, N) and print the best (slower: compiles
                    and times about a dozen extra shapes per width)
  --arch ARCH       architecture to compile for when there is no GPU (default sm_90)
  --json FILE       also write the results as JSON
  -h, --help        this text

The kernel cache is POOLER_CACHE_DIR (or the default cache); a second run reuses
the compiled forms.
)";

struct Options {
  std::vector<int> batches = {1, 2, 4, 8, 16};
  std::vector<int> widths = {512, 1024, 2048, 4096};
  int k = 8192;
  int launches = 128;
  int replays = 15;
  double read_gb = 4.0;
  double cold_mb = 256.0;
  bool cublas = true;
  bool sweep = false;
  std::string arch = "sm_90";
  std::string json;
};

std::vector<int> parse_list(const std::string& text, const char* flag) {
  std::vector<int> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      std::size_t used = 0;
      const int v = std::stoi(item, &used);
      if (used != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw InvalidArgument(fmt::format("{}: '{}' is not a positive integer", flag, item));
    }
  }
  if (out.empty()) throw InvalidArgument(fmt::format("{}: empty list", flag));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InvalidArgument(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    auto number = [&](double low) {
      const std::string v = value();
      try {
        const double d = std::stod(v);
        if (d < low) throw std::invalid_argument(v);
        return d;
      } catch (const std::exception&) {
        throw InvalidArgument(fmt::format("{}: '{}' is not a number of at least {}", a, v, low));
      }
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--batches") {
      o.batches = parse_list(value(), "--batches");
    } else if (a == "--widths") {
      o.widths = parse_list(value(), "--widths");
    } else if (a == "-k") {
      o.k = static_cast<int>(number(32));
    } else if (a == "--launches") {
      o.launches = static_cast<int>(number(1));
    } else if (a == "--replays") {
      o.replays = static_cast<int>(number(1));
    } else if (a == "--read-gb") {
      o.read_gb = number(0.01);
    } else if (a == "--cold-mb") {
      o.cold_mb = number(1);
    } else if (a == "--no-cublas") {
      o.cublas = false;
    } else if (a == "--sweep") {
      o.sweep = true;
    } else if (a == "--arch") {
      o.arch = value();
    } else if (a == "--json") {
      o.json = value();
    } else {
      throw InvalidArgument(fmt::format("unknown option '{}' (see --help)", a));
    }
  }
  return o;
}

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(fmt::format("{}: {} ({})", what, cudaGetErrorName(status), cudaGetErrorString(status)));
  }
}

void cublas_check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("{}: {}", what, cublasGetStatusString(status)));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Captures `enqueue(i)` for i in [0, launches) into one graph, replays it
// twice to warm up, then `replays` times under events: the median time per
// launch in microseconds.
template <typename Enqueue>
double time_graph(const Stream& stream, int launches, int replays, Enqueue enqueue) {
  POOLER_CU(cuStreamBeginCapture(stream.get(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "benchmark capture");
  try {
    for (int i = 0; i < launches; ++i) enqueue(i);
  } catch (...) {
    CUgraph abandoned = nullptr;
    driver().cuStreamEndCapture(stream.get(), &abandoned);
    if (abandoned != nullptr) driver().cuGraphDestroy(abandoned);
    throw;
  }
  CUgraph graph = nullptr;
  POOLER_CU(cuStreamEndCapture(stream.get(), &graph), "benchmark capture");
  CUgraphExec exec = nullptr;
  POOLER_CU(cuGraphInstantiateWithFlags(&exec, graph, 0), "benchmark graph");
  Event start, stop;
  std::vector<double> per_launch;
  for (int r = 0; r < replays + 2; ++r) {
    start.record(stream.get());
    POOLER_CU(cuGraphLaunch(exec, stream.get()), "benchmark replay");
    stop.record(stream.get());
    stream.synchronize();
    if (r >= 2) per_launch.push_back(1000.0 * stop.elapsed_since(start) / launches);
  }
  POOLER_CU(cuGraphExecDestroy(exec), "benchmark graph");
  POOLER_CU(cuGraphDestroy(graph), "benchmark graph");
  return median(per_launch);
}

struct ReadConfig {
  int threads, unroll, ctas_per_sm;
};

Form read_form(const ReadConfig& c) {
  return Form(fmt::format("bench_read_t{}_u{}", c.threads, c.unroll), "bench_read.cu", {"pooler_bench_read"})
      .set("THREADS", c.threads)
      .set("UNROLL", c.unroll);
}

const std::vector<ReadConfig> kReadConfigs = {{512, 8, 4}, {256, 8, 8}, {1024, 4, 2}, {512, 4, 4}, {256, 16, 4}};

// Alternative shapes for --sweep: every valid combination of a few values of
// each knob that gives between 64 and 264 CTAs (one to two waves).
std::vector<PoolerGemmShape> sweep_shapes(int n, int k, int rows) {
  std::vector<PoolerGemmShape> out;
  const PoolerGemmShape chosen = choose_gemm_shape(n, k, rows);
  for (int warps : {4, 8, 16}) {
    for (int warps_k : {1, 2, 4, 8}) {
      if (warps % warps_k != 0) continue;
      for (int tiles : {1, 2, 4}) {
        for (int split : {1, 2, 4, 8}) {
          for (int loads : {8, 16}) {
            const int unroll = loads / (2 * tiles);
            if (unroll < 1) continue;
            PoolerGemmShape s;
            s.block_size = 32 * warps;
            s.warps_k = warps_k;
            s.outputs_per_block = 16 * tiles * (warps / warps_k);
            s.split_k = split;
            s.k_unroll = unroll;
            s.ctas_per_sm = warps >= 16 ? 1 : chosen.ctas_per_sm;
            try {
              validate_gemm_shape(rows, n, k, s);
            } catch (const InvalidArgument&) {
              continue;
            }
            const long long ctas = static_cast<long long>(n / s.outputs_per_block) * split;
            if (ctas < 64 || ctas > 264 || s == chosen) continue;
            out.push_back(s);
          }
        }
      }
    }
  }
  // Keep the sweep bounded: the shapes closest to one full wave of 128-132 CTAs.
  std::stable_sort(out.begin(), out.end(), [&](const PoolerGemmShape& a, const PoolerGemmShape& b) {
    auto distance = [&](const PoolerGemmShape& s) {
      return std::abs(static_cast<long long>(n / s.outputs_per_block) * s.split_k - 130);
    };
    return distance(a) < distance(b);
  });
  if (out.size() > 12) out.resize(12);
  return out;
}

struct Row {
  int b = 0, n = 0, k = 0;
  std::string shape;
  double us = 0, us_pdl = 0, cublas_us = 0;
  double weight_bytes = 0;
  long long disagreements = -1;  // outputs where pooler and cuBLAS differ beyond summation order (-1: not compared)
  std::string best_sweep_shape;
  double best_sweep_us = 0;
};

double bf16_value(std::uint16_t bits) {
  float f;
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

int run(const Options& o) {
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  const bool gpu = driver_available() && device_count() > 0;
  const std::string arch = gpu ? device_info(0).architecture() : o.arch;

  // Every form first (compiled in parallel, or read from the cache).
  std::vector<Form> forms;
  for (int n : o.widths) {
    for (int b : o.batches) forms.push_back(pooler_gemm_form(b, n, o.k, choose_gemm_shape(n, o.k, b)));
  }
  for (const ReadConfig& c : kReadConfigs) forms.push_back(read_form(c));
  std::printf("compiling %zu forms for %s ...\n", forms.size(), arch.c_str());
  std::fflush(stdout);
  KernelCache& cache = KernelCache::global();
  cache.get_all(forms, arch);
  std::printf("  done (%.1f s)\n", elapsed());
  if (!gpu) {
    std::printf("no GPU on this machine (%s): compiled %zu forms for %s, nothing to measure\n",
                driver_available() ? "the driver sees no device" : "no CUDA driver", forms.size(), arch.c_str());
    return 0;
  }

  const DeviceInfo info = device_info(0);
  PrimaryContext context(0);
  ContextScope scope(context.get());
  cuda_check(cudaSetDevice(0), "cudaSetDevice(0)");
  cuda_check(cudaFree(nullptr), "initialising the CUDA runtime on the primary context");
  Stream stream;
  std::printf("device 0: %s, %s, %d SMs, %.0f MB L2\n", info.name.c_str(), arch.c_str(), info.multiprocessors,
              info.l2_bytes / 1e6);

  // ---- 1. the streaming-read ceiling -------------------------------------
  double ceiling = 0;
  std::string ceiling_config;
  {
    const std::size_t bytes = static_cast<std::size_t>(o.read_gb * 1e9) / 16 * 16;
    DeviceBuffer data(bytes), sink(64);
    POOLER_CU(cuMemsetD8(data.get(), 0x5A, bytes), "filling the read buffer");
    POOLER_CU(cuCtxSynchronize(), "filling the read buffer");
    const unsigned long long vectors = bytes / 16;
    for (const ReadConfig& c : kReadConfigs) {
      const Lookup lookup = cache.get(read_form(c), arch);
      LoadedForm loaded(*lookup.entry, context.get());
      const Kernel kernel = loaded.kernel("pooler_bench_read");
      LaunchShape shape;
      shape.grid_x = static_cast<unsigned>(info.multiprocessors * c.ctas_per_sm);
      shape.block_x = static_cast<unsigned>(c.threads);
      const double us = time_graph(stream, 3, std::max(3, o.replays / 3), [&](int) {
        kernel(stream.get(), shape, data.get(), vectors, sink.get());
      });
      const double gbps = static_cast<double>(bytes) / (us * 1e3);
      std::printf("  read ceiling: %4d threads x %d CTAs/SM, unroll %2d: %7.1f GB/s\n", c.threads, c.ctas_per_sm,
                  c.unroll, gbps);
      std::fflush(stdout);
      if (gbps > ceiling) {
        ceiling = gbps;
        ceiling_config = fmt::format("{} threads x {} CTAs/SM, unroll {}", c.threads, c.ctas_per_sm, c.unroll);
      }
    }
    std::printf("streaming-read ceiling: %.1f GB/s (%s, %.1f GB read per launch)\n", ceiling, ceiling_config.c_str(),
                static_cast<double>(bytes) / 1e9);
  }

  // ---- 2 and 3. the GEMMs ---------------------------------------------------
  cublasHandle_t handle = nullptr;
  std::optional<DeviceBuffer> cublas_workspace;
  if (o.cublas) {
    cublas_check(cublasCreate(&handle), "cublasCreate");
    cublas_check(cublasSetStream(handle, stream.get()), "cublasSetStream");
    // A preset workspace: cuBLAS then allocates nothing during graph capture.
    cublas_workspace.emplace(std::size_t{64} << 20);
    void* workspace = reinterpret_cast<void*>(cublas_workspace->get());
    cublas_check(cublasSetWorkspace(handle, workspace, cublas_workspace->bytes()), "cublasSetWorkspace");
  }
  const int max_rows = *std::max_element(o.batches.begin(), o.batches.end());
  std::mt19937 random(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random_bf16 = [&](std::size_t count, float scale) {
    std::vector<std::uint16_t> v(count);
    for (auto& e : v) {
      const float f = normal(random) * scale;
      std::uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      e = static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    return v;
  };
  const std::vector<std::uint16_t> x_host = random_bf16(static_cast<std::size_t>(max_rows) * o.k, 1.0f);
  DeviceBuffer x(x_host.size() * 2);
  x.upload(x_host.data(), x_host.size() * 2);

  std::vector<Row> rows;
  std::printf("\n%4s %5s %10s %10s %9s %7s %10s %8s %8s   %s\n", "b", "N", "pooler_us", "pdl_us", "GB/s_pdl", "%ceil",
              "cublas_us", "x_cublas", "x_pdl", "shape");
  for (int n : o.widths) {
    const double weight_bytes = static_cast<double>(n) * o.k * 2;
    const double cold_bytes = std::max(o.cold_mb * 1e6, 4.0 * info.l2_bytes);
    const int copies = std::max(2, static_cast<int>(std::ceil(cold_bytes / weight_bytes)));
    const int launches = (std::max(o.launches, copies) + copies - 1) / copies * copies;
    const std::size_t copy_bytes = static_cast<std::size_t>(weight_bytes);
    DeviceBuffer weights(copy_bytes * copies);
    {
      const std::vector<std::uint16_t> w_host = random_bf16(copy_bytes / 2, 0.02f);
      for (int i = 0; i < copies; ++i) weights.upload(w_host.data(), copy_bytes, copy_bytes * i);
    }
    const std::size_t c_bytes = static_cast<std::size_t>(max_rows) * n * 2;
    DeviceBuffer c_pooler(c_bytes), c_cublas(c_bytes);
    std::printf("-- N %d: %d weight copies of %.1f MB (%.0f MB rotated), %d launches per graph\n", n, copies,
                weight_bytes / 1e6, copies * weight_bytes / 1e6, launches);
    std::fflush(stdout);
    auto weight = [&](int i) { return weights.get() + copy_bytes * static_cast<std::size_t>(i % copies); };
    for (int b : o.batches) {
      Row row;
      row.b = b;
      row.n = n;
      row.k = o.k;
      row.weight_bytes = weight_bytes;
      const PoolerGemmShape shape = choose_gemm_shape(n, o.k, b);
      row.shape = describe(shape);
      const Lookup lookup = cache.get(pooler_gemm_form(b, n, o.k, shape), arch);
      const PoolerGemm gemm(*lookup.entry, context.get(), b, n, o.k, shape);
      row.us = time_graph(stream, launches, o.replays,
                          [&](int i) { gemm.launch(stream.get(), x.get(), weight(i), c_pooler.get(), false); });
      row.us_pdl = time_graph(stream, launches, o.replays,
                              [&](int i) { gemm.launch(stream.get(), x.get(), weight(i), c_pooler.get(), true); });
      if (o.cublas) {
        const float alpha = 1.0f, beta = 0.0f;
        auto enqueue = [&](int i) {
          // Row-major c[b, N] = x[b, K] @ w[N, K].T, read column-major, is
          // C[N, b] = op(A)[N, K] * B[K, b] with A = w seen as a K x N
          // column-major matrix (lda K), transposed, and B = x seen as K x b
          // column-major (ldb K); C = c seen as N x b (ldc N).
          cublas_check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, b, o.k, &alpha,
                                    reinterpret_cast<const void*>(weight(i)), CUDA_R_16BF, o.k,
                                    reinterpret_cast<const void*>(x.get()), CUDA_R_16BF, o.k, &beta,
                                    reinterpret_cast<void*>(c_cublas.get()), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx");
        };
        enqueue(0);  // heuristics and kernel loading, outside the capture
        stream.synchronize();
        row.cublas_us = time_graph(stream, launches, o.replays, enqueue);
        // The two agree (same weights, copy 0 for both) to a few BF16 ulps.
        c_pooler.fill_bytes(0xFF);
        c_cublas.fill_bytes(0xFF);
        gemm.launch(stream.get(), x.get(), weight(0), c_pooler.get(), false);
        enqueue(0);
        stream.synchronize();
        std::vector<std::uint16_t> a(static_cast<std::size_t>(b) * n), r(a.size());
        c_pooler.download(a.data(), a.size() * 2);
        c_cublas.download(r.data(), r.size() * 2);
        // Both sum in FP32 in different orders: they may differ by an ulp or
        // two, more only where a result nearly cancels. Count the outputs that
        // differ by more than 2 BF16 ulps and by more than 2^-10 of the
        // largest output: there should be none.
        double largest = 0;
        for (std::uint16_t v : r) largest = std::max(largest, std::fabs(bf16_value(v)));
        long long disagree = 0;
        for (std::size_t i = 0; i < a.size(); ++i) {
          const double ref = bf16_value(r[i]);
          const double ulp = ref == 0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, std::ilogb(ref) - 7);
          const double d = std::fabs(bf16_value(a[i]) - ref);
          if (!(d <= 2 * ulp || d <= largest * std::ldexp(1.0, -10))) ++disagree;
        }
        row.disagreements = disagree;
      }
      if (o.sweep) {
        const std::vector<PoolerGemmShape> candidates = sweep_shapes(n, o.k, b);
        std::vector<Form> sweep_forms;
        for (const PoolerGemmShape& s : candidates) sweep_forms.push_back(pooler_gemm_form(b, n, o.k, s));
        const std::vector<Lookup> compiled = cache.get_all(sweep_forms, arch);
        row.best_sweep_us = row.us_pdl;
        row.best_sweep_shape = row.shape + " (the rule's)";
        for (std::size_t i = 0; i < candidates.size(); ++i) {
          const PoolerGemm alternative(*compiled[i].entry, context.get(), b, n, o.k, candidates[i]);
          const double us = time_graph(stream, launches, o.replays, [&](int j) {
            alternative.launch(stream.get(), x.get(), weight(j), c_pooler.get(), true);
          });
          std::printf("      sweep b %d N %d: %8.2f us (PDL)  %s\n", b, n, us, describe(candidates[i]).c_str());
          if (us < row.best_sweep_us) {
            row.best_sweep_us = us;
            row.best_sweep_shape = describe(candidates[i]);
          }
        }
      }
      const double gbps_pdl = weight_bytes / (row.us_pdl * 1e3);
      std::printf("%4d %5d %10.2f %10.2f %9.1f %6.1f%% %10.2f %8.2f %8.2f   %s%s\n", b, n, row.us, row.us_pdl,
                  gbps_pdl, 100.0 * gbps_pdl / ceiling, row.cublas_us, row.cublas_us > 0 ? row.cublas_us / row.us : 0.0,
                  row.cublas_us > 0 ? row.cublas_us / row.us_pdl : 0.0, row.shape.c_str(),
                  row.disagreements > 0
                      ? fmt::format("  (WARNING: {} outputs differ from cuBLAS)", row.disagreements).c_str()
                      : "");
      if (o.sweep) std::printf("      best: %.2f us with %s\n", row.best_sweep_us, row.best_sweep_shape.c_str());
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  if (handle != nullptr) cublasDestroy(handle);
  std::printf("\npooler_us: PDL off; pdl_us: PDL on; GB/s and %%ceil: weight bytes / pdl_us against the %.1f GB/s "
              "ceiling; x_cublas = cublas_us / pooler_us, x_pdl = cublas_us / pdl_us. Total %.1f s.\n",
              ceiling, elapsed());

  if (!o.json.empty()) {
    std::ofstream out(o.json);
    if (!out) throw Error(fmt::format("cannot write {}", o.json));
    out << "{\n  \"device\": \"" << json_escape(info.name) << "\",\n  \"architecture\": \"" << arch
        << "\",\n  \"multiprocessors\": " << info.multiprocessors << ",\n  \"l2_bytes\": " << info.l2_bytes
        << ",\n  \"read_ceiling_gbps\": " << fmt::format("{:.2f}", ceiling) << ",\n  \"read_ceiling_config\": \""
        << ceiling_config << "\",\n  \"k\": " << o.k << ",\n  \"results\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const double gbps = r.weight_bytes / (r.us * 1e3), gbps_pdl = r.weight_bytes / (r.us_pdl * 1e3);
      out << fmt::format(
          "    {{\"b\": {}, \"n\": {}, \"k\": {}, \"shape\": \"{}\", \"weight_bytes\": {:.0f}, \"us\": {:.3f}, "
          "\"us_pdl\": {:.3f}, \"gbps\": {:.1f}, \"gbps_pdl\": {:.1f}, \"percent_of_ceiling\": {:.1f}, "
          "\"percent_of_ceiling_pdl\": {:.1f}, \"cublas_us\": {:.3f}, \"speedup_vs_cublas\": {:.3f}, "
          "\"speedup_pdl_vs_cublas\": {:.3f}, \"outputs_disagreeing_with_cublas\": {}",
          r.b, r.n, r.k, json_escape(r.shape), r.weight_bytes, r.us, r.us_pdl, gbps, gbps_pdl, 100 * gbps / ceiling,
          100 * gbps_pdl / ceiling, r.cublas_us, r.cublas_us > 0 ? r.cublas_us / r.us : 0.0,
          r.cublas_us > 0 ? r.cublas_us / r.us_pdl : 0.0, r.disagreements);
      if (o.sweep) {
        out << fmt::format(", \"best_sweep_us\": {:.3f}, \"best_sweep_shape\": \"{}\"", r.best_sweep_us,
                           json_escape(r.best_sweep_shape));
      }
      out << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    out << "  ]\n}\n";
    std::printf("wrote %s\n", o.json.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "pooler-kernel-bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pooler-kernel-bench: %s\n", e.what());
    return 1;
  }
}
