# SPDX-License-Identifier: Apache-2.0
"""The seed's pooler_layer: what the Pooler reads from one stock MuseSpark1xMoE, checked
against what the fused path assumes."""

from typing import Any

import torch

from ._pooler import TPS, PoolerLayer

# Muse Spark's sizes (docs/design/numerics.md), the seed's HIDDEN and POOLED.
HIDDEN, POOLED = 8192, 4096


def _attribute(owner, path):
    value = owner
    for depth, name in enumerate(path.split(".")):
        if not hasattr(value, name):
            where = "moe" + "".join("." + part for part in path.split(".")[:depth])
            raise TypeError(f"{where} has no attribute {name!r}; expected a stock MuseSpark1xMoE (moe.pooler.weight, "
                            "moe.pre_expert_norm, moe.experts.nvfp4_input_global_scale)")
        value = getattr(value, name)
    return value


def _describe(tensor):
    if not isinstance(tensor, torch.Tensor):
        return f"a {type(tensor).__name__}"
    return f"{tensor.dtype} {list(tensor.shape)}"


def pooler_layer(moe: Any, tp: int, rank: int, *, hidden: int = HIDDEN, pooled: int = POOLED) -> PoolerLayer:
    """The pooler of one stock MuseSpark1xMoE for rank `rank` of `tp`, checked against what the
    fused path assumes (the stock path's own conditions for its fused gather), as the seed's:
    `moe.pooler.weight` BF16 [P, H]; `moe.pre_expert_norm` present, with a weight
    (`has_weight`), no `variance_size_override`, the weight applied after the norm (not
    `applies_weight_before_norm`), `weight` BF16 [P]; `moe.experts.nvfp4_input_global_scale`
    one FP32 value (an NVFP4 layer) or None (a BF16 edge layer). ValueError naming what differs
    (TypeError for a module without those attributes). Views, no copies: this rank's rows
    [rank * P / tp, (rank + 1) * P / tp) of the weight, the norm's weight, the scale as [1].
    `hidden` and `pooled` (keyword-only, beyond the seed) are H and P: Muse Spark's by default."""
    for name, value in (("tp", tp), ("rank", rank), ("hidden", hidden), ("pooled", pooled)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} is {value!r} ({type(value).__name__}); expected an int")
    if tp not in TPS:
        raise ValueError(f"tp is {tp}: no pooler GEMM shape for TP{tp} (expected one of {TPS})")
    if not 0 <= rank < tp:
        raise ValueError(f"rank is {rank}; expected 0 <= rank < tp = {tp}")
    if pooled % tp != 0:
        raise ValueError(f"P = {pooled} is not divisible by tp = {tp}")
    weight = _attribute(moe, "pooler.weight")
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (pooled, hidden) \
            or weight.dtype != torch.bfloat16:
        raise ValueError(f"pooler weight must be [{pooled}, {hidden}] BF16; moe.pooler.weight is {_describe(weight)}")
    norm = _attribute(moe, "pre_expert_norm")
    problem = None
    if norm is None:
        problem = "moe.pre_expert_norm is None"
    elif not _attribute(moe, "pre_expert_norm.has_weight"):
        problem = "it has no weight (has_weight is False)"
    elif _attribute(moe, "pre_expert_norm.variance_size_override") is not None:
        problem = f"variance_size_override is {norm.variance_size_override!r}, not None"
    elif _attribute(moe, "pre_expert_norm.applies_weight_before_norm"):
        problem = "it applies its weight before the norm (applies_weight_before_norm)"
    else:
        norm_weight = _attribute(moe, "pre_expert_norm.weight")
        if not isinstance(norm_weight, torch.Tensor) or tuple(norm_weight.shape) != (pooled,) \
                or norm_weight.dtype != torch.bfloat16:
            problem = f"its weight is {_describe(norm_weight)}"
    if problem is not None:
        raise ValueError(f"pre_expert_norm must apply a [{pooled}] BF16 weight after the norm: {problem}")
    eps = float(_attribute(moe, "pre_expert_norm.variance_epsilon"))
    gain_center = float(_attribute(moe, "pre_expert_norm.fused_gain_center"))
    global_scale = _attribute(moe, "experts.nvfp4_input_global_scale")
    if global_scale is not None:
        if not isinstance(global_scale, torch.Tensor) or global_scale.numel() != 1 \
                or global_scale.dtype != torch.float32:
            raise ValueError("the NVFP4 input global scale must be one FP32 value; "
                             f"moe.experts.nvfp4_input_global_scale is {_describe(global_scale)}")
        global_scale = global_scale.reshape(1)
    shard = pooled // tp
    return PoolerLayer(weight=weight.narrow(0, rank * shard, shard), norm_weight=norm.weight, eps=eps,
                       gain_center=gain_center, global_scale=global_scale)
