# SPDX-License-Identifier: Apache-2.0
"""The seed's per-kernel entry points: compile_pooler_gemm, compile_gather and
compile_norm_quant, each returning a compiled form callable on torch tensors and a stream
(the C ABI's pooler_*_compile and pooler_*_launch), and the Mailbox (a Pooler's `mailbox`)
that the two consumers read.

A call allocates, synchronizes and compiles nothing and may be captured in a CUDA graph,
except the first call of a GEMM at a new (N, K) or device (it compiles, as the seed's
compile_pooler_gemm does for its dynamic N and K: make that call before capture) and the
first call of a consumer on a new mailbox (it binds it: host memory only)."""

import ctypes
import math
import weakref
from typing import Optional

import torch

from . import _abi
from ._library import PoolerError, call
from ._shape import PoolerGemmShape


def _int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} is {value!r} ({type(value).__name__}); expected an int")
    return value


def _device(device):
    if device is None:
        if not torch.cuda.is_available():
            raise PoolerError("no CUDA device is available to torch (device=None takes the current one)")
        return torch.device("cuda", torch.cuda.current_device())
    try:
        device = torch.device(device)
    except (TypeError, RuntimeError) as error:
        raise TypeError(f"device {device!r}: expected a torch.device ({error})") from None
    if device.type != "cuda":
        raise ValueError(f"device is {device}; expected a CUDA device")
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def stream_handle(stream, device):
    """A CUstream as ctypes takes it, from None (torch's current stream on `device`), a
    torch.cuda.Stream (or anything with `cuda_stream`), an int address, or a cuda-python
    CUstream (int() of it)."""
    if stream is None:
        return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)
    if hasattr(stream, "cuda_stream"):
        return ctypes.c_void_p(stream.cuda_stream)
    if isinstance(stream, ctypes.c_void_p):
        return stream
    try:
        return ctypes.c_void_p(int(stream))
    except (TypeError, ValueError):
        raise TypeError(f"stream is a {type(stream).__name__}; expected None (torch's current stream), a "
                        "torch.cuda.Stream, a CUstream or its address") from None


