# SPDX-License-Identifier: Apache-2.0
"""The seed's API beyond the Pooler, without a GPU: pooler_layer on a small module built like
the stock MuseSpark1xMoE (its views and every refusal), PoolerGemmShape (the seed's fields and
the library's rule), and the per-kernel entry points' argument checks that come before any
device work. test_gpu.py runs them on a GPU."""

import ctypes

import pytest

import pooler
from conftest import requires_torch

P, H = 512, 256  # small, and P / tp a whole number of 16-column NVFP4 blocks at every tp


# ---- PoolerGemmShape (no torch) ------------------------------------------------------------------


def test_gemm_shape_has_the_seeds_fields_first():
    shape = pooler.PoolerGemmShape(128, 32, 4)
    assert shape._fields[:3] == ("block_size", "outputs_per_block", "k_unroll")
    assert (shape.block_size, shape.outputs_per_block, shape.k_unroll) == (128, 32, 4)
    assert shape == pooler.PoolerGemmShape(128, 32, 4, 8, 2, 2, 0, False, False)
    assert pooler.PoolerGemmShape() == pooler.PoolerGemmShape(256, 64, 8)  # pooler::PoolerGemmShape's defaults


def test_gemm_shape_round_trips_through_c():
    shape = pooler.PoolerGemmShape(128, 32, 4, 2, 1, 1, 3, True, False)
    c = shape.to_c()
    assert (c.size, c.magic, c.version) == (56, pooler._abi.CONSTANTS["POOLER_GEMM_SHAPE_MAGIC"], 4)
    assert pooler.PoolerGemmShape.from_c(c) == shape
    with pytest.raises(TypeError, match=r"PoolerGemmShape.k_unroll is 4.0 \(float\); expected an int"):
        pooler.PoolerGemmShape(128, 32, 4.0).to_c()
    with pytest.raises(TypeError, match="PoolerGemmShape.block_size is True"):
        pooler.PoolerGemmShape(True).to_c()


def test_choose_is_the_librarys_rule():
    # The rule's documented corners (runtime/gemm/pooler_gemm.hpp): 8 warps below N = 1024, 4 from it.
    narrow = pooler.PoolerGemmShape.choose(8, 512, 8192)
    wide = pooler.PoolerGemmShape.choose(8, 2048, 8192)
    assert narrow.block_size == 256 and narrow.block_size % 32 == 0
    assert wide.block_size == 128 and wide.stages >= 2  # the ring at N >= 2048, rows <= 8
    for shape in (narrow, wide):
        assert shape.outputs_per_block % 16 == 0 and shape.split_k in (1, 2, 4, 8)
    with pytest.raises(pooler.InvalidArgument, match="33"):
        pooler.PoolerGemmShape.choose(33, 512, 8192)
    with pytest.raises(pooler.InvalidArgument):
        pooler.PoolerGemmShape.choose(8, 100, 8192)  # n not a multiple of 16
    with pytest.raises(TypeError, match="n is '512'"):
        pooler.PoolerGemmShape.choose(8, "512", 8192)


def test_new_c_functions_refuse_null_and_foreign_handles():
    lib = pooler._library.library()
    assert lib.pooler_kernel_destroy(None) == 0  # NULL: nothing
    for name, args in (("pooler_gemm_launch", (None, 16, 16, 16, None)), ("pooler_kernel_form", (None, None)),
                       ("pooler_gather_launch", (None, None, 16, 1, None)), ("pooler_rows", (None, None)),
                       ("pooler_mailbox", (None, None))):
        with pytest.raises(pooler.InvalidArgument, match="is NULL"):
            pooler._library.call(name, *args)
    shape = pooler._abi.GemmShape()
    shape.magic = 0
    with pytest.raises(pooler.InvalidArgument, match=r"shape->magic is 0x00000000"):
        pooler._library.call("pooler_choose_gemm_shape", 8, 512, 8192, ctypes.byref(shape))
    kernel = ctypes.c_void_p()
    with pytest.raises(pooler.InvalidArgument, match="pooled|P"):
        pooler._library.call("pooler_gather_compile", ctypes.byref(kernel), 0, 500, 1, 8, 1)
    assert kernel.value is None


