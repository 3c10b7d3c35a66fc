// Test-only, the stock path's rearrangement: an NCCL all-gather of the [b, W] shards
// (W = POOLED / TP) leaves them rank after rank, [TP][b][W]; the norm wants rows
// [b, POOLED] with rank r's block in columns [r W, (r + 1) W).
// Constants: POOLED, TP, THREADS (CTA size).
// Launch: grid (ceil(b * POOLED / 4 / THREADS)), block (THREADS); one thread per 4 values.
constexpr unsigned kWidth = POOLED / TP;
constexpr unsigned kWordsPerRow = POOLED / 4;  // 8-byte words of 4 BF16 values
static_assert(POOLED % TP == 0 && kWidth % 4 == 0, "a word never straddles two ranks' blocks");

extern "C" __global__ void __launch_bounds__(THREADS)
    pooler_test_gather_rows(const unsigned long long* gathered, unsigned long long* rows, int b) {
  const unsigned word = blockIdx.x * THREADS + threadIdx.x;
  if (word >= static_cast<unsigned>(b) * kWordsPerRow) return;
  const unsigned row = word / kWordsPerRow;
  const unsigned column = (word % kWordsPerRow) * 4u;
  const unsigned rank = column / kWidth;
  const unsigned within = column % kWidth;
  rows[word] = gathered[((static_cast<unsigned long long>(rank) * b + row) * kWidth + within) / 4u];
}