def _check(name, tensor, dtypes, device, alignment=16):
    """TypeError or ValueError naming `name` unless `tensor` is a contiguous tensor of one of `dtypes` on
    `device`, `alignment`-byte aligned."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} is a {type(tensor).__name__}; expected a torch.Tensor")
    wanted = " or ".join(str(dtype) for dtype in dtypes)
    if tensor.dtype not in dtypes:
        raise TypeError(f"{name} is {tensor.dtype}; expected {wanted}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {list(tensor.stride())})")
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}; expected {device}")
    if tensor.data_ptr() % alignment != 0:
        raise ValueError(f"{name} at {tensor.data_ptr():#x} is not {alignment}-byte aligned")


def _check_rows(name, tensor, m, width):
    """`tensor` holds at least m rows of `width` elements: [rows >= m, width], or flat (the seed's views
    of capacity-row scratch)."""
    if tensor.dim() == 2 and tensor.shape[1] == width and tensor.shape[0] >= m:
        return
    if tensor.dim() == 1 and tensor.numel() >= m * width:
        return
    raise ValueError(f"{name} has shape {list(tensor.shape)}; expected [m >= {m}, {width}] (or flat, at least "
                     f"{m * width} elements)")


class _Handle:
    """A pooler_kernel_t, destroyed by close() or when collected."""

    def __init__(self):
        self.value = ctypes.c_void_p()

    def form(self):
        line = ctypes.c_char_p()
        call("pooler_kernel_form", self.value, ctypes.byref(line))
        return line.value.decode()

    def close(self):
        if self.value.value:
            handle, self.value = self.value, ctypes.c_void_p()
            call("pooler_kernel_destroy", handle)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (at interpreter exit the library may be gone)
            pass


class Mailbox:
    """This rank's Lamport mailbox of a Pooler (`Pooler.mailbox`; None under the nccl transport):
    `view` BF16 [3 * tp * capacity * P / tp] (the three stages' slots), `stage_view` its state block
    (int32 [8]: the stage, the rows each stage wrote, ...). Pass it to the consumers of
    compile_gather and compile_norm_quant: a consumer launched on it takes part in the Pooler's
    protocol, so it must come where the Pooler's gather would (after this call's publish, every rank
    alike). pooler never uses NVLink multicast: there is no `multicast` address."""

    def __init__(self, pooler, info, device):
        self._pooler = weakref.ref(pooler)
        self._info = info
        self.tp, self.rank, self.capacity, self.pooled = info.tp, info.rank, info.capacity, info.pooled
        self.width = info.pooled // info.tp
        elements = 3 * info.tp * info.capacity * self.width
        self.view = _wrap(info.mailbox, (elements,), "<i2", device).view(torch.bfloat16)
        self.stage_view = _wrap(info.state, (8,), "<i4", device)

    def info(self):
        """The pooler_mailbox_info (PoolerError once the Pooler is closed)."""
        owner = self._pooler()
        if owner is None or owner._closed:
            raise PoolerError("this mailbox's Pooler is closed")
        return self._info


class _DeviceArray:
    def __init__(self, address, shape, typestr):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (address, False),
                                         "version": 2}


def _wrap(address, shape, typestr, device):
    return torch.as_tensor(_DeviceArray(address, shape, typestr), device=device)


def _mailbox_info(mailbox, stage_state, name):
    if not isinstance(mailbox, Mailbox):
        raise TypeError(f"mailbox is a {type(mailbox).__name__}; expected a pooler.Mailbox (a Pooler's `mailbox`)")
    info = mailbox.info()
    if stage_state is not None and (not isinstance(stage_state, torch.Tensor) or
                                    stage_state.data_ptr() != info.state):
        raise ValueError(f"{name}: stage_state is not this mailbox's stage_view; pass mailbox.stage_view (or None)")
    return info


class PoolerGemm:
    """compile_pooler_gemm's form: call (a, b, residual, c, stream) with torch tensors."""

    def __init__(self, rows, shape, enable_pdl):
        self.rows, self.shape, self.enable_pdl = rows, shape, bool(enable_pdl)
        self._kernels = {}  # (device index, n, k) -> _Handle

    def compile(self, n: int, k: int, device=None) -> None:
        """Compiles (or finds in the caches) the form for N = n, K = k on `device` now, so that
        calls at that shape compile nothing."""
        self._kernel(_int("n", n), _int("k", k), _device(device))

    def _kernel(self, n, k, device):
        key = (device.index, n, k)
        kernel = self._kernels.get(key)
        if kernel is None:
            if torch.cuda.is_current_stream_capturing():
                raise PoolerError(f"compile_pooler_gemm: N = {n}, K = {k} on {device} is not compiled, and nothing "
                                  "compiles during CUDA-graph capture: call it once (or .compile(n, k)) before")
            kernel = _Handle()
            shape = None if self.shape is None else ctypes.byref(self.shape.to_c())
            call("pooler_gemm_compile", ctypes.byref(kernel.value), device.index, self.rows, n, k, shape,
                 1 if self.enable_pdl else 0)
            self._kernels[key] = kernel
        return kernel

    def shape_for(self, n: int, k: int, device=None) -> PoolerGemmShape:
        """The launch shape of the form at (n, k) (compiled if it is not)."""
        kernel = self._kernel(_int("n", n), _int("k", k), _device(device))
        rows, n_out, k_out, shape = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), _abi.GemmShape()
        call("pooler_gemm_info", kernel.value, ctypes.byref(rows), ctypes.byref(n_out), ctypes.byref(k_out),
             ctypes.byref(shape))
        return PoolerGemmShape.from_c(shape)

    @property
    def forms(self):
        """The compiled forms, one line each."""
        return [kernel.form() for kernel in self._kernels.values()]

    def __call__(self, a, b, residual, c, stream=None) -> None:
        """c [rows, N] = a [rows, K] @ b [N, K].T, all BF16, contiguous, 16-byte aligned, on one CUDA
        device; `residual` is ignored (the seed's: pass c)."""
        _check("a", a, (torch.bfloat16,), a.device if isinstance(a, torch.Tensor) else None)
        device = a.device
        if device.type != "cuda":
            raise ValueError(f"a is on {device}; expected a CUDA device")
        _check("b", b, (torch.bfloat16,), device)
        _check("c", c, (torch.bfloat16,), device)
        if a.dim() != 2 or a.shape[0] != self.rows:
            raise ValueError(f"a has shape {list(a.shape)}; expected [{self.rows}, K] (the form's rows)")
        if b.dim() != 2 or b.shape[1] != a.shape[1]:
            raise ValueError(f"b has shape {list(b.shape)}; expected [N, {a.shape[1]}] (K of a)")
        if c.dim() != 2 or tuple(c.shape) != (self.rows, b.shape[0]):
            raise ValueError(f"c has shape {list(c.shape)}; expected [{self.rows}, {b.shape[0]}]")
        kernel = self._kernel(int(b.shape[0]), int(a.shape[1]), device)
        call("pooler_gemm_launch", kernel.value, a.data_ptr(), b.data_ptr(), c.data_ptr(),
             stream_handle(stream, device))

    def close(self):
        for kernel in self._kernels.values():
            kernel.close()
        self._kernels.clear()