# ---- pooler_layer ------------------------------------------------------------------------------


def stock_moe(*, nvfp4=True, seed=0, p=P, h=H):
    """A module shaped like the stock MuseSpark1xMoE: what pooler_layer reads of it."""
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(seed)

    class ExpertNorm(nn.Module):  # expert_norm.ExpertNorm's attributes
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter((torch.randn(p, generator=generator) * 0.1).to(torch.bfloat16))
            self.has_weight = True
            self.variance_size_override = None
            self.applies_weight_before_norm = False
            self.variance_epsilon = 1e-5
            self.fused_gain_center = 1.0

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            scale = torch.tensor(448.0 * 6.0 / 5.0) if nvfp4 else None  # a 0-d FP32, as a checkpoint holds it
            self.register_buffer("nvfp4_input_global_scale", scale)

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.pooler = nn.Linear(h, p, bias=False, dtype=torch.bfloat16)
            with torch.no_grad():
                self.pooler.weight.copy_(torch.randn(p, h, generator=generator).to(torch.bfloat16))
            self.pre_expert_norm = ExpertNorm()
            self.experts = Experts()

    return MoE()


@requires_torch
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_pooler_layer_takes_this_ranks_rows_as_views(tp):
    import torch

    moe = stock_moe()
    weight = moe.pooler.weight
    shard = P // tp
    for rank in range(tp):
        layer = pooler.pooler_layer(moe, tp, rank, hidden=H, pooled=P)
        assert isinstance(layer, pooler.PoolerLayer)
        assert layer.weight.shape == (shard, H) and layer.weight.is_contiguous()
        assert layer.weight.data_ptr() == weight.data_ptr() + rank * shard * H * 2  # a view: no copy
        assert torch.equal(layer.weight, weight[rank * shard:(rank + 1) * shard])
        assert layer.norm_weight is moe.pre_expert_norm.weight
        assert (layer.eps, layer.gain_center) == (1e-5, 1.0) and type(layer.eps) is float
        assert layer.global_scale.shape == (1,) and layer.global_scale.dtype == torch.float32
        assert layer.global_scale.data_ptr() == moe.experts.nvfp4_input_global_scale.data_ptr()
    # The blocks of every rank tile the weight.
    blocks = [pooler.pooler_layer(moe, tp, r, hidden=H, pooled=P).weight for r in range(tp)]
    assert torch.equal(torch.cat(blocks), weight)


@requires_torch
def test_pooler_layer_of_an_edge_layer_has_no_scale():
    layer = pooler.pooler_layer(stock_moe(nvfp4=False), 2, 1, hidden=H, pooled=P)
    assert layer.global_scale is None


@requires_torch
def test_pooler_layer_defaults_to_muse_sparks_sizes():
    with pytest.raises(ValueError, match=r"pooler weight must be \[4096, 8192\] BF16; moe.pooler.weight is "
                                         r"torch.bfloat16 \[512, 256\]"):
        pooler.pooler_layer(stock_moe(), 2, 0)


