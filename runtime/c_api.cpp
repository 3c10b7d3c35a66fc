// SPDX-License-Identifier: Apache-2.0
// The C interface of include/pooler/pooler.h over the C++ API: handles own the
// C++ objects, every exception becomes a status and a per-thread message.
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "runtime/c_api_internal.hpp"
#include "runtime/jit/log.hpp"

static_assert(sizeof(pooler_unique_id) == sizeof(ncclUniqueId),
              "pooler_unique_id must be an ncclUniqueId byte for byte");
static_assert(sizeof(CUdeviceptr) == sizeof(std::uint64_t), "device addresses travel as uint64_t");
static_assert(static_cast<int>(pooler::DType::bf16) == POOLER_DTYPE_BF16 &&
                  static_cast<int>(pooler::DType::f32) == POOLER_DTYPE_F32 &&
                  static_cast<int>(pooler::DType::u8) == POOLER_DTYPE_U8 &&
                  static_cast<int>(pooler::DType::e4m3) == POOLER_DTYPE_E4M3,
              "pooler_dtype mirrors pooler::DType");
static_assert(POOLER_LOG_TRACE == SPDLOG_LEVEL_TRACE && POOLER_LOG_DEBUG == SPDLOG_LEVEL_DEBUG &&
                  POOLER_LOG_INFO == SPDLOG_LEVEL_INFO && POOLER_LOG_WARN == SPDLOG_LEVEL_WARN &&
                  POOLER_LOG_ERROR == SPDLOG_LEVEL_ERROR && POOLER_LOG_CRITICAL == SPDLOG_LEVEL_CRITICAL &&
                  POOLER_LOG_OFF == SPDLOG_LEVEL_OFF,
              "pooler_log_level mirrors spdlog's levels");
static_assert(static_cast<int>(pooler::Transport::automatic) == POOLER_TRANSPORT_AUTO &&
                  static_cast<int>(pooler::Transport::lamport) == POOLER_TRANSPORT_LAMPORT &&
                  static_cast<int>(pooler::Transport::nccl) == POOLER_TRANSPORT_NCCL,
              "pooler_transport mirrors pooler::Transport");

