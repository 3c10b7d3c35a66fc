// pooler-kernel-bench --chain: the whole per-layer chain of Pooler::run on one GPU, at
// the widths of tp = 1, 2, 4, 8 (issue 14, item 1). tools/kernel_bench_chain.cpp says how.
#pragma once

namespace pooler::bench {

// Whether the arguments ask for the chain section (--chain anywhere among them).
bool wants_chain(int argc, char** argv);

// Runs the chain section alone with its own options (--chain --help lists them);
// returns the process's exit code.
int chain_main(int argc, char** argv);

}  // namespace pooler::bench
