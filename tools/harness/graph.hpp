// SPDX-License-Identifier: Apache-2.0
// A CUDA graph captured from a stream and instantiated, owned: the tools replay
// their kernels as graphs, as an engine would, and the tests replay them too.
#pragma once

#include <cuda.h>

#include "pooler/error.hpp"
#include "runtime/jit/driver.hpp"

namespace pooler::harness {

// A CUDA graph of what `enqueue` puts on `stream`, instantiated.
class Graph {
 public:
  template <typename Enqueue>
  Graph(CUstream stream, const char* what, Enqueue&& enqueue) : what_(what) {
    POOLER_CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), what);
    try {
      enqueue();
    } catch (...) {
      CUgraph abandoned = nullptr;
      driver().cuStreamEndCapture(stream, &abandoned);
      if (abandoned != nullptr) driver().cuGraphDestroy(abandoned);
      throw;
    }
    POOLER_CU(cuStreamEndCapture(stream, &graph_), what);
    POOLER_CU(cuGraphInstantiateWithFlags(&exec_, graph_, 0), what);
  }
  ~Graph() {
    if (exec_ != nullptr) driver().cuGraphExecDestroy(exec_);
    if (graph_ != nullptr) driver().cuGraphDestroy(graph_);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void launch(CUstream stream) const { POOLER_CU(cuGraphLaunch(exec_, stream), what_); }

 private:
  const char* what_;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
};

}  // namespace pooler::harness