class _Consumer:
    def __init__(self, what, hidden, tp, capacity_m, enable_pdl, device):
        self.hidden, self.tp, self.capacity_m = _int("hidden", hidden), _int("tp", tp), _int("capacity_m", capacity_m)
        self.enable_pdl = bool(enable_pdl)
        self.device = _device(device)
        self._what = what
        self._handle = _Handle()

    @property
    def form(self):
        return self._handle.form()

    def close(self):
        self._handle.close()

    def _m(self, m):
        _int("m", m)
        if not 1 <= m <= self.capacity_m:
            raise ValueError(f"{self._what}: m = {m}; expected 1 to {self.capacity_m} (capacity_m)")
        return m


class GatherKernel(_Consumer):
    """compile_gather's form: call (mailbox, output [m, hidden] BF16, stage_state, m, stream)."""

    def __init__(self, hidden, tp, capacity_m, enable_pdl, device):
        super().__init__("compile_gather", hidden, tp, capacity_m, enable_pdl, device)
        call("pooler_gather_compile", ctypes.byref(self._handle.value), self.device.index, self.hidden, self.tp,
             self.capacity_m, 1 if self.enable_pdl else 0)

    def __call__(self, mailbox, output, stage_state, m, stream=None) -> None:
        """Every rank's block of the first m rows, published into `mailbox`, -> output's first m rows."""
        info = _mailbox_info(mailbox, stage_state, "compile_gather")
        m = self._m(m)
        _check("output", output, (torch.bfloat16,), self.device)
        _check_rows("output", output, m, self.hidden)
        call("pooler_gather_launch", self._handle.value, ctypes.byref(info), output.data_ptr(), m,
             stream_handle(stream, self.device))


