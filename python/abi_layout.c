// SPDX-License-Identifier: Apache-2.0
/* Writes the Python module pooler/_layout.py: every struct, enum value and
 * version of include/pooler/pooler.h as this C compiler lays them out (field
 * names, ctypes types, offsets, sizes). The package builds its ctypes
 * structures from that file and checks them against it at import, so no
 * layout is declared by hand (python/CMakeLists.txt runs this at build time).
 *
 *   pooler_abi_layout OUTPUT.py
 */
#include <stddef.h>
#include <stdio.h>

#include "pooler/pooler.h"

/* The ctypes name of a scalar field's type (the compiler's own choice of long
 * or long long for int64_t is kept, so sizes match by construction). */
#define CTYPE(value) \
  _Generic((value),                                           \
      char: "c_char",                                         \
      unsigned char: "c_ubyte",                               \
      int: "c_int",                                           \
      unsigned int: "c_uint",                                 \
      long: "c_long",                                         \
      unsigned long: "c_ulong",                               \
      long long: "c_longlong",                                \
      unsigned long long: "c_ulonglong",                      \
      float: "c_float",                                       \
      double: "c_double",                                     \
      const int*: "POINTER(c_int)",                           \
      const pooler_layer_desc*: "POINTER(pooler_layer_desc)", \
      pooler_tensor: "pooler_tensor",                         \
      default: "?")

static FILE* out;

#define BEGIN(type) fprintf(out, "    (\"%s\", %zu, [\n", #type, sizeof(type))
#define FIELD(type, field)                                                                                          \
  fprintf(out, "        (\"%s\", \"%s\", 0, %zu, %zu),\n", #field, CTYPE(((type*)0)->field), offsetof(type, field), \
          sizeof(((type*)0)->field))
/* An array: its element type and count. */
#define ARRAY(type, field)                                                                        \
  fprintf(out, "        (\"%s\", \"%s\", %zu, %zu, %zu),\n", #field, CTYPE(((type*)0)->field[0]), \
          sizeof(((type*)0)->field) / sizeof(((type*)0)->field[0]), offsetof(type, field), sizeof(((type*)0)->field))