@requires_torch
def test_pooler_layer_refuses_what_the_fused_path_does_not_assume():
    import torch

    def refused(change, error, match):
        moe = stock_moe()
        change(moe)
        with pytest.raises(error, match=match):
            pooler.pooler_layer(moe, 2, 0, hidden=H, pooled=P)

    def setter(path, value):
        def change(moe):
            *owner, name = path.split(".")
            target = moe
            for part in owner:
                target = getattr(target, part)
            if isinstance(value, torch.Tensor) and name in ("weight", "nvfp4_input_global_scale"):
                delattr(target, name)
            setattr(target, name, value)
        return change

    norm = "pre_expert_norm must apply a \\[512\\] BF16 weight after the norm: "
    refused(setter("pooler.weight", torch.zeros(P, H)), ValueError, r"torch.float32 \[512, 256\]")
    refused(setter("pooler.weight", torch.zeros(P, H + 8, dtype=torch.bfloat16)), ValueError, r"\[512, 264\]")
    refused(setter("pre_expert_norm", None), ValueError, norm + "moe.pre_expert_norm is None")
    refused(setter("pre_expert_norm.has_weight", False), ValueError, norm + "it has no weight")
    refused(setter("pre_expert_norm.variance_size_override", 128), ValueError, norm + "variance_size_override is 128")
    refused(setter("pre_expert_norm.applies_weight_before_norm", True), ValueError, norm + "it applies its weight")
    refused(setter("pre_expert_norm.weight", torch.zeros(P)), ValueError, norm + r"its weight is torch.float32")
    refused(setter("pre_expert_norm.weight", torch.zeros(P // 2, dtype=torch.bfloat16)), ValueError, r"\[256\]")
    refused(setter("experts.nvfp4_input_global_scale", torch.ones(2)), ValueError,
            r"one FP32 value; moe.experts.nvfp4_input_global_scale is torch.float32 \[2\]")
    refused(setter("experts.nvfp4_input_global_scale", torch.ones(1, dtype=torch.float64)), ValueError,
            "torch.float64")
    refused(lambda moe: delattr(moe, "experts"), TypeError, "moe has no attribute 'experts'")
    refused(lambda moe: delattr(moe.pre_expert_norm, "fused_gain_center"), TypeError,
            "moe.pre_expert_norm has no attribute 'fused_gain_center'")


@requires_torch
def test_pooler_layer_checks_tp_and_rank():
    moe = stock_moe()
    with pytest.raises(ValueError, match="tp is 3: no pooler GEMM shape for TP3"):
        pooler.pooler_layer(moe, 3, 0, hidden=H, pooled=P)
    with pytest.raises(ValueError, match="rank is 2; expected 0 <= rank < tp = 2"):
        pooler.pooler_layer(moe, 2, 2, hidden=H, pooled=P)
    with pytest.raises(TypeError, match="rank is 0.0"):
        pooler.pooler_layer(moe, 2, 0.0, hidden=H, pooled=P)


# ---- the per-kernel entry points: what is refused before any device work ---------------------------


@requires_torch
def test_compile_pooler_gemm_checks_its_arguments():
    with pytest.raises(TypeError, match="rows is '8'"):
        pooler.compile_pooler_gemm("8", pooler.PoolerGemmShape())
    with pytest.raises(TypeError, match="shape is a tuple"):
        pooler.compile_pooler_gemm(8, (256, 64, 8))
    with pytest.raises(TypeError, match="PoolerGemmShape.outputs_per_block is None"):
        pooler.compile_pooler_gemm(8, pooler.PoolerGemmShape(256, None, 8))
    with pytest.raises(ValueError, match="give both"):
        pooler.compile_pooler_gemm(8, n=512)
    gemm = pooler.compile_pooler_gemm(8)  # N and K dynamic: nothing compiled yet
    assert gemm.forms == []


@requires_torch
def test_a_gemm_call_checks_its_tensors_before_compiling():
    import torch

    gemm = pooler.compile_pooler_gemm(8)
    a = torch.zeros(8, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="a is on cpu; expected a CUDA device"):
        gemm(a, a, a, a, None)
    with pytest.raises(TypeError, match="a is torch.float32"):
        gemm(a.float(), a, a, a, None)
    with pytest.raises(ValueError, match="a is not contiguous"):
        gemm(torch.zeros(H, 8, dtype=torch.bfloat16).t(), a, a, a, None)
    assert gemm.forms == []


@requires_torch
def test_consumers_refuse_a_cpu_device():
    with pytest.raises(ValueError, match="device is cpu; expected a CUDA device"):
        pooler.compile_gather(hidden=P, tp=2, capacity_m=8, device="cpu")
    with pytest.raises(ValueError, match="device is cpu"):
        pooler.compile_norm_quant(hidden=P, tp=2, capacity_m=8, eps=1e-5, gain_center=1.0, device="cpu")
