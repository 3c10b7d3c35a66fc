#!/usr/bin/env python3
"""pooler from PyTorch, through libpooler.so's C ABI (include/pooler/pooler.h) and ctypes.

One process per visible GPU (torch.multiprocessing.spawn with a file rendezvous), tensor
parallel over all of them (tp 1, 2, 4 or 8). Every rank:

  1. joins a torch.distributed group: gloo for Python objects, NCCL for the stock path;
  2. joins pooler's own NCCL communicator: rank 0 makes the unique id with
     pooler_get_unique_id, torch.distributed broadcasts it, every rank calls
     pooler_comm_init_rank;
  3. makes a synthetic Muse Spark-like model with a fixed seed on its GPU: per layer a BF16
     pooler weight [P, H] (the rank keeps its P / tp rows), a pre_expert_norm weight [P]
     around 0 (gain center 1.0, a few exactly -1.0), and an NVFP4 global scale, except for
     the first and the last layer (the BF16 edge layers);
  4. builds a Pooler on those tensors' device addresses (pooler_create) and warms it up;
  5. runs every layer eagerly once per batch size, then captures, per batch size, a CUDA
     graph of all layers with torch.cuda.graph: pooler_run on the capture stream followed
     by copies of its outputs and of this rank's projected block (pooler_last_projection)
     into the example's tensors; replays the graphs with fresh inputs;
  6. checks every output against a pure-PyTorch stock path, and times graphs of the bare
     pooler calls.

The stock path: x @ W_rank.T (BF16), all_gather_into_tensor, the RMSNorm with gain center
in FP32 and the NVFP4 quantization of docs/design/numerics.md, in PyTorch. Its exact rsqrt and
reciprocals differ from the hardware approximations the kernels use, and torch's GEMM sums
in another order than the pooler GEMM, so it runs twice:
  - from the pooler's own projected blocks: BF16 edge layers must lie within 1 ulp,
    NVFP4 codes and scales may differ in a handful of places (at most 1 in 1000);
  - from torch's GEMM: reported, with a loose bound that catches garbage only.
The pooler GEMM itself is checked against an FP64 product: every output within 1 BF16 ulp, or, where
the sum nearly cancels, within 2^-20 of the sum of |x w| (the FP32 accumulation's error bound; the same
allowance as tests/test_gemm_gpu.cpp).

    python3 tools/pooler_torch.py --lib build/libpooler.so            # 8 layers, b 1 and 8
    python3 tools/pooler_torch.py --layers 62 --batches 1,2,4,8,16    # the whole model

Exit status 0 when every check passes (or when no GPU is visible: it says so), 1 otherwise.
"""

import os

# NVLink multicast is forbidden on these hosts: off before NCCL (torch's or pooler's) starts.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import argparse  # noqa: E402
import ctypes  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

ABI_VERSION = 1
STATUS_PEER_TIMEOUT = 6
DTYPE_BF16, DTYPE_F32, DTYPE_U8, DTYPE_E4M3 = 0, 1, 2, 3

# Bounds of the checks (see the module's docstring).
MAX_MISMATCH_FRACTION = 1e-3  # NVFP4 codes and scales, from the pooler's blocks
GROSS_FRACTION = 0.02  # anything, from torch's GEMM


# ---- the C ABI ---------------------------------------------------------------------------


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * 128)]


class LayerDesc(ctypes.Structure):
    _fields_ = [
        ("weight", ctypes.c_uint64),
        ("norm_weight", ctypes.c_uint64),
        ("global_scale", ctypes.c_uint64),
        ("eps", ctypes.c_float),
        ("gain_center", ctypes.c_float),
    ]


class Options(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.POINTER(LayerDesc)),
        ("num_layers", ctypes.c_int),
        ("batches", ctypes.POINTER(ctypes.c_int)),
        ("num_batches", ctypes.c_int),
        ("capacity", ctypes.c_int),
        ("enable_pdl", ctypes.c_int),
        ("spin_timeout_ns", ctypes.c_int64),
        ("hidden", ctypes.c_int),
        ("pooled", ctypes.c_int),
    ]


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_uint64),
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
    ]