class NormQuantKernel(_Consumer):
    """compile_norm_quant's form: call (mailbox, weight [hidden] BF16, global_scale [1] FP32, packed
    [m, hidden / 2] u8, scales [m, hidden / 16] u8 (or float8_e4m3fn), stage_state, m, stream)."""

    def __init__(self, hidden, tp, capacity_m, eps, gain_center, enable_pdl, device):
        super().__init__("compile_norm_quant", hidden, tp, capacity_m, enable_pdl, device)
        for name, value in (("eps", eps), ("gain_center", gain_center)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} is {value!r}; expected a finite float")
        self.eps, self.gain_center = float(eps), float(gain_center)
        call("pooler_norm_quant_compile", ctypes.byref(self._handle.value), self.device.index, self.hidden, self.tp,
             self.capacity_m, self.eps, self.gain_center, 1 if self.enable_pdl else 0)

    def __call__(self, mailbox, weight, global_scale, packed, scales, stage_state, m, stream=None) -> None:
        """The first m gathered rows -> pre_expert_norm -> NVFP4 codes (packed) and E4M3 scales."""
        info = _mailbox_info(mailbox, stage_state, "compile_norm_quant")
        m = self._m(m)
        _check("weight", weight, (torch.bfloat16,), self.device)
        if weight.numel() != self.hidden:
            raise ValueError(f"weight has shape {list(weight.shape)}; expected [{self.hidden}]")
        _check("global_scale", global_scale, (torch.float32,), self.device, alignment=4)
        if global_scale.numel() != 1:
            raise ValueError(f"global_scale has shape {list(global_scale.shape)}; expected one FP32 value")
        _check("packed", packed, (torch.uint8,), self.device)
        _check_rows("packed", packed, m, self.hidden // 2)
        _check("scales", scales, (torch.uint8, torch.float8_e4m3fn), self.device)
        _check_rows("scales", scales, m, self.hidden // 16)
        call("pooler_norm_quant_launch", self._handle.value, ctypes.byref(info), weight.data_ptr(),
             global_scale.data_ptr(), packed.data_ptr(), scales.data_ptr(), m, stream_handle(stream, self.device))


def compile_pooler_gemm(rows: int, shape: Optional[PoolerGemmShape] = None, *, enable_pdl: bool = True, n=None,
                        k=None, device=None) -> PoolerGemm:
    """The pooler GEMM c [rows, N] = a [rows, K] @ b [N, K].T (BF16 in and out, FP32 accumulation),
    called with a caller-owned output, as the seed's: call (a, b, residual, c, stream) with torch
    tensors; `residual` is ignored (pass c). N and K are dynamic: each (N, K, device) compiles at
    its first call (or with `n` and `k` given, on `device`, now). `shape` None takes the Pooler's
    choice per (rows, N, K) (PoolerGemmShape.choose); a shape that does not validate raises
    pooler.InvalidArgument at that compile. Refused during CUDA-graph capture, as the seed's."""
    _int("rows", rows)
    if shape is not None and not isinstance(shape, PoolerGemmShape):
        raise TypeError(f"shape is a {type(shape).__name__}; expected a pooler.PoolerGemmShape or None")
    if shape is not None:
        shape.to_c()  # its fields checked now
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise PoolerError("compile_pooler_gemm: nothing compiles during CUDA-graph capture")
    gemm = PoolerGemm(rows, shape, enable_pdl)
    if (n is None) != (k is None):
        raise ValueError("n and k: give both (compile now) or neither (compile at the first call)")
    if n is not None:
        gemm.compile(n, k, device)
    return gemm


def compile_gather(*, hidden: int, tp: int, capacity_m: int, enable_pdl: bool = True, device=None) -> GatherKernel:
    """The plain gather consumer of a BF16 edge layer over a [3, tp, capacity_m, hidden / tp] mailbox.
    Call: (mailbox, output [m, hidden] BF16, stage_state, m, stream), `mailbox` a Pooler's
    `mailbox` (stage_state its `stage_view`, or None). Compiled for `device` (default: the
    current CUDA device)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise PoolerError("compile_gather: nothing compiles during CUDA-graph capture")
    return GatherKernel(hidden, tp, capacity_m, enable_pdl, device)


def compile_norm_quant(*, hidden: int, tp: int, capacity_m: int, eps: float, gain_center: float,
                       enable_pdl: bool = True, device=None) -> NormQuantKernel:
    """The gather + norm + NVFP4 consumer over a [3, tp, capacity_m, hidden / tp] mailbox. Call:
    (mailbox, weight [hidden] BF16, global_scale [1] FP32, packed [m, hidden / 2] u8, scales
    [m, hidden / 16] u8, stage_state, m, stream), as compile_gather."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise PoolerError("compile_norm_quant: nothing compiles during CUDA-graph capture")
    return NormQuantKernel(hidden, tp, capacity_m, eps, gain_center, enable_pdl, device)