namespace {

using pooler::InvalidArgument;
using pooler::c_api::require;
using pooler::c_api::require_comm;
using pooler::c_api::require_pooler;

thread_local std::string t_last_error;

// Assigning a message can itself run out of memory: then a fixed text stands in.
const char* g_out_of_memory = "out of host memory while reporting an error";
thread_local bool t_error_is_oom = false;

void set_error(const char* function, const char* message) noexcept {
  try {
    t_last_error = fmt::format("{}: {}", function, message);
    t_error_is_oom = false;
  } catch (...) {
    t_error_is_oom = true;
  }
}

void clear_error() noexcept {
  t_last_error.clear();
  t_error_is_oom = false;
}

// Runs `body`, turning every exception into a status and this thread's
// message. `handle` (may be null) records a PeerTimeout, after which the C++
// Pooler refuses every call with a plain Error that still means "a peer timed out".
template <class Body>
pooler_status guarded(const char* function, pooler_st* handle, Body&& body) noexcept {
  try {
    body();
    clear_error();
    return POOLER_OK;
  } catch (const pooler::PeerTimeout& error) {
    if (handle != nullptr) {
      handle->record_timeout(pooler_peer_timeout_info{sizeof(pooler_peer_timeout_info), POOLER_PEER_TIMEOUT_INFO_MAGIC,
                                                      POOLER_ABI_VERSION, 1, error.rank, error.missing_peer,
                                                      error.layer, error.stage, error.elapsed_ns});
    }
    set_error(function, error.what());
    return POOLER_PEER_TIMEOUT;
  } catch (const pooler::InvalidArgument& error) {
    set_error(function, error.what());
    return POOLER_INVALID_ARGUMENT;
  } catch (const pooler::NoDriverError& error) {
    set_error(function, error.what());
    return POOLER_NO_DRIVER;
  } catch (const pooler::CudaError& error) {
    set_error(function, error.what());
    return POOLER_CUDA_ERROR;
  } catch (const pooler::NcclError& error) {
    set_error(function, error.what());
    return POOLER_NCCL_ERROR;
  } catch (const pooler::CompileError& error) {
    set_error(function, error.what());
    return POOLER_COMPILE_ERROR;
  } catch (const pooler::Error& error) {
    set_error(function, error.what());
    return handle != nullptr && handle->timeout_info().occurred != 0 ? POOLER_PEER_TIMEOUT : POOLER_OTHER;
  } catch (const std::bad_alloc&) {
    set_error(function, "out of host memory");
    return POOLER_OTHER;
  } catch (const std::exception& error) {
    set_error(function, error.what());
    return POOLER_OTHER;
  } catch (...) {
    set_error(function, "an unknown exception");
    return POOLER_OTHER;
  }
}

void require_not_aborted(const pooler_comm_st& comm) {
  if (comm.aborted.load()) {
    throw InvalidArgument(
        fmt::format("comm (rank {} of {}) was aborted (pooler_comm_abort); expected a live "
                    "communicator: destroy this one and make another",
                    comm.rank, comm.ranks));
  }
}

void describe_comm(pooler_comm_st& handle) {
  pooler::check_nccl(ncclCommCount(handle.comm, &handle.ranks), "ncclCommCount", "pooler_comm", handle.comm);
  pooler::check_nccl(ncclCommUserRank(handle.comm, &handle.rank), "ncclCommUserRank", "pooler_comm", handle.comm);
  pooler::check_nccl(ncclCommCuDevice(handle.comm, &handle.device), "ncclCommCuDevice", "pooler_comm", handle.comm);
}

pooler_tensor to_c(const pooler::TensorView& view) {
  pooler_tensor tensor{};
  tensor.data = view.data;
  tensor.rows = view.shape[0];
  tensor.cols = view.dims == 2 ? view.shape[1] : 1;
  tensor.dtype = static_cast<std::int32_t>(view.dtype);
  return tensor;
}

pooler_expert_input to_c(const pooler::ExpertInput& input) {
  pooler_expert_input out{};
  out.nvfp4 = input.nvfp4 ? 1 : 0;
  if (input.nvfp4) {
    out.packed = to_c(input.packed);
    out.scales = to_c(input.scales);
  } else {
    out.normed = to_c(input.normed);
  }
  return out;
}

// A caller's view. A dtype outside pooler_dtype matches no check (it describes
// itself as "?"); fields that do not apply are never checked.
pooler::TensorView from_c(const pooler_tensor& tensor) {
  return pooler::TensorView::matrix(tensor.data, static_cast<pooler::DType>(tensor.dtype), tensor.rows, tensor.cols);
}

pooler::ExpertInput from_c(const pooler_expert_input& input) {
  pooler::ExpertInput out;
  out.packed = from_c(input.packed);
  out.scales = from_c(input.scales);
  out.normed = from_c(input.normed);
  return out;
}

// The first b rows of the Pooler's projected-block scratch.
pooler_tensor projection_rows(const pooler_st& handle, int b) {
  pooler_tensor block = to_c(handle.pooler->projection());
  block.rows = b;
  return block;
}

pooler::TensorView x_view(const pooler_st& handle, std::uint64_t x, int b) {
  return pooler::TensorView::matrix(x, pooler::DType::bf16, b, handle.pooler->options().hidden);
}

CUstream to_stream(void* stream) { return static_cast<CUstream>(stream); }

pooler::PoolerOptions to_cpp(const pooler_options& c, int tp) {
  pooler::PoolerOptions options;
  options.capacity = c.capacity;
  options.enable_pdl = c.enable_pdl != 0;
  options.spin_timeout = std::chrono::nanoseconds(c.spin_timeout_ns);
  options.hidden = c.hidden;
  options.pooled = c.pooled;
  // A value outside pooler_transport reaches the Pooler as is: it rejects it after the vote, on every rank.
  options.transport = static_cast<pooler::Transport>(c.transport);
  options.allow_nvls = c.allow_nvls != 0;
  options.predecessor_triggers_early = c.predecessor_triggers_early != 0;  // 0 or 1: read_options refuses others
  options.batches.assign(c.batches, c.batches + c.num_batches);
  // The weight's expected shape: when P is not divisible by tp the Pooler
  // rejects P first, so the rounded-down row count is never what it checks.
  const std::int64_t rows = c.pooled / tp;
  for (int i = 0; i < c.num_layers; ++i) {
    const pooler_layer_desc desc = pooler::c_api::layer_at(c, i);
    pooler::PoolerLayer layer;
    layer.weight = pooler::TensorView::matrix(desc.weight, pooler::DType::bf16, rows, c.hidden);
    layer.norm_weight = pooler::TensorView::vector(desc.norm_weight, pooler::DType::bf16, c.pooled);
    layer.eps = desc.eps;
    layer.gain_center = desc.gain_center;
    if (desc.global_scale != 0) {
      layer.global_scale = pooler::TensorView::scalar(desc.global_scale, pooler::DType::f32);
    }
    options.layers.push_back(layer);
  }
  return options;
}

}  // namespace