#define END() fprintf(out, "    ]),\n")
#define CONSTANT(name) fprintf(out, "    \"%s\": %d,\n", #name, (int)(name))

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUTPUT.py\n", argv[0]);
    return 2;
  }
  out = fopen(argv[1], "w");
  if (out == NULL) {
    perror(argv[1]);
    return 1;
  }
  fprintf(out, "# Generated at build time by python/abi_layout.c from include/pooler/pooler.h. Do not edit.\n");
  fprintf(out, "ABI_VERSION = %d\n\n", POOLER_ABI_VERSION);
  fprintf(out,
          "# (struct, sizeof, [(field, ctypes type, array length or 0, offsetof, sizeof)]), in dependency order\n");
  fprintf(out, "STRUCTS = [\n");
  BEGIN(pooler_unique_id);
  ARRAY(pooler_unique_id, internal);
  END();
  BEGIN(pooler_layer_desc);
  FIELD(pooler_layer_desc, size);
  FIELD(pooler_layer_desc, magic);
  FIELD(pooler_layer_desc, version);
  FIELD(pooler_layer_desc, weight);
  FIELD(pooler_layer_desc, norm_weight);
  FIELD(pooler_layer_desc, global_scale);
  FIELD(pooler_layer_desc, eps);
  FIELD(pooler_layer_desc, gain_center);
  END();
  BEGIN(pooler_options);
  FIELD(pooler_options, size);
  FIELD(pooler_options, magic);
  FIELD(pooler_options, version);
  FIELD(pooler_options, layers);
  FIELD(pooler_options, num_layers);
  FIELD(pooler_options, batches);
  FIELD(pooler_options, num_batches);
  FIELD(pooler_options, capacity);
  FIELD(pooler_options, enable_pdl);
  FIELD(pooler_options, spin_timeout_ns);
  FIELD(pooler_options, hidden);
  FIELD(pooler_options, pooled);
  FIELD(pooler_options, transport);
  FIELD(pooler_options, allow_nvls);
  FIELD(pooler_options, predecessor_triggers_early);
  END();
  BEGIN(pooler_tensor);
  FIELD(pooler_tensor, data);
  FIELD(pooler_tensor, rows);
  FIELD(pooler_tensor, cols);
  FIELD(pooler_tensor, dtype);
  END();
  BEGIN(pooler_expert_input);
  FIELD(pooler_expert_input, nvfp4);
  FIELD(pooler_expert_input, packed);
  FIELD(pooler_expert_input, scales);
  FIELD(pooler_expert_input, normed);
  END();
  BEGIN(pooler_peer_timeout_info);
  FIELD(pooler_peer_timeout_info, size);
  FIELD(pooler_peer_timeout_info, magic);
  FIELD(pooler_peer_timeout_info, version);
  FIELD(pooler_peer_timeout_info, occurred);
  FIELD(pooler_peer_timeout_info, rank);
  FIELD(pooler_peer_timeout_info, missing_peer);
  FIELD(pooler_peer_timeout_info, layer);
  FIELD(pooler_peer_timeout_info, stage);
  FIELD(pooler_peer_timeout_info, elapsed_ns);
  END();
  BEGIN(pooler_mailbox_info);
  FIELD(pooler_mailbox_info, size);
  FIELD(pooler_mailbox_info, magic);
  FIELD(pooler_mailbox_info, version);
  FIELD(pooler_mailbox_info, mailbox);
  FIELD(pooler_mailbox_info, state);
  FIELD(pooler_mailbox_info, record);
  FIELD(pooler_mailbox_info, spin_timeout_ns);
  FIELD(pooler_mailbox_info, pooled);
  FIELD(pooler_mailbox_info, tp);
  FIELD(pooler_mailbox_info, capacity);
  FIELD(pooler_mailbox_info, rank);
  END();
  BEGIN(pooler_gemm_shape);
  FIELD(pooler_gemm_shape, size);
  FIELD(pooler_gemm_shape, magic);
  FIELD(pooler_gemm_shape, version);
  FIELD(pooler_gemm_shape, block_size);
  FIELD(pooler_gemm_shape, outputs_per_block);
  FIELD(pooler_gemm_shape, k_unroll);
  FIELD(pooler_gemm_shape, split_k);
  FIELD(pooler_gemm_shape, warps_k);
  FIELD(pooler_gemm_shape, ctas_per_sm);
  FIELD(pooler_gemm_shape, stages);
  FIELD(pooler_gemm_shape, async_reduce);
  FIELD(pooler_gemm_shape, w_on_chip);
  END();
  fprintf(out, "]\n\nCONSTANTS = {\n");
  CONSTANT(POOLER_OK);
  CONSTANT(POOLER_INVALID_ARGUMENT);
  CONSTANT(POOLER_NO_DRIVER);
  CONSTANT(POOLER_CUDA_ERROR);
  CONSTANT(POOLER_NCCL_ERROR);
  CONSTANT(POOLER_COMPILE_ERROR);
  CONSTANT(POOLER_PEER_TIMEOUT);
  CONSTANT(POOLER_OTHER);
  CONSTANT(POOLER_DTYPE_BF16);
  CONSTANT(POOLER_DTYPE_F32);
  CONSTANT(POOLER_DTYPE_U8);
  CONSTANT(POOLER_DTYPE_E4M3);
  CONSTANT(POOLER_TRANSPORT_AUTO);
  CONSTANT(POOLER_TRANSPORT_LAMPORT);
  CONSTANT(POOLER_TRANSPORT_NCCL);
  CONSTANT(POOLER_LOG_TRACE);
  CONSTANT(POOLER_LOG_DEBUG);
  CONSTANT(POOLER_LOG_INFO);
  CONSTANT(POOLER_LOG_WARN);
  CONSTANT(POOLER_LOG_ERROR);
  CONSTANT(POOLER_LOG_CRITICAL);
  CONSTANT(POOLER_LOG_OFF);
  CONSTANT(POOLER_OPTIONS_MAGIC);
  CONSTANT(POOLER_LAYER_DESC_MAGIC);
  CONSTANT(POOLER_PEER_TIMEOUT_INFO_MAGIC);
  CONSTANT(POOLER_OPTIONS_MIN_SIZE);
  CONSTANT(POOLER_LAYER_DESC_MIN_SIZE);
  CONSTANT(POOLER_PEER_TIMEOUT_INFO_MIN_SIZE);
  CONSTANT(POOLER_MAILBOX_INFO_MAGIC);
  CONSTANT(POOLER_MAILBOX_INFO_MIN_SIZE);
  CONSTANT(POOLER_GEMM_SHAPE_MAGIC);
  CONSTANT(POOLER_GEMM_SHAPE_MIN_SIZE);
  fprintf(out, "}\n");
  if (fclose(out) != 0) {
    perror(argv[1]);
    return 1;
  }
  return 0;
}
