# SPDX-License-Identifier: Apache-2.0
"""The stock path in plain PyTorch, for checks (numerics.md of the design): the pooler
GEMM's product, the all-gather, pre_expert_norm (RMSNorm with gain center, in FP32)
and the NVFP4 quantization with a saturating E4M3 (torch's float8 cast does not
saturate). Its exact rsqrt and reciprocals may differ from the hardware approximations
the kernels use in a handful of codes; `compare` counts what differs."""

import torch


def f32_exponent(a):
    """floor(log2(a)) of FP32 a >= 0 from its bits; -127 for zero and subnormals."""
    return ((a.contiguous().view(torch.int32) >> 23) & 0xFF) - 127


def pow2(e):
    """2.0 ** e as FP32, exactly, for int32 e in [-126, 127]."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def e4m3_satfinite_rn(v):
    """E4M3 (FN) codes and values of FP32 v: nearest even, subnormal step 2^-9, saturating at
    +-448, NaN -> 0x7F."""
    nan = torch.isnan(v)
    negative = torch.signbit(v)
    a = torch.nan_to_num(v.abs(), nan=0.0, posinf=448.0).clamp(max=448.0)
    quantum = pow2(torch.clamp(f32_exponent(a), min=-6) - 3)
    q = torch.round(a / quantum) * quantum  # half to even; both steps exact
    qe = torch.clamp(f32_exponent(q), min=-6)
    normal_code = ((qe + 7) << 3) | (torch.round(q / pow2(qe - 3)).to(torch.int32) - 8)
    subnormal_code = torch.round(q / 2.0 ** -9).to(torch.int32)
    code = torch.where(q < 2.0 ** -6, subnormal_code, normal_code) | (negative.to(torch.int32) << 7)
    code = torch.where(nan, torch.full_like(code, 0x7F), code)
    value = torch.where(negative, -q, q)
    return code, torch.where(nan, torch.full_like(value, float("nan")), value)


def e2m1_codes(q):
    """E2M1 codes (nearest even, saturating), sign in bit 3, NaN -> 7."""
    a = q.abs()
    code = ((a > 0.25).to(torch.int32) + (a >= 0.75).to(torch.int32) + (a > 1.25).to(torch.int32) +
            (a >= 1.75).to(torch.int32) + (a > 2.5).to(torch.int32) + (a >= 3.5).to(torch.int32) +
            (a > 5.0).to(torch.int32))
    code = code | (torch.signbit(q).to(torch.int32) << 3)
    return torch.where(torch.isnan(q), torch.full_like(code, 7), code)


def rms_norm(rows, weight, eps, gain_center):
    """y = bf16((x * rsqrt(mean(x^2) + eps)) * (weight + gain_center)), in FP32."""
    xf = rows.float()
    var = (xf * xf).sum(dim=-1, keepdim=True) / xf.shape[-1]
    inv = torch.rsqrt(var + eps)
    return ((xf * inv) * (weight.float() + gain_center)).to(torch.bfloat16)


def nvfp4_quantize(y, global_scale):
    """(codes int32 [b, P], scale bytes int32 [b, P / 16]) of y BF16 [b, P]."""
    b, pooled = y.shape
    yf = y.float().view(b, pooled // 16, 16)
    amax = yf.abs().amax(dim=-1)
    inv6 = torch.tensor(1.0 / 6.0, dtype=torch.float32, device=y.device)
    sf = global_scale.reshape(()) * (amax * inv6)
    scale_bytes, scale_values = e4m3_satfinite_rn(sf)
    out_scale = torch.where(scale_values == 0, torch.zeros_like(scale_values),
                            torch.reciprocal(scale_values * torch.reciprocal(global_scale.reshape(()))))
    return e2m1_codes(yf * out_scale.unsqueeze(-1)).view(b, pooled), scale_bytes


def unpack_codes(packed):
    """U8 [b, P / 2] (element 2k in the low nibble of byte k) -> int32 codes [b, P]."""
    p = packed.view(torch.uint8).to(torch.int32)
    return torch.stack((p & 0xF, p >> 4), dim=-1).view(packed.shape[0], -1)


def gather_rows(block, group=None):
    """The stock all-gather: [b, P / tp] blocks of every rank -> rows [b, P], with -0.0 as
    +0.0 (as through the pooler's mailbox, whose sentinel is -0.0)."""
    world = torch.distributed.get_world_size(group) if group is not None or torch.distributed.is_initialized() else 1
    b, width = block.shape
    if world == 1:
        rows = block.clone()
    else:
        gathered = torch.empty(world * b, width, dtype=block.dtype, device=block.device)
        torch.distributed.all_gather_into_tensor(gathered, block.contiguous(), group=group)
        rows = gathered.view(world, b, width).permute(1, 0, 2).reshape(b, world * width)
    return torch.where(rows == 0, torch.zeros_like(rows), rows)


def expert_input(rows, layer):
    """The stock norm (+ quantize) of gathered rows for a PoolerLayer: normed BF16 rows for an
    edge layer, (codes, scale bytes) for an NVFP4 layer."""
    y = rms_norm(rows, layer.norm_weight, layer.eps, layer.gain_center)
    return y if layer.global_scale is None else nvfp4_quantize(y, layer.global_scale.float())


def compare(result, stock):
    """Counts of what differs between a Pooler output and expert_input(): a dict with
    'values' and 'differ' (and 'beyond_one_ulp' for BF16 rows)."""
    if isinstance(stock, tuple):
        codes, scale_bytes = stock
        packed, scales = result
        got_codes = unpack_codes(packed)
        got_scales = scales.view(torch.uint8).to(torch.int32)
        return {"values": codes.numel() + scale_bytes.numel(),
                "differ": int((got_codes != codes).sum()) + int((got_scales != scale_bytes).sum())}
    ordered = [torch.where(t.view(torch.int16) < 0, -(t.view(torch.int16).to(torch.int32) & 0x7FFF),
                           t.view(torch.int16).to(torch.int32)) for t in (result, stock)]
    distance = (ordered[0] - ordered[1]).abs()
    return {"values": distance.numel(), "differ": int((distance != 0).sum()),
            "beyond_one_ulp": int((distance > 1).sum())}