pooler_status pooler::c_api::run_guarded(const char* function, void (*body)(void*), void* context) noexcept {
  return guarded(function, nullptr, [&] { body(context); });
}

extern "C" {

int pooler_abi_version(void) { return POOLER_ABI_VERSION; }

const char* pooler_version(void) { return POOLER_VERSION; }

const char* pooler_status_name(pooler_status status) {
  switch (status) {
    case POOLER_OK:
      return "POOLER_OK";
    case POOLER_INVALID_ARGUMENT:
      return "POOLER_INVALID_ARGUMENT";
    case POOLER_NO_DRIVER:
      return "POOLER_NO_DRIVER";
    case POOLER_CUDA_ERROR:
      return "POOLER_CUDA_ERROR";
    case POOLER_NCCL_ERROR:
      return "POOLER_NCCL_ERROR";
    case POOLER_COMPILE_ERROR:
      return "POOLER_COMPILE_ERROR";
    case POOLER_PEER_TIMEOUT:
      return "POOLER_PEER_TIMEOUT";
    case POOLER_OTHER:
      return "POOLER_OTHER";
  }
  return "POOLER_UNKNOWN_STATUS";
}

const char* pooler_last_error(void) { return t_error_is_oom ? g_out_of_memory : t_last_error.c_str(); }

pooler_status pooler_device_count(int* count) {
  return guarded("pooler_device_count", nullptr, [&] {
    require(count, "count", "a pointer to an int");
    *count = 0;
    *count = pooler::device_count();
  });
}

namespace {

// A pooler_log_level as spdlog's (the same numbers); `allow_off` for a minimum level.
spdlog::level::level_enum log_level(int level, const char* name, bool allow_off) {
  const int highest = allow_off ? POOLER_LOG_OFF : POOLER_LOG_CRITICAL;
  if (level < POOLER_LOG_TRACE || level > highest) {
    throw InvalidArgument(fmt::format("{} is {}; expected a pooler_log_level from POOLER_LOG_TRACE (0) to {} ({})",
                                      name, level, allow_off ? "POOLER_LOG_OFF" : "POOLER_LOG_CRITICAL", highest));
  }
  return static_cast<spdlog::level::level_enum>(level);
}

}  // namespace

pooler_status pooler_set_log_callback(pooler_log_callback callback, void* user_data, int min_level) {
  return guarded("pooler_set_log_callback", nullptr, [&] {
    const spdlog::level::level_enum level = log_level(min_level, "min_level", true);
    pooler::set_log_callback(callback, user_data, level);
  });
}

pooler_status pooler_log(int level, const char* message) {
  return guarded("pooler_log", nullptr, [&] {
    const spdlog::level::level_enum checked = log_level(level, "level", false);
    require(message, "message", "a NUL-terminated string");
    pooler::log().log(checked, "{}", message);
  });
}

pooler_status pooler_get_unique_id(pooler_unique_id* id) {
  return guarded("pooler_get_unique_id", nullptr, [&] {
    require(id, "id", "a pointer to a pooler_unique_id");
    const ncclUniqueId made = pooler::NcclComm::unique_id();
    std::memcpy(id->internal, made.internal, sizeof(id->internal));
  });
}

pooler_status pooler_comm_init_rank(pooler_comm_t* comm, int ranks, const pooler_unique_id* id, int rank, int device) {
  return guarded("pooler_comm_init_rank", nullptr, [&] {
    require(comm, "comm", "a pointer to a pooler_comm_t to receive the communicator");
    *comm = nullptr;
    require(id, "id", "the pooler_unique_id that one rank made with pooler_get_unique_id");
    if (ranks < 1) {
      throw InvalidArgument(fmt::format("ranks is {}; expected at least 1", ranks));
    }
    if (rank < 0 || rank >= ranks) {
      throw InvalidArgument(fmt::format("rank is {}; expected 0 <= rank < {} (ranks)", rank, ranks));
    }
    if (device < 0) {
      throw InvalidArgument(fmt::format("device is {}; expected a CUDA device ordinal (0 or more)", device));
    }
    // Before the driver: a missing NCCL_NVLS_ENABLE=0 is the same error with or without a GPU.
    pooler::require_nvls_disabled();
    if (const int devices = pooler::device_count(); device >= devices) {
      throw InvalidArgument(fmt::format("device is {}; this process sees {} CUDA device(s)", device, devices));
    }
    auto handle = std::make_unique<pooler_comm_st>();
    handle->context.emplace(device);
    pooler::ContextScope scope(handle->context->get());
    ncclUniqueId nccl_id;
    std::memcpy(nccl_id.internal, id->internal, sizeof(nccl_id.internal));
    handle->owned.emplace(ranks, nccl_id, rank);
    handle->comm = handle->owned->get();
    describe_comm(*handle);
    *comm = handle.release();
  });
}

pooler_status pooler_comm_adopt(pooler_comm_t* comm, void* nccl_comm) {
  return guarded("pooler_comm_adopt", nullptr, [&] {
    require(comm, "comm", "a pointer to a pooler_comm_t to receive the handle");
    *comm = nullptr;
    require(static_cast<const char*>(nccl_comm), "nccl_comm", "the engine's ncclComm_t");
    auto handle = std::make_unique<pooler_comm_st>();
    handle->comm = static_cast<ncclComm_t>(nccl_comm);
    describe_comm(*handle);
    *comm = handle.release();
  });
}

pooler_status pooler_comm_nccl(pooler_comm_t comm, void** nccl_comm) {
  return guarded("pooler_comm_nccl", nullptr, [&] {
    require_comm(comm);
    require(nccl_comm, "nccl_comm", "a pointer to a void* to receive the ncclComm_t");
    *nccl_comm = nullptr;
    require_not_aborted(*comm);
    *nccl_comm = comm->comm;
  });
}

pooler_status pooler_comm_abort(pooler_comm_t comm) {
  return guarded("pooler_comm_abort", nullptr, [&] {
    require_comm(comm);
    std::lock_guard lock(comm->abort_mutex);
    if (comm->aborted.load()) {
      return;  // once is enough
    }
    const std::string context = fmt::format("pooler_comm_abort (rank {} of {})", comm->rank, comm->ranks);
    comm->aborted.store(true);  // also when ncclCommAbort fails: the communicator is unusable either way
    if (comm->owned) {
      pooler::ContextScope scope(comm->context->get());
      comm->owned->abort();  // it then owns nothing: pooler_comm_destroy destroys no communicator
    } else {
      pooler::abort_communicator(comm->comm, context);
    }
  });
}

pooler_status pooler_comm_info(pooler_comm_t comm, int* rank, int* ranks, int* device) {
  return guarded("pooler_comm_info", nullptr, [&] {
    require_comm(comm);
    require(rank, "rank", "a pointer to an int");
    require(ranks, "ranks", "a pointer to an int");
    require(device, "device", "a pointer to an int");
    *rank = comm->rank;
    *ranks = comm->ranks;
    *device = comm->device;
  });
}

pooler_status pooler_comm_destroy(pooler_comm_t comm) {
  return guarded("pooler_comm_destroy", nullptr, [&] {
    if (comm == nullptr) {
      return;
    }
    require_comm(comm);
    if (const int alive = comm->poolers.load(); alive != 0) {
      throw InvalidArgument(
          fmt::format("comm (rank {} of {}) still has {} Pooler(s) built on it; destroy them first "
                      "(pooler_destroy)",
                      comm->rank, comm->ranks, alive));
    }
    pooler::c_api::retire(std::unique_ptr<pooler_comm_st>(comm));
  });
}

pooler_status pooler_options_init(pooler_options* options, std::size_t size) {
  return guarded("pooler_options_init", nullptr, [&] { pooler::c_api::init_options(options, size); });
}

pooler_status pooler_create(pooler_t* pooler, pooler_comm_t comm, const pooler_options* options) {
  return guarded("pooler_create", nullptr, [&] {
    require(pooler, "pooler", "a pointer to a pooler_t to receive the Pooler");
    *pooler = nullptr;
    require_comm(comm);
    require_not_aborted(*comm);
    require(options, "options", "a pooler_options (start from pooler_options_init)");
    // The caller's size bytes only, the defaults for the rest.
    pooler_options read;
    const std::string problem = pooler::c_api::read_options(*options, read);
    pooler::PoolerOptions cpp;
    if (problem.empty()) {
      cpp = to_cpp(read, comm->ranks);
    }
    // else: no layers, which the Pooler rejects on this rank after voting, so
    // that the other ranks fail too; this rank then reports the real problem
    // (also when construction failed before the vote: no driver, NVLS refused).
    auto handle = std::make_unique<pooler_st>();
    handle->comm = comm;
    try {
      handle->pooler = std::make_unique<pooler::Pooler>(comm->comm, std::move(cpp));
    } catch (const pooler::Error&) {
      if (!problem.empty()) {
        throw InvalidArgument(problem);
      }
      throw;
    }
    handle->forms = handle->pooler->forms();
    comm->poolers.fetch_add(1);
    *pooler = handle.release();
  });
}

pooler_status pooler_destroy(pooler_t pooler) {
  return guarded("pooler_destroy", nullptr, [&] {
    if (pooler == nullptr) {
      return;
    }
    require_pooler(pooler);
    std::unique_ptr<pooler_st> handle(pooler);
    handle->pooler.reset();  // collective; waits for the Pooler's work
    handle->comm->poolers.fetch_sub(1);
    pooler::c_api::retire(std::move(handle));
  });
}

pooler_status pooler_warm_up(pooler_t pooler) {
  return guarded("pooler_warm_up", pooler, [&] {
    require_pooler(pooler);
    pooler->pooler->warm_up();
  });
}

pooler_status pooler_run(pooler_t pooler, int layer, std::uint64_t x, int b, void* stream, pooler_expert_input* out) {
  return guarded("pooler_run", pooler, [&] {
    require_pooler(pooler);
    require(out, "out", "a pointer to a pooler_expert_input to receive the outputs");
    *out = pooler_expert_input{};
    *out = to_c(pooler->pooler->run(layer, x_view(*pooler, x, b), to_stream(stream)));
    pooler->last_projection = projection_rows(*pooler, b);
  });
}

pooler_status pooler_run_into(pooler_t pooler, int layer, std::uint64_t x, int b, void* stream,
                              const pooler_expert_input* out) {
  return guarded("pooler_run_into", pooler, [&] {
    require_pooler(pooler);
    require(out, "out", "a pooler_expert_input holding the output views");
    pooler->pooler->run(layer, x_view(*pooler, x, b), from_c(*out), to_stream(stream));
    pooler->last_projection = projection_rows(*pooler, b);
  });
}

pooler_status pooler_project_into(pooler_t pooler, int layer, std::uint64_t x, int b, void* stream,
                                  const pooler_tensor* block) {
  return guarded("pooler_project_into", pooler, [&] {
    require_pooler(pooler);
    require(block, "block", "a pooler_tensor: the BF16 [b, P / tp] output");
    pooler->pooler->project(layer, x_view(*pooler, x, b), from_c(*block), to_stream(stream));
    pooler->last_projection = *block;
  });
}

pooler_status pooler_publish_from(pooler_t pooler, const pooler_tensor* block, void* stream) {
  return guarded("pooler_publish_from", pooler, [&] {
    require_pooler(pooler);
    require(block, "block", "a pooler_tensor: the BF16 [b, P / tp] block to publish");
    pooler->pooler->publish(from_c(*block), to_stream(stream));
  });
}

pooler_status pooler_gather_into(pooler_t pooler, int layer, int b, void* stream, const pooler_expert_input* out) {
  return guarded("pooler_gather_into", pooler, [&] {
    require_pooler(pooler);
    require(out, "out", "a pooler_expert_input holding the output views");
    pooler->pooler->gather(layer, b, from_c(*out), to_stream(stream));
  });
}

pooler_status pooler_scratch(pooler_t pooler, pooler_tensor* block, pooler_expert_input* outputs) {
  return guarded("pooler_scratch", pooler, [&] {
    require_pooler(pooler);
    require(block, "block", "a pointer to a pooler_tensor to receive the projected block's scratch");
    require(outputs, "outputs", "a pointer to a pooler_expert_input to receive the outputs' scratch");
    *block = to_c(pooler->pooler->projection());
    const pooler::ExpertInput scratch = pooler->pooler->scratch();
    *outputs = pooler_expert_input{};
    outputs->packed = to_c(scratch.packed);
    outputs->scales = to_c(scratch.scales);
    outputs->normed = to_c(scratch.normed);
  });
}

pooler_status pooler_project(pooler_t pooler, int layer, std::uint64_t x, int b, void* stream, pooler_tensor* block) {
  return guarded("pooler_project", pooler, [&] {
    require_pooler(pooler);
    require(block, "block", "a pointer to a pooler_tensor to receive the projected block");
    *block = pooler_tensor{};
    const pooler::TensorView view = pooler->pooler->project(layer, x_view(*pooler, x, b), to_stream(stream));
    pooler->last_projection = to_c(view);
    *block = pooler->last_projection;
  });
}

pooler_status pooler_publish(pooler_t pooler, int b, void* stream) {
  return guarded("pooler_publish", pooler, [&] {
    require_pooler(pooler);
    pooler->pooler->publish(b, to_stream(stream));
  });
}

pooler_status pooler_prefetch_weights(pooler_t pooler, int layer, void* stream) {
  return guarded("pooler_prefetch_weights", pooler, [&] {
    require_pooler(pooler);
    pooler->pooler->prefetch_weights(layer, to_stream(stream));
  });
}

pooler_status pooler_gather(pooler_t pooler, int layer, int b, void* stream, pooler_expert_input* out) {
  return guarded("pooler_gather", pooler, [&] {
    require_pooler(pooler);
    require(out, "out", "a pointer to a pooler_expert_input to receive the outputs");
    *out = pooler_expert_input{};
    *out = to_c(pooler->pooler->gather(layer, b, to_stream(stream)));
  });
}

pooler_status pooler_last_projection(pooler_t pooler, pooler_tensor* block) {
  return guarded("pooler_last_projection", pooler, [&] {
    require_pooler(pooler);
    require(block, "block", "a pointer to a pooler_tensor to receive the projected block");
    *block = pooler->last_projection;
  });
}

pooler_status pooler_check(pooler_t pooler) {
  return guarded("pooler_check", pooler, [&] {
    require_pooler(pooler);
    pooler->pooler->check();
  });
}

pooler_status pooler_peer_timeout(pooler_t pooler, pooler_peer_timeout_info* info) {
  return guarded("pooler_peer_timeout", pooler, [&] {
    require_pooler(pooler);
    pooler::c_api::write_peer_timeout(pooler->timeout_info(), info);
  });
}

pooler_status pooler_info(pooler_t pooler, int* rank, int* tp, int* device) {
  return guarded("pooler_info", pooler, [&] {
    require_pooler(pooler);
    require(rank, "rank", "a pointer to an int");
    require(tp, "tp", "a pointer to an int");
    require(device, "device", "a pointer to an int");
    *rank = pooler->pooler->rank();
    *tp = pooler->pooler->tp();
    *device = pooler->pooler->device();
  });
}

pooler_status pooler_get_transport(pooler_t pooler, int* transport) {
  return guarded("pooler_get_transport", pooler, [&] {
    require_pooler(pooler);
    require(transport, "transport", "a pointer to an int");
    *transport = static_cast<int>(pooler->pooler->transport());
  });
}

pooler_status pooler_form_count(pooler_t pooler, int* count) {
  return guarded("pooler_form_count", pooler, [&] {
    require_pooler(pooler);
    require(count, "count", "a pointer to an int");
    *count = static_cast<int>(pooler->forms.size());
  });
}

pooler_status pooler_form(pooler_t pooler, int index, const char** line) {
  return guarded("pooler_form", pooler, [&] {
    require_pooler(pooler);
    require(line, "line", "a pointer to a const char* to receive the line");
    *line = nullptr;
    if (index < 0 || static_cast<std::size_t>(index) >= pooler->forms.size()) {
      throw InvalidArgument(
          fmt::format("index is {}; expected 0 <= index < {} (pooler_form_count)", index, pooler->forms.size()));
    }
    *line = pooler->forms[static_cast<std::size_t>(index)].c_str();
  });
}

}  // extern "C"
