// SPDX-License-Identifier: Apache-2.0
// Test-only: compares a fused output with the stock one on the device and counts what
// differs, so that thousands of calls can be checked without a host round trip each.
// A mismatch is counted and the first RECORDS are kept (call tag, element, both values,
// the gathered input there); a difference that docs/design/numerics.md allows (the sign of a zero
// where the projected value was -0.0, which the mailbox delivers as +0.0) is counted
// separately. The host mirror of CompareCounters is in tests/support/stock_path.hpp.
// Constants: THREADS (CTA size), RECORDS (mismatches kept).
// Launch: grid (ceil(count / THREADS)), block (THREADS); one thread per element.

struct CompareMismatch {
  unsigned tag;    // the caller's label (a call number)
  unsigned kind;   // 0: BF16 element, 1: E2M1 code, 2: byte
  unsigned index;  // element (BF16 / code) or byte index within the compared range
  unsigned fused;
  unsigned stock;
  unsigned input;  // the gathered BF16 input at that element (0xFFFFFFFF for bytes)
  unsigned reserved[2];
};

struct CompareCounters {
  unsigned long long compared;  // elements compared, over every launch
  unsigned mismatches;          // differences that the contract does not allow
  unsigned sign_flips;          // +0 against -0 exactly where the projected value was -0.0
  unsigned launches;            // compare kernels that ran
  unsigned reserved[3];
  CompareMismatch first[RECORDS];
};

static_assert(sizeof(CompareMismatch) == 32, "shared with the host");
static_assert(sizeof(CompareCounters) == 32 + 32 * RECORDS, "shared with the host");

constexpr unsigned kNegativeZero = 0x8000u;

__device__ void count_block(CompareCounters* counters, int count) {
  if (threadIdx.x == 0) {
    const int first = static_cast<int>(blockIdx.x) * THREADS;
    const int here = count - first < THREADS ? count - first : THREADS;
    atomicAdd(&counters->compared, static_cast<unsigned long long>(here));
    if (blockIdx.x == 0) atomicAdd(&counters->launches, 1u);
  }
}

__device__ void record(CompareCounters* counters, unsigned tag, unsigned kind, unsigned index, unsigned fused,
                       unsigned stock, unsigned input) {
  const unsigned slot = atomicAdd(&counters->mismatches, 1u);
  if (slot < RECORDS) {
    CompareMismatch& m = counters->first[slot];
    m.tag = tag;
    m.kind = kind;
    m.index = index;
    m.fused = fused;
    m.stock = stock;
    m.input = input;
  }
}

// BF16 elements; `input` is the gathered row data of the stock path (same indexing).
extern "C" __global__ void __launch_bounds__(THREADS)
    pooler_test_compare_bf16(const unsigned short* fused, const unsigned short* stock, const unsigned short* input,
                             int count, unsigned tag, CompareCounters* counters) {
  count_block(counters, count);
  const int i = static_cast<int>(blockIdx.x) * THREADS + static_cast<int>(threadIdx.x);
  if (i >= count) return;
  const unsigned f = fused[i];
  const unsigned s = stock[i];
  if (f == s) return;
  const unsigned in = input[i];
  if (in == kNegativeZero && (f ^ s) == 0x8000u && (s & 0x7FFFu) == 0u) {
    atomicAdd(&counters->sign_flips, 1u);
    return;
  }
  record(counters, tag, 0u, static_cast<unsigned>(i), f, s, in);
}

// E2M1 codes, two per byte (element 2k in the low nibble of byte k); element i of the
// packed rows [b, P / 2] is element i of the gathered rows [b, P].
extern "C" __global__ void __launch_bounds__(THREADS)
    pooler_test_compare_codes(const unsigned char* fused, const unsigned char* stock, const unsigned short* input,
                              int count, unsigned tag, CompareCounters* counters) {
  count_block(counters, count);
  const int i = static_cast<int>(blockIdx.x) * THREADS + static_cast<int>(threadIdx.x);
  if (i >= count) return;
  const unsigned shift = (i & 1) * 4u;
  const unsigned f = (static_cast<unsigned>(fused[i >> 1]) >> shift) & 0xFu;
  const unsigned s = (static_cast<unsigned>(stock[i >> 1]) >> shift) & 0xFu;
  if (f == s) return;
  const unsigned in = input[i];
  if (in == kNegativeZero && (f ^ s) == 0x8u && (s & 0x7u) == 0u) {
    atomicAdd(&counters->sign_flips, 1u);
    return;
  }
  record(counters, tag, 1u, static_cast<unsigned>(i), f, s, in);
}

// Plain bytes (the E4M3 block scales): no exception.
extern "C" __global__ void __launch_bounds__(THREADS)
    pooler_test_compare_bytes(const unsigned char* fused, const unsigned char* stock, int count, unsigned tag,
                              CompareCounters* counters) {
  count_block(counters, count);
  const int i = static_cast<int>(blockIdx.x) * THREADS + static_cast<int>(threadIdx.x);
  if (i >= count) return;
  const unsigned f = fused[i];
  const unsigned s = stock[i];
  if (f != s) record(counters, tag, 2u, static_cast<unsigned>(i), f, s, 0xFFFFFFFFu);
}
