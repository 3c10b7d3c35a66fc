# SPDX-License-Identifier: Apache-2.0
"""The seed's PoolerGemmShape: the pooler GEMM's launch shape (no torch needed)."""

import ctypes
from typing import NamedTuple

from . import _abi
from ._library import call


class PoolerGemmShape(NamedTuple):
    """Launch shape of the pooler GEMM: `block_size` threads per CTA, `outputs_per_block`
    columns per CTA, `k_unroll` K steps in flight per warp (the seed's three fields, first and
    in its order), then pooler's own knobs (pooler::PoolerGemmShape, docs/design/gemm.md):
    `split_k` CTAs of a cluster over K, `warps_k` warps of a CTA over its K slice, `ctas_per_sm`,
    `stages` (0: w through registers, else a shared-memory ring), `async_reduce`, `w_on_chip`.
    A tuning knob, not a contract: every shape that validates computes the same function (to
    FP32 summation order). `PoolerGemmShape.choose(rows, n, k)` is the Pooler's own choice."""

    block_size: int = 256
    outputs_per_block: int = 64
    k_unroll: int = 8
    split_k: int = 8
    warps_k: int = 2
    ctas_per_sm: int = 2
    stages: int = 0
    async_reduce: bool = False
    w_on_chip: bool = False

    def to_c(self):
        """The pooler_gemm_shape of this shape (TypeError naming a field that is not an int or bool)."""
        values = []
        for name, value in zip(self._fields, self):
            wanted = bool if name in ("async_reduce", "w_on_chip") else int
            if not isinstance(value, (int, bool)) or (wanted is int and isinstance(value, bool)):
                raise TypeError(f"PoolerGemmShape.{name} is {value!r} ({type(value).__name__}); "
                                f"expected {'a bool' if wanted is bool else 'an int'}")
            if not -2 ** 31 <= int(value) < 2 ** 31:
                raise ValueError(f"PoolerGemmShape.{name} is {value}; expected a 32-bit int")
            values.append(int(value))
        return _abi.GemmShape(*values)

    @classmethod
    def from_c(cls, shape):
        return cls(shape.block_size, shape.outputs_per_block, shape.k_unroll, shape.split_k, shape.warps_k,
                   shape.ctas_per_sm, shape.stages, bool(shape.async_reduce), bool(shape.w_on_chip))

    @classmethod
    def choose(cls, rows: int, n: int, k: int) -> "PoolerGemmShape":
        """The shape the Pooler takes for c [rows, n] = a [rows, k] @ b [n, k].T (the library's
        rule; needs no GPU). pooler.InvalidArgument when none fits."""
        for name, value in (("rows", rows), ("n", n), ("k", k)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} is {value!r} ({type(value).__name__}); expected an int")
        shape = _abi.GemmShape()
        call("pooler_choose_gemm_shape", rows, n, k, ctypes.byref(shape))
        return cls.from_c(shape)
