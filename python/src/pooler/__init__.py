"""pooler: the pooler step of Muse Spark's MoE decode under tensor parallelism (the pooler
GEMM, a Lamport-mailbox gather over NCCL symmetric memory, RMSNorm with gain center and
NVFP4 quantization, bit for bit the stock path), for PyTorch engines.

The seed's API (`PoolerLayer`, `Pooler` with project, publish, gather, run, warm_up) over
libpooler.so's C ABI, and torch.ops.pooler.{run, project, publish, gather} for
torch.compile and CUDA graphs. Needs NCCL_NVLS_ENABLE=0 in the environment.

Without torch only the library-level parts load (`__version__`, `library_version()`,
`device_count()`, the exceptions).
"""

import importlib.util as _util

from ._build_info import VERSION as __version__
from ._library import (InvalidArgument, NoDriverError, PeerTimeout, PoolerError, device_count, library_path,
                       library_version)

__all__ = ["__version__", "PoolerError", "InvalidArgument", "NoDriverError", "PeerTimeout", "device_count",
           "library_path", "library_version", "HAS_TORCH"]

HAS_TORCH = _util.find_spec("torch") is not None
if HAS_TORCH:
    from ._pooler import Pooler, PoolerLayer  # registers torch.ops.pooler.* (through _ops)

    __all__ += ["Pooler", "PoolerLayer"]