class ExpertInput(ctypes.Structure):
    _fields_ = [("nvfp4", ctypes.c_int32), ("packed", Tensor), ("scales", Tensor), ("normed", Tensor)]


class PeerTimeoutInfo(ctypes.Structure):
    _fields_ = [
        ("occurred", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("missing_peer", ctypes.c_int32),
        ("layer", ctypes.c_int32),
        ("stage", ctypes.c_int32),
        ("elapsed_ns", ctypes.c_uint64),
    ]


# The sizes runtime/c_api.cpp asserts for POOLER_ABI_VERSION 1.
for _struct, _size in ((UniqueId, 128), (LayerDesc, 32), (Options, 56), (Tensor, 32), (ExpertInput, 104),
                       (PeerTimeoutInfo, 32)):
    assert ctypes.sizeof(_struct) == _size, f"{_struct.__name__} is {ctypes.sizeof(_struct)} bytes, expected {_size}"


class PoolerError(RuntimeError):
    pass


class Library:
    """libpooler.so through ctypes; call() turns a status into a PoolerError with the message."""

    def __init__(self, path):
        try:
            self.lib = ctypes.CDLL(str(path))
        except OSError as error:
            raise PoolerError(
                f"cannot load {path}: {error}. libpooler.so needs NCCL 2.28 or newer; in a process that imported "
                "torch first, it uses the libnccl.so.2 that torch loaded") from None
        lib = self.lib
        handle, out_handle = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        int_p = ctypes.POINTER(ctypes.c_int)
        lib.pooler_abi_version.argtypes, lib.pooler_abi_version.restype = [], ctypes.c_int
        lib.pooler_version.argtypes, lib.pooler_version.restype = [], ctypes.c_char_p
        lib.pooler_status_name.argtypes, lib.pooler_status_name.restype = [ctypes.c_int], ctypes.c_char_p
        lib.pooler_last_error.argtypes, lib.pooler_last_error.restype = [], ctypes.c_char_p
        signatures = {
            "pooler_get_unique_id": [ctypes.POINTER(UniqueId)],
            "pooler_comm_init_rank": [out_handle, ctypes.c_int, ctypes.POINTER(UniqueId), ctypes.c_int, ctypes.c_int],
            "pooler_comm_destroy": [handle],
            "pooler_options_init": [ctypes.POINTER(Options)],
            "pooler_create": [out_handle, handle, ctypes.POINTER(Options)],
            "pooler_destroy": [handle],
            "pooler_warm_up": [handle],
            "pooler_run": [handle, ctypes.c_int, ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p,
                           ctypes.POINTER(ExpertInput)],
            "pooler_last_projection": [handle, ctypes.POINTER(Tensor)],
            "pooler_check": [handle],
            "pooler_peer_timeout": [handle, ctypes.POINTER(PeerTimeoutInfo)],
            "pooler_info": [handle, int_p, int_p, int_p],
            "pooler_form_count": [handle, int_p],
            "pooler_form": [handle, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, argtypes in signatures.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int
        abi = lib.pooler_abi_version()
        if abi != ABI_VERSION:
            raise PoolerError(f"{path} implements pooler ABI {abi}; this script speaks ABI {ABI_VERSION}")
        self.version = lib.pooler_version().decode()

    def call(self, name, *args, pooler=None):
        status = getattr(self.lib, name)(*args)
        if status == 0:
            return
        message = (self.lib.pooler_last_error() or b"").decode(errors="replace")
        text = f"{self.lib.pooler_status_name(status).decode()}: {message}"
        if status == STATUS_PEER_TIMEOUT and pooler is not None:
            info = PeerTimeoutInfo()
            if self.lib.pooler_peer_timeout(pooler, ctypes.byref(info)) == 0 and info.occurred:
                text += (f" [rank {info.rank} gave up on peer {info.missing_peer} at layer {info.layer}, stage "
                         f"{info.stage}, after {info.elapsed_ns / 1e9:.3f} s]")
        raise PoolerError(text)


class DeviceArray:
    """Device memory that torch.as_tensor can wrap, without a copy, through __cuda_array_interface__."""

    def __init__(self, address, shape, typestr):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (address, False),
                                         "version": 2}


# ---- the stock path in PyTorch (docs/design/numerics.md) ---------------------------------


def f32_exponent(torch, a):
    """floor(log2(a)) of FP32 a >= 0 from its bits; -127 for zero and subnormals."""
    return ((a.contiguous().view(torch.int32) >> 23) & 0xFF) - 127


def pow2(torch, e):
    """2.0 ** e as FP32, exactly, for int32 e in [-126, 127]."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def bf16_ulp(torch, v):
    """One BF16 ulp at the magnitude of FP64 v, 2^(floor(log2 |v|) - 7), built from bits (exact)."""
    _, exponent = torch.frexp(v)  # v = m * 2^exponent, m in [0.5, 1)
    return ((exponent.to(torch.int64) - 8 + 1023) << 52).view(torch.float64)


def e4m3_satfinite_rn(torch, v):
    """E4M3 (FN) bytes and their values: round to nearest even, subnormal step 2^-9,
    saturation at +-448, NaN -> 0x7F. Written out rather than torch's float8 cast, which does
    not saturate."""
    nan = torch.isnan(v)
    negative = torch.signbit(v)
    a = torch.nan_to_num(v.abs(), nan=0.0, posinf=448.0).clamp(max=448.0)
    # Three mantissa bits: a quantum of 2^(e - 3) in the binade [2^e, 2^(e+1)); the
    # subnormals share the quantum of the lowest binade (e = -6): 2^-9.
    quantum = pow2(torch, torch.clamp(f32_exponent(torch, a), min=-6) - 3)
    q = torch.round(a / quantum) * quantum  # torch.round is half-to-even; both steps are exact
    qe = torch.clamp(f32_exponent(torch, q), min=-6)
    normal_code = ((qe + 7) << 3) | (torch.round(q / pow2(torch, qe - 3)).to(torch.int32) - 8)
    subnormal_code = torch.round(q / 2.0 ** -9).to(torch.int32)
    code = torch.where(q < 2.0 ** -6, subnormal_code, normal_code) | (negative.to(torch.int32) << 7)
    code = torch.where(nan, torch.full_like(code, 0x7F), code)
    value = torch.where(negative, -q, q)
    value = torch.where(nan, torch.full_like(value, float("nan")), value)
    return code, value


def e2m1_codes(torch, q):
    """E2M1 codes by docs/design/numerics.md's table (round to nearest even, saturating), sign in bit 3."""
    a = q.abs()
    code = ((a > 0.25).to(torch.int32) + (a >= 0.75).to(torch.int32) + (a > 1.25).to(torch.int32) +
            (a >= 1.75).to(torch.int32) + (a > 2.5).to(torch.int32) + (a >= 3.5).to(torch.int32) +
            (a > 5.0).to(torch.int32))
    code = code | (torch.signbit(q).to(torch.int32) << 3)
    return torch.where(torch.isnan(q), torch.full_like(code, 7), code)


def rms_norm(torch, rows, weight, eps, gain_center):
    """y = bf16((x * rsqrt(mean(x^2) + eps)) * (weight + gain_center)), in FP32."""
    xf = rows.float()
    var = (xf * xf).sum(dim=-1, keepdim=True) / xf.shape[-1]
    inv = torch.rsqrt(var + eps)
    return ((xf * inv) * (weight.float() + gain_center)).to(torch.bfloat16)


def nvfp4_quantize(torch, y, global_scale):
    """docs/design/numerics.md steps 1-6 with exact reciprocals: (codes int32 [b, P], scale bytes int32 [b, P / 16])."""
    b, pooled = y.shape
    yf = y.float().view(b, pooled // 16, 16)
    amax = yf.abs().amax(dim=-1)
    inv6 = torch.tensor(1.0 / 6.0, dtype=torch.float32, device=y.device)
    sf = global_scale * (amax * inv6)
    scale_bytes, scale_values = e4m3_satfinite_rn(torch, sf)
    out_scale = torch.where(scale_values == 0, torch.zeros_like(scale_values),
                            torch.reciprocal(scale_values * torch.reciprocal(global_scale)))
    codes = e2m1_codes(torch, yf * out_scale.unsqueeze(-1)).view(b, pooled)
    return codes, scale_bytes


def unpack_codes(torch, packed):
    """U8 [b, P / 2] (element 2k in the low nibble of byte k) -> int32 codes [b, P]."""
    p = packed.to(torch.int32)
    return torch.stack((p & 0xF, p >> 4), dim=-1).view(packed.shape[0], -1)


def bf16_ordered(torch, x):
    """BF16 bits as integers ordered like the values (+0 and -0 both 0), for ulp distances."""
    bits = x.view(torch.int16).to(torch.int32) & 0xFFFF
    return torch.where(bits >= 0x8000, -(bits & 0x7FFF), bits)


# ---- one rank ------------------------------------------------------------------------------

COUNTERS = [
    "gemm_outputs", "gemm_beyond_ulp", "gemm_differ_torch",
    "own_edge_values", "own_edge_equal", "own_edge_one_ulp", "own_edge_beyond",
    "own_codes", "own_codes_differ", "own_scales", "own_scales_differ",
    "stock_edge_values", "stock_edge_equal", "stock_edge_one_ulp", "stock_edge_beyond",
    "stock_codes", "stock_codes_differ", "stock_scales", "stock_scales_differ",
]


class Rank:
    def __init__(self, rank, world, args, torch, dist):
        self.rank, self.world, self.args = rank, world, args
        self.torch, self.dist = torch, dist
        self.device = torch.device("cuda", rank)
        self.hidden, self.pooled, self.layers = args.hidden, args.pooled, args.layers
        self.width = args.pooled // world
        self.batches = args.batches
        self.lib = Library(args.lib)
        self.comm = ctypes.c_void_p()
        self.pooler = ctypes.c_void_p()
        self.views = {}
        self.failed = False

    def say(self, text):
        if self.rank == 0:
            print(text, flush=True)

    def call(self, name, *args):
        self.lib.call(name, *args, pooler=self.pooler if self.pooler.value else None)

    # -- set-up --

    def join(self):
        torch, dist = self.torch, self.dist
        uid = UniqueId()
        if self.rank == 0:
            self.call("pooler_get_unique_id", ctypes.byref(uid))
        box = [bytes(uid.internal) if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, device=torch.device("cpu"))
        uid = UniqueId.from_buffer_copy(box[0])
        self.call("pooler_comm_init_rank", ctypes.byref(self.comm), self.world, ctypes.byref(uid), self.rank,
                  self.rank)

    def make_model(self):
        torch = self.torch
        generator = torch.Generator(device=self.device)
        generator.manual_seed(self.args.seed)  # the same model on every rank
        self.weights, self.norms, self.scales = [], [], []
        rows = slice(self.rank * self.width, (self.rank + 1) * self.width)
        for layer in range(self.layers):
            full = (torch.randn(self.pooled, self.hidden, generator=generator, device=self.device) * 0.02)
            self.weights.append(full.to(torch.bfloat16)[rows].clone())
            del full
            norm = torch.randn(self.pooled, generator=generator, device=self.device) * 0.1
            norm[torch.randperm(self.pooled, generator=generator, device=self.device)[:8]] = -1.0
            self.norms.append(norm.to(torch.bfloat16))
            calibration_amax = 3.0 + 5.0 * torch.rand(1, generator=generator, device=self.device)
            edge = layer == 0 or layer == self.layers - 1
            self.scales.append(None if edge else (448.0 * 6.0 / calibration_amax).to(torch.float32))
        self.generator = generator

    def create(self):
        args = self.args
        self.descs = (LayerDesc * self.layers)()
        for layer in range(self.layers):
            scale = self.scales[layer]
            self.descs[layer] = LayerDesc(self.weights[layer].data_ptr(), self.norms[layer].data_ptr(),
                                          0 if scale is None else scale.data_ptr(), args.eps, args.gain_center)
        self.batch_array = (ctypes.c_int * len(self.batches))(*self.batches)
        options = Options()
        self.call("pooler_options_init", ctypes.byref(options))
        options.layers = ctypes.cast(self.descs, ctypes.POINTER(LayerDesc))
        options.num_layers = self.layers
        options.batches = ctypes.cast(self.batch_array, ctypes.POINTER(ctypes.c_int))
        options.num_batches = len(self.batches)
        options.capacity = max(32, max(self.batches))
        options.enable_pdl = 0 if args.no_pdl else 1
        options.hidden = self.hidden
        options.pooled = self.pooled
        started = time.monotonic()
        self.call("pooler_create", ctypes.byref(self.pooler), self.comm, ctypes.byref(options))
        count = ctypes.c_int()
        self.call("pooler_form_count", self.pooler, ctypes.byref(count))
        self.say(f"pooler {self.lib.version}: Pooler of {self.layers} layers, tp {self.world}, batches "
                 f"{self.batches}, PDL {'off' if args.no_pdl else 'on'}: {count.value} forms in "
                 f"{time.monotonic() - started:.1f} s")
        for index in range(count.value):
            line = ctypes.c_char_p()
            self.call("pooler_form", self.pooler, index, ctypes.byref(line))
            self.say(f"  {line.value.decode()}")
        self.call("pooler_warm_up", self.pooler)

    def allocate(self):
        torch = self.torch
        bf16 = dict(dtype=torch.bfloat16, device=self.device)
        u8 = dict(dtype=torch.uint8, device=self.device)
        self.x = {b: torch.zeros(b, self.hidden, **bf16) for b in self.batches}
        self.out = {}
        for b in self.batches:
            self.out[b] = {
                "block": torch.zeros(self.layers, b, self.width, **bf16),
                "normed": torch.zeros(self.layers, b, self.pooled, **bf16),
                "packed": torch.zeros(self.layers, b, self.pooled // 2, **u8),
                "scales": torch.zeros(self.layers, b, self.pooled // 16, **u8),
            }

    def fresh_inputs(self):
        """New rows in every static input: N(0, 1) times a per-row scale in [1e-2, 1e2], and an all-zero row."""
        torch = self.torch
        for b in self.batches:
            x = torch.randn(b, self.hidden, generator=self.generator, device=self.device)
            x *= 10.0 ** (torch.rand(b, 1, generator=self.generator, device=self.device) * 4.0 - 2.0)
            if b >= 4:
                x[b // 2] = 0.0
            self.x[b].copy_(x.to(torch.bfloat16))

    # -- the pooler calls --

    def view(self, tensor):
        """The torch tensor over one of the pooler's outputs, made once per address and shape
        (outside any capture: the outputs live in the Pooler's scratch, at fixed addresses)."""
        key = (tensor.data, tensor.rows, tensor.cols, tensor.dtype)
        if key not in self.views:
            if self.torch.cuda.is_current_stream_capturing():
                raise PoolerError(f"a pooler output moved to {key} during capture; expected the addresses of the "
                                  "eager calls")
            typestr = {DTYPE_BF16: "<i2", DTYPE_F32: "<f4", DTYPE_U8: "|u1", DTYPE_E4M3: "|u1"}[tensor.dtype]
            wrapped = self.torch.as_tensor(DeviceArray(tensor.data, (tensor.rows, tensor.cols), typestr),
                                           device=self.device)
            self.views[key] = wrapped.view(self.torch.bfloat16) if tensor.dtype == DTYPE_BF16 else wrapped
        return self.views[key]

    def all_layers(self, b, copies):
        """Every layer on the current stream (the capture stream inside torch.cuda.graph)."""
        stream = ctypes.c_void_p(self.torch.cuda.current_stream().cuda_stream)
        x = self.x[b].data_ptr()
        out = self.out[b]
        for layer in range(self.layers):
            result = ExpertInput()
            self.call("pooler_run", self.pooler, layer, x, b, stream, ctypes.byref(result))
            if not copies:
                continue
            block = Tensor()
            self.call("pooler_last_projection", self.pooler, ctypes.byref(block))
            out["block"][layer].copy_(self.view(block))
            if result.nvfp4:
                out["packed"][layer].copy_(self.view(result.packed))
                out["scales"][layer].copy_(self.view(result.scales))
            else:
                out["normed"][layer].copy_(self.view(result.normed))

    # -- the checks --

    def gather_rows(self, block):
        """The stock all-gather: [b, P / tp] blocks of every rank -> rows [b, P]. -0.0 arrives as +0.0,
        as through the pooler's mailbox (its sentinel is -0.0)."""
        torch = self.torch
        b = block.shape[0]
        gathered = torch.empty(self.world * b, self.width, dtype=torch.bfloat16, device=self.device)
        self.dist.all_gather_into_tensor(gathered, block.contiguous())
        rows = gathered.view(self.world, b, self.width).permute(1, 0, 2).reshape(b, self.pooled)
        return torch.where(rows == 0, torch.zeros_like(rows), rows)

    def check_batch(self, b, counts):
        torch = self.torch
        x, out = self.x[b], self.out[b]
        for layer in range(self.layers):
            block = out["block"][layer]
            exact = x.double() @ self.weights[layer].double().t()
            # One BF16 ulp, or (where the sum nearly cancels, as tests/test_gemm_gpu.cpp
            # allows) 2^-20 of the sum of |x w|: the FP32 accumulation's own error bound.
            magnitude = x.double().abs() @ self.weights[layer].double().abs().t()
            ulp = torch.maximum(bf16_ulp(torch, exact), magnitude * 2.0 ** -20)
            torch_block = x @ self.weights[layer].t()
            counts["gemm_outputs"] += block.numel()
            counts["gemm_beyond_ulp"] += int(((block.double() - exact).abs() > ulp).sum())
            counts["gemm_differ_torch"] += int((torch_block.view(torch.int16) != block.view(torch.int16)).sum())
            for source, projected in (("own", block), ("stock", torch_block)):
                y = rms_norm(torch, self.gather_rows(projected), self.norms[layer], self.args.eps,
                             self.args.gain_center)
                if self.scales[layer] is None:
                    distance = (bf16_ordered(torch, out["normed"][layer]) - bf16_ordered(torch, y)).abs()
                    counts[f"{source}_edge_values"] += distance.numel()
                    counts[f"{source}_edge_equal"] += int((distance == 0).sum())
                    counts[f"{source}_edge_one_ulp"] += int((distance == 1).sum())
                    counts[f"{source}_edge_beyond"] += int((distance > 1).sum())
                else:
                    codes, scale_bytes = nvfp4_quantize(torch, y, self.scales[layer])
                    got_codes = unpack_codes(torch, out["packed"][layer])
                    counts[f"{source}_codes"] += codes.numel()
                    counts[f"{source}_codes_differ"] += int((got_codes != codes).sum())
                    counts[f"{source}_scales"] += scale_bytes.numel()
                    counts[f"{source}_scales_differ"] += int((out["scales"][layer].to(torch.int32) !=
                                                              scale_bytes).sum())

    def verify(self, what):
        """Checks every batch's outputs; sums the counts over the ranks; True when all pass."""
        torch = self.torch
        torch.cuda.synchronize()
        self.call("pooler_check", self.pooler)
        ok = True
        for b in self.batches:
            counts = dict.fromkeys(COUNTERS, 0)
            self.check_batch(b, counts)
            summed = torch.tensor([counts[name] for name in COUNTERS], dtype=torch.int64, device=self.device)
            self.dist.all_reduce(summed)
            c = dict(zip(COUNTERS, summed.tolist()))
            problems = []
            if c["gemm_beyond_ulp"]:
                problems.append(f"{c['gemm_beyond_ulp']} GEMM outputs beyond 1 ulp of FP64")
            if c["own_edge_beyond"]:
                problems.append(f"{c['own_edge_beyond']} edge-layer values beyond 1 ulp of the stock norm")
            for name in ("codes", "scales"):
                if c[f"own_{name}_differ"] > MAX_MISMATCH_FRACTION * c[f"own_{name}"]:
                    problems.append(f"{c[f'own_{name}_differ']} NVFP4 {name} differ from the stock quantizer")
                if c[f"stock_{name}_differ"] > GROSS_FRACTION * c[f"stock_{name}"]:
                    problems.append(f"{c[f'stock_{name}_differ']} NVFP4 {name} differ from the all-PyTorch path")
            if c["stock_edge_beyond"] > GROSS_FRACTION * c["stock_edge_values"]:
                problems.append(f"{c['stock_edge_beyond']} edge-layer values beyond 1 ulp of the all-PyTorch path")
            self.say(f"{what}, b = {b} (all {self.world} ranks):\n"
                     f"  pooler GEMM: {c['gemm_beyond_ulp']} of {c['gemm_outputs']} outputs beyond 1 BF16 ulp of "
                     f"FP64; {c['gemm_differ_torch']} differ from torch's BF16 matmul\n"
                     f"  vs stock from the pooler's blocks: edge {c['own_edge_equal']} equal, "
                     f"{c['own_edge_one_ulp']} at 1 ulp, {c['own_edge_beyond']} beyond, of {c['own_edge_values']}; "
                     f"NVFP4 codes {c['own_codes_differ']} of {c['own_codes']} differ, scales "
                     f"{c['own_scales_differ']} of {c['own_scales']}\n"
                     f"  vs the all-PyTorch path (torch's GEMM): edge {c['stock_edge_equal']} equal, "
                     f"{c['stock_edge_one_ulp']} at 1 ulp, {c['stock_edge_beyond']} beyond; NVFP4 codes "
                     f"{c['stock_codes_differ']} of {c['stock_codes']} differ, scales {c['stock_scales_differ']} "
                     f"of {c['stock_scales']}")
            for problem in problems:
                self.say(f"  FAIL: {problem}")
            ok = ok and not problems
        return ok

    def time_graphs(self):
        torch = self.torch
        for b in self.batches:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.all_layers(b, copies=False)
            for _ in range(3):
                graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.args.timing_replays):
                graph.replay()
            end.record()
            end.synchronize()
            micros = start.elapsed_time(end) * 1000.0 / self.args.timing_replays
            self.say(f"graph of {self.layers} bare pooler calls, b = {b}: {micros:.1f} us per replay, "
                     f"{micros / self.layers:.2f} us per layer (rank 0, {self.args.timing_replays} replays)")
            del graph
        torch.cuda.synchronize()
        self.call("pooler_check", self.pooler)

    def main(self):
        torch = self.torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        started = time.monotonic()
        self.join()
        self.make_model()
        self.create()
        self.allocate()
        ok = True
        # Everything on one stream of the example's (as an engine's decode stream), so
        # that the inputs, the pooler's kernels, the copies and the checks are ordered.
        with torch.cuda.stream(torch.cuda.Stream(device=self.device)):
            # Eagerly, once: also where the pooler's outputs live, for the views.
            self.fresh_inputs()
            for b in self.batches:
                self.all_layers(b, copies=True)
            ok = self.verify("eager calls") and ok

            graphs = {}
            for b in self.batches:
                graphs[b] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graphs[b], capture_error_mode="thread_local"):
                    self.all_layers(b, copies=True)
            for replay in range(1, self.args.replays + 1):
                self.fresh_inputs()
                for b in self.batches:
                    graphs[b].replay()
                ok = self.verify(f"graph replay {replay} of {self.args.replays}") and ok
            del graphs
            if self.args.timing_replays > 0:
                self.time_graphs()
            torch.cuda.synchronize()
        # Collective, on every rank alike (an error above skips it: see worker()).
        self.call("pooler_destroy", self.pooler)
        self.pooler = ctypes.c_void_p()
        self.call("pooler_comm_destroy", self.comm)
        self.say(f"{'PASS' if ok else 'FAIL'}: {self.layers} layers, batches {self.batches}, tp {self.world}, "
                 f"{time.monotonic() - started:.0f} s")
        return ok


def worker(rank, world, args, rendezvous):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        ok = Rank(rank, world, args, torch, dist).main()
    except Exception as error:
        # Leave at once: the collective clean-up (pooler_destroy, the process group) would
        # wait for ranks that may be gone; spawn ends the others when this one exits.
        if isinstance(error, PoolerError):
            print(f"pooler_torch rank {rank}: {error}", file=sys.stderr)
        else:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


# ---- the command -----------------------------------------------------------------------------


def parse_arguments():
    default_lib = Path(__file__).resolve().parent.parent / "build" / "libpooler.so"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", type=Path, default=default_lib, help=f"libpooler.so (default {default_lib})")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to use, 1, 2, 4 or 8 (default: as many as visible)")
    parser.add_argument("--layers", type=int, default=8, help="MoE layers (default 8; Muse Spark has 62)")
    parser.add_argument("--batches", default="1,8", help="batch sizes b, comma-separated (default 1,8)")
    parser.add_argument("--hidden", type=int, default=8192, help="H (default 8192)")
    parser.add_argument("--pooled", type=int, default=4096, help="P (default 4096)")
    parser.add_argument("--eps", type=float, default=1e-5, help="pre_expert_norm epsilon (default 1e-5)")
    parser.add_argument("--gain-center", type=float, default=1.0, help="norm gain center (default 1.0)")
    parser.add_argument("--replays", type=int, default=2, help="checked graph replays, fresh inputs each (default 2)")
    parser.add_argument("--timing-replays", type=int, default=20, help="timed graph replays (default 20; 0: none)")
    parser.add_argument("--no-pdl", action="store_true", help="programmatic dependent launch off")
    parser.add_argument("--seed", type=int, default=1234, help="model and input seed (default 1234)")
    args = parser.parse_args()
    try:
        args.batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    except ValueError:
        parser.error(f"--batches {args.batches!r}: expected comma-separated integers")
    if not args.batches or args.layers < 1:
        parser.error("expected at least one batch size and one layer")
    args.lib = args.lib.resolve()
    return args


def main():
    args = parse_arguments()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as error:
        print(f"pooler_torch: needs PyTorch with CUDA ({error})", file=sys.stderr)
        return 1
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < 1:
        print("pooler_torch: no CUDA GPU visible to PyTorch (torch.cuda.device_count() is 0); nothing to run")
        return 0
    if args.gpus:
        if args.gpus not in (1, 2, 4, 8) or args.gpus > visible:
            print(f"pooler_torch: --gpus {args.gpus}: expected 1, 2, 4 or 8, at most the {visible} visible",
                  file=sys.stderr)
            return 1
        world = args.gpus
    else:
        world = max(n for n in (1, 2, 4, 8) if n <= visible)  # pooler's tp is 1, 2, 4 or 8
    if not args.lib.is_file():
        print(f"pooler_torch: {args.lib} does not exist; build it with `cmake --build build --target pooler` or "
              "pass --lib", file=sys.stderr)
        return 1
    try:
        Library(args.lib)  # a clear error here rather than one per rank
    except PoolerError as error:
        print(f"pooler_torch: {error}", file=sys.stderr)
        return 1
    print(f"pooler_torch: {world} rank(s) on {visible} visible GPU(s), torch {torch.__version__}, {args.lib}",
          flush=True)
    directory = tempfile.mkdtemp(prefix="pooler_torch_")
    try:
        mp.spawn(worker, args=(world, args, os.path.join(directory, "rendezvous")), nprocs=world, join=True)
    except Exception as error:  # a rank failed: spawn has ended the others
        print(f"pooler_torch: FAILED: {error}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
