# SPDX-License-Identifier: Apache-2.0
"""pooler: the pooler step of Muse Spark's MoE decode under tensor parallelism (the pooler
GEMM, a Lamport-mailbox gather over NCCL symmetric memory, RMSNorm with gain center and
NVFP4 quantization, bit for bit the stock path), for PyTorch engines.

The seed's API over libpooler.so's C ABI (`pooler_layer`, `PoolerLayer`, `PoolerGemmShape`,
`Pooler` with project, publish, gather, run, warm_up and its scratch, `rows` and `mailbox`
among it, and the per-kernel entry points `compile_pooler_gemm`, `compile_gather` and
`compile_norm_quant`; python/README.md lists where each seed name lives), and
torch.ops.pooler.{run, project, publish, gather} for torch.compile and CUDA graphs. Needs
NCCL_NVLS_ENABLE=0 in the environment.

Without torch only the library-level parts load (`__version__`, `library_version()`,
`device_count()`, `PoolerGemmShape`, the exceptions).
"""

import importlib.util as _util

from ._build_info import VERSION as __version__
from ._library import (InvalidArgument, NoDriverError, PeerTimeout, PoolerError, device_count, library_path,
                       library_version)

__all__ = ["__version__", "PoolerError", "InvalidArgument", "NoDriverError", "PeerTimeout", "device_count",
           "library_path", "library_version", "HAS_TORCH"]

from ._shape import PoolerGemmShape  # noqa: E402

__all__ += ["PoolerGemmShape"]

HAS_TORCH = _util.find_spec("torch") is not None
if HAS_TORCH:
    from ._kernels import Mailbox, compile_gather, compile_norm_quant, compile_pooler_gemm
    from ._layer import pooler_layer
    from ._pooler import Pooler, PoolerLayer  # registers torch.ops.pooler.* (through _ops)

    __all__ += ["Pooler", "PoolerLayer", "pooler_layer", "Mailbox", "compile_pooler_gemm", "compile_gather",
                "compile_norm_quant"]
