# SPDX-License-Identifier: Apache-2.0
"""The seed's Pooler and PoolerLayer over libpooler's C ABI (see the package's docstring)."""

import ctypes
import fractions
import math
import os
import warnings
from typing import NamedTuple, Optional, Sequence

import torch
import torch.distributed as dist

from . import _abi, _kernels, _ops
from ._library import PoolerError, call

TPS = (1, 2, 4, 8)
# transport= values and their pooler_transport codes (pooler.h).
TRANSPORTS = {"auto": "POOLER_TRANSPORT_AUTO", "lamport": "POOLER_TRANSPORT_LAMPORT", "nccl": "POOLER_TRANSPORT_NCCL"}


class PoolerLayer(NamedTuple):
    """What the pooler reads from one stock MoE layer (views, no copies; they must outlive the Pooler)."""

    weight: torch.Tensor  # [P / tp, H] BF16: this rank's rows of pooler.weight, contiguous
    norm_weight: torch.Tensor  # [P] BF16 pre_expert_norm weight
    eps: float
    gain_center: float
    global_scale: Optional[torch.Tensor] = None  # [1] FP32 NVFP4 input global scale; None: a BF16 edge layer


class _DeviceArray:
    """Device memory that torch.as_tensor wraps without a copy."""

    def __init__(self, address, shape, typestr):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (address, False),
                                         "version": 2}


_TYPESTR = {_abi.DTYPE_BF16: "<i2", _abi.DTYPE_F32: "<f4", _abi.DTYPE_U8: "|u1", _abi.DTYPE_E4M3: "|u1"}
_TORCH_DTYPE = {_abi.DTYPE_BF16: torch.bfloat16, _abi.DTYPE_F32: torch.float32, _abi.DTYPE_U8: torch.uint8,
                _abi.DTYPE_E4M3: torch.float8_e4m3fn}
_C_DTYPE = {dtype: code for code, dtype in _TORCH_DTYPE.items()}


def _wrap(desc, device):
    """A torch tensor over the library's memory described by a pooler_tensor."""
    raw = torch.as_tensor(_DeviceArray(desc.data, (desc.rows, desc.cols), _TYPESTR[desc.dtype]), device=device)
    return raw.view(_TORCH_DTYPE[desc.dtype])


def _desc(tensor):
    """A pooler_tensor over a 2-D torch tensor (checked by the library: shape, contiguity, alignment)."""
    return _abi.Tensor(tensor.data_ptr(), tensor.shape[0], tensor.shape[1] if tensor.dim() == 2 else 1,
                       _C_DTYPE.get(tensor.dtype, -1))


_MESSAGE_BYTES = 1024


def _group_device(group, device):
    """Where `group`'s collectives take tensors: the CPU when it has gloo, else the GPU."""
    if "gloo" in str(dist.get_backend(group)):
        return torch.device("cpu")
    return device if device is not None else torch.device("cuda", torch.cuda.current_device())


def _compiling():
    return torch.compiler.is_compiling()


def _check_tensor(name, value, dtype, shape, device, alignment=16):
    """TypeError or ValueError naming `name` unless `value` is a contiguous, aligned `dtype` `shape` on `device`."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} is a {type(value).__name__}; expected a torch.Tensor")
    wanted = f"{dtype} {list(shape)}, contiguous, on {device}"
    if value.dtype != dtype:
        raise TypeError(f"{name} is {value.dtype}; expected {wanted}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {list(value.shape)}; expected {wanted}")
    if not value.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {list(value.stride())}); expected {wanted}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device}; expected {wanted}")
    if value.data_ptr() % alignment != 0:
        raise ValueError(f"{name} at {value.data_ptr():#x} is not {alignment}-byte aligned")


def _check_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} is {value!r} ({type(value).__name__}); expected an int")
    return value


def _check_float(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} is {value!r} ({type(value).__name__}); expected a float")
    if not math.isfinite(value):
        raise ValueError(f"{name} is {value!r}; expected a finite float")
    return float(value)


_INT64_MAX = 2 ** 63 - 1


def _nanoseconds(name, seconds):
    """`seconds` (checked finite and positive) as a whole, positive int64 number of nanoseconds, exactly
    as the library's int64_t takes it; ValueError for what it cannot represent (ctypes would wrap it
    silently: 18446744074 s became 0.29 s). The library caps the value itself (one hour)."""
    nanoseconds = round(fractions.Fraction(seconds) * 10 ** 9)  # exact: no float product to round
    if not 0 < nanoseconds <= _INT64_MAX:
        raise ValueError(f"{name} is {seconds!r} s = {nanoseconds} ns; expected 1 ns to {_INT64_MAX} ns "
                         "(an int64_t; the library accepts at most one hour)")
    return nanoseconds


def _released(tensor):
    """Makes `tensor` (a view of the library's memory) an empty tensor of its dtype and trailing
    shape on its device, in place (Tensor.set_), so that it no longer reaches memory that close()
    freed: it reads and writes nothing, and indexing a row raises IndexError."""
    tensor.set_(torch.empty((0,) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device))


def _cuda_device(device):
    try:
        device = torch.device(device)
    except (TypeError, RuntimeError) as error:
        raise TypeError(f"device {device!r}: expected a torch.device ({error})") from None
    if device.type != "cuda":
        raise ValueError(f"device is {device}; expected a CUDA device")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class Pooler:
    """The pooler for every MoE layer of one TP rank: the pooler GEMM, the publish of this
    rank's column block and the gather into the NVFP4 expert input (NVFP4 layers) or the
    normed BF16 rows (BF16 edge layers).

    Construction is collective over `group` (a torch.distributed process group of tp ranks,
    gloo or NCCL): pooler makes its own NCCL communicator through it, or adopts the engine's
    `nccl_comm` (an ncclComm_t address, made with the NCCL that torch loaded). It compiles or
    loads every kernel form; `warm_up` runs each once and must run on every rank alike. `run`
    is graph-capturable and allocates nothing; its outputs are views of scratch that the next
    call overwrites. Under torch.compile the calls go through torch.ops.pooler.* and return
    tensors of their own. Calls must run in the same order on every rank. `close()` (every
    rank) releases it: every method raises PoolerError after it, and every tensor it handed out
    over the library's memory (`shard`, `packed`, `scales`, `rows`, `normed`, `mailbox.view` and
    `mailbox.stage_view`, what run, project, gather and last_projection returned) becomes an empty
    tensor (see close). A Pooler dropped without
    close() is released when it is collected, with a ResourceWarning. Needs NCCL_NVLS_ENABLE=0 in
    the environment, unless `allow_nvls=True` with the engine's `nccl_comm` (NCCL may then use
    NVLink multicast for its own collectives; pooler creates none).

    `transport`: "auto" (default: "lamport" when every rank reaches every other's memory by load and
    store, "nccl" otherwise; every rank decides alike), "lamport" (the mailbox) or "nccl" (an NCCL
    all-gather; across hosts; never raises PeerTimeout). The `transport` property says which was taken.

    `predecessor_triggers_early`: True where the kernel the engine launches on run()'s stream just
    before run() (the one that writes x) lets its dependents start early (griddepcontrol.launch_dependents
    before it writes x), so that run()'s GEMM starts while it runs and brings more of w on chip before its
    PDL wait. The same bits either way; set it only where the predecessor triggers early (where it triggers
    at its end the GEMM is 1-2 us slower with it). False (default): x arrives at the predecessor's end.
    Every rank must pass the same value.
    """

    def __init__(self, group, *, tp: int, rank: int, device, layers: Sequence[PoolerLayer],
                 batches: Sequence[int] = (8,), capacity: int = 32, enable_pdl: bool = True,
                 spin_timeout_s: float = 10.0, nccl_comm=None, transport: str = "auto", allow_nvls: bool = False,
                 predecessor_triggers_early: bool = False):
        self._handle = ctypes.c_void_p()
        self._comm = ctypes.c_void_p()
        self._id = None
        self._closed = False
        self._views = []  # every tensor handed out over the library's memory, released by close()
        self._row_views = {}  # (scratch name, b) -> its first b rows, one view each
        error = None
        try:
            self._validate_transport(transport, allow_nvls, nccl_comm)
            self._validate_predecessor(predecessor_triggers_early)
            self._validate(group, tp, rank, device, layers, batches, capacity, enable_pdl, spin_timeout_s)
        except Exception as caught:  # noqa: BLE001 (any type: a torch RuntimeError must reach the vote too)
            error = caught
        # Every rank learns whether any failed, so that none is left waiting in NCCL.
        self._agree(group, error, device)
        self._create(group, nccl_comm)

    # -- construction --

    def _validate(self, group, tp, rank, device, layers, batches, capacity, enable_pdl, spin_timeout_s):
        if not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group is {type(group).__name__}; expected a torch.distributed.ProcessGroup")
        self.group = group
        self.tp = _check_int("tp", tp)
        if tp not in TPS:
            raise ValueError(f"tp is {tp}: no pooler GEMM shape for TP{tp} (expected one of {TPS})")
        self.rank = _check_int("rank", rank)
        if not 0 <= rank < tp:
            raise ValueError(f"rank is {rank}; expected 0 <= rank < tp = {tp}")
        if group.size() != tp or group.rank() != rank:
            raise ValueError(f"group has {group.size()} ranks and this process is its rank {group.rank()}; "
                             f"expected tp = {tp} ranks and rank {rank}")
        if os.environ.get("NCCL_NVLS_ENABLE") != "0" and not self.allow_nvls:
            raise PoolerError(
                f"NCCL_NVLS_ENABLE is {os.environ.get('NCCL_NVLS_ENABLE', 'unset')!s}: pooler never uses NVLink "
                "multicast and refuses to start without NCCL_NVLS_ENABLE=0. Set it in the environment before "
                "anything starts NCCL (before torch.distributed.init_process_group): "
                "os.environ['NCCL_NVLS_ENABLE'] = '0' at the top of the program, or in the launcher")
        self.capacity = _check_int("capacity", capacity)
        if not 1 <= capacity <= 32:
            raise ValueError(f"capacity is {capacity}; expected 1 to 32 mailbox rows")
        self.batches = tuple(sorted({_check_int("batch", b) for b in batches}))
        if not self.batches or not 1 <= self.batches[0] <= self.batches[-1] <= capacity:
            raise ValueError(f"batches {list(batches)}: expected at least one, each in [1, {capacity}] (capacity)")
        self.enable_pdl = bool(enable_pdl)
        self.spin_timeout_s = _check_float("spin_timeout_s", spin_timeout_s)
        if self.spin_timeout_s <= 0:
            raise ValueError(f"spin_timeout_s is {spin_timeout_s}; expected a positive number of seconds")
        self._spin_timeout_ns = _nanoseconds("spin_timeout_s", self.spin_timeout_s)
        self.device = _cuda_device(device)
        self.layers = tuple(layers)
        if not self.layers:
            raise ValueError("layers is empty; expected one PoolerLayer per MoE layer")
        first = self.layers[0]
        if not isinstance(first, PoolerLayer):
            raise TypeError(f"layers[0] is a {type(first).__name__}; expected a pooler.PoolerLayer")
        if not isinstance(first.norm_weight, torch.Tensor) or first.norm_weight.dim() != 1:
            raise ValueError("layers[0].norm_weight: expected a BF16 [P] tensor")
        if not isinstance(first.weight, torch.Tensor) or first.weight.dim() != 2:
            raise ValueError("layers[0].weight: expected a BF16 [P / tp, H] tensor")
        self.pooled, self.hidden = first.norm_weight.shape[0], first.weight.shape[1]
        if self.pooled % tp != 0:
            raise ValueError(f"P = {self.pooled} (layers[0].norm_weight) is not divisible by tp = {tp}")
        self.width = self.pooled // tp
        for index, layer in enumerate(self.layers):
            name = f"layers[{index}]"
            if not isinstance(layer, PoolerLayer):
                raise TypeError(f"{name} is a {type(layer).__name__}; expected a pooler.PoolerLayer")
            _check_float(f"{name}.eps", layer.eps)
            _check_float(f"{name}.gain_center", layer.gain_center)
            _check_tensor(f"{name}.weight", layer.weight, torch.bfloat16, (self.width, self.hidden), self.device)
            _check_tensor(f"{name}.norm_weight", layer.norm_weight, torch.bfloat16, (self.pooled,), self.device)
            if layer.global_scale is not None:
                _check_tensor(f"{name}.global_scale", layer.global_scale.reshape(-1)
                              if isinstance(layer.global_scale, torch.Tensor) else layer.global_scale,
                              torch.float32, (1,), self.device, alignment=4)
        self._nvfp4 = tuple(layer.global_scale is not None for layer in self.layers)

    def _validate_transport(self, transport, allow_nvls, nccl_comm):
        if not isinstance(transport, str) or transport not in TRANSPORTS:
            raise ValueError(f"transport is {transport!r}; expected one of {', '.join(map(repr, TRANSPORTS))}")
        self.requested_transport = transport
        if not isinstance(allow_nvls, bool):
            raise TypeError(f"allow_nvls is {allow_nvls!r} ({type(allow_nvls).__name__}); expected a bool")
        self.allow_nvls = allow_nvls
        if allow_nvls and nccl_comm is None:
            raise ValueError("allow_nvls=True needs nccl_comm= (the engine's communicator): the communicators "
                             "pooler creates itself always refuse NVLink multicast")

    def _validate_predecessor(self, predecessor_triggers_early):
        if not isinstance(predecessor_triggers_early, bool):
            raise TypeError(f"predecessor_triggers_early is {predecessor_triggers_early!r} "
                            f"({type(predecessor_triggers_early).__name__}); expected a bool")
        self.predecessor_triggers_early = predecessor_triggers_early

    def _agree(self, group, error, device):
        if not isinstance(group, dist.ProcessGroup):
            raise error
        # Plain tensor collectives (the *_object ones need numpy): each rank's message, padded.
        mine = b"" if error is None else f"{type(error).__name__}: {error}".encode()[:_MESSAGE_BYTES]
        where = _group_device(group, self.device if error is None else None)
        local = torch.zeros(_MESSAGE_BYTES + 1, dtype=torch.uint8, device=where)
        if error is not None:
            local[0] = 1
            local[1:1 + len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
        gathered = [torch.empty_like(local) for _ in range(group.size())]
        dist.all_gather(gathered, local, group=group)
        if error is not None:
            raise error
        failed = [f"rank {r}: {bytes(t[1:].cpu().tolist()).rstrip(bytes(1)).decode(errors='replace')}"
                  for r, t in enumerate(gathered) if int(t[0]) != 0]
        if failed:
            raise ValueError("pooler.Pooler: another rank refused its arguments: " + "; ".join(failed))

    def _create(self, group, nccl_comm):
        try:
            if nccl_comm is not None:
                address = nccl_comm.value if isinstance(nccl_comm, ctypes.c_void_p) else int(nccl_comm)
                call("pooler_comm_adopt", ctypes.byref(self._comm), ctypes.c_void_p(address))
            else:
                self._join(group)
            self._build()
        except BaseException:
            self._release()
            raise

    def _join(self, group):
        uid = _abi.UniqueId()
        if self.rank == 0:
            call("pooler_get_unique_id", ctypes.byref(uid))
        raw = torch.frombuffer(bytearray(ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))),
                               dtype=torch.uint8).to(_group_device(group, self.device))
        dist.broadcast(raw, src=dist.get_global_rank(group, 0), group=group)
        ctypes.memmove(ctypes.addressof(uid), bytes(raw.cpu().tolist()), ctypes.sizeof(uid))
        call("pooler_comm_init_rank", ctypes.byref(self._comm), self.tp, ctypes.byref(uid), self.rank,
             self.device.index)

    def _build(self):
        self._descs = (_abi.LayerDesc * len(self.layers))()
        for index, layer in enumerate(self.layers):
            scale = 0 if layer.global_scale is None else layer.global_scale.data_ptr()
            self._descs[index] = _abi.LayerDesc(layer.weight.data_ptr(), layer.norm_weight.data_ptr(), scale,
                                                float(layer.eps), float(layer.gain_center))
        self._batch_array = (ctypes.c_int * len(self.batches))(*self.batches)
        options = _abi.Options()
        call("pooler_options_init", ctypes.byref(options), ctypes.sizeof(options))
        options.layers = ctypes.cast(self._descs, ctypes.POINTER(_abi.LayerDesc))
        options.num_layers = len(self.layers)
        options.batches = ctypes.cast(self._batch_array, ctypes.POINTER(ctypes.c_int))
        options.num_batches = len(self.batches)
        options.capacity = self.capacity
        options.enable_pdl = 1 if self.enable_pdl else 0
        options.spin_timeout_ns = self._spin_timeout_ns
        options.hidden = self.hidden
        options.pooled = self.pooled
        options.transport = _abi.CONSTANTS[TRANSPORTS[self.requested_transport]]
        options.allow_nvls = 1 if self.allow_nvls else 0
        options.predecessor_triggers_early = 1 if self.predecessor_triggers_early else 0
        call("pooler_create", ctypes.byref(self._handle), self._comm, ctypes.byref(options))
        block, outputs = _abi.Tensor(), _abi.ExpertInput()
        self._call("pooler_scratch", ctypes.byref(block), ctypes.byref(outputs))
        self._keep_scratch(_wrap(block, self.device), _wrap(outputs.packed, self.device).view(torch.uint8),
                           _wrap(outputs.scales, self.device).view(torch.uint8), _wrap(outputs.normed, self.device))
        rows = _abi.Tensor()
        self._call("pooler_rows", ctypes.byref(rows))
        self.rows = self._handed_out(_wrap(rows, self.device))  # the edge layers' gathered rows [capacity, P]
        self.mailbox = None  # the seed's `mailbox` (pooler.Mailbox), for compile_gather and compile_norm_quant
        if self.transport == "lamport":
            info = _abi.MailboxInfo()
            self._call("pooler_mailbox", ctypes.byref(info))
            self.mailbox = _kernels.Mailbox(self, info, self.device)
            self._handed_out(self.mailbox.view)
            self._handed_out(self.mailbox.stage_view)
        self._token = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._compiled_block = None
        self._id = _ops.register(self)

    def _keep_scratch(self, shard, packed, scales, normed):
        # The seed's scratch tensors, at capacity rows; outputs are their first b rows.
        self.shard = self._handed_out(shard)
        self.packed = self._handed_out(packed)
        self.scales = self._handed_out(scales)
        self.normed = self._handed_out(normed)
        self._scales_e4m3 = self._handed_out(scales.view(torch.float8_e4m3fn))

    def _handed_out(self, tensor):
        self._views.append(tensor)
        return tensor

    def _rows(self, name, b):
        """The first b rows of the scratch tensor `name`: one view per (name, b), the same object on
        every call (no tensor is made per call), released by close()."""
        view = self._row_views.get((name, b))
        if view is None:
            view = self._row_views[(name, b)] = self._handed_out(getattr(self, name)[:b])
        return view

    def _release(self):
        self._closed = True
        # Views first: nothing handed out reaches the memory freed below.
        for view in self._views:
            _released(view)
        self._views, self._row_views = [], {}
        if self._id is not None:
            _ops.unregister(self._id)
            self._id = None
        if self._handle.value:
            handle, self._handle = self._handle, ctypes.c_void_p()
            call("pooler_destroy", handle)
        if self._comm.value:
            comm, self._comm = self._comm, ctypes.c_void_p()
            call("pooler_comm_destroy", comm)

    def close(self):
        """Collective: waits for the Pooler's work and releases it and its communicator (an
        adopted one stays the engine's). Every method raises PoolerError afterwards. The tensors
        it handed out over the library's memory (`shard`, `packed`, `scales`, `normed` and the
        results of run, project, gather and last_projection) are made empty tensors of their dtype
        in place (torch cannot make a tensor raise on use): they no longer reach the freed memory
        and read or write nothing. Tensors made from them afterwards by the caller (a slice of a
        slice, .view()) are not tracked: drop them before close."""
        self._release()

    def __del__(self):
        # A Pooler dropped without close(): released here, like close() (collective: every rank
        # must drop it alike), with a warning. The op registry holds it only weakly.
        handle = getattr(self, "_handle", None)
        if getattr(self, "_closed", True) or handle is None or not handle.value:
            return
        try:
            warnings.warn(f"pooler.Pooler (rank {getattr(self, 'rank', '?')}) collected without close(); "
                          "releasing it now. Call close() on every rank (or use `with`)", ResourceWarning)
            self._release()
        except Exception:  # noqa: BLE001 (at interpreter exit the library may be gone)
            pass
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- helpers --

    def _open(self, name):
        if self._closed or not self._handle.value:
            raise PoolerError(f"Pooler.{name}: this Pooler is closed")

    def _call(self, name, *args):
        if self._closed or not self._handle.value:
            raise PoolerError(f"{name}: this Pooler is closed")
        call(name, self._handle, *args, pooler=self._handle)

    def _stream(self):
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def _check_layer(self, layer):
        _check_int("layer", layer)
        if not 0 <= layer < len(self.layers):
            raise ValueError(f"layer {layer} out of range [0, {len(self.layers)})")
        return layer

    def _check_b(self, b):
        _check_int("b", b)
        if b not in self.batches:
            capturing = torch.cuda.is_current_stream_capturing()
            raise ValueError(f"b = {b} is not a compiled batch (compiled: {list(self.batches)})"
                             + ("; add it to batches: nothing compiles during CUDA-graph capture" if capturing else ""))
        return b

    def _check_x(self, x):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x is a {type(x).__name__}; expected a torch.Tensor")
        b = x.shape[0] if x.dim() == 2 else -1
        _check_tensor("x", x, torch.bfloat16, (b, self.hidden), self.device)
        return self._check_b(b)

    def outputs(self, layer, b):
        """Fresh output tensors for `layer` at b rows: (packed U8 [b, P / 2], scales E4M3
        [b, P / 16]) for an NVFP4 layer, (normed BF16 [b, P],) for an edge layer."""
        self._open("outputs")
        return _ops.new_outputs(_ops.Shape(self.hidden, self.pooled, self.width, self._nvfp4), layer, b,
                                self.device)[:2 if self._nvfp4[layer] else 1]

    def _expert_input(self, layer, outputs):
        expert = _abi.ExpertInput()
        if self._nvfp4[layer]:
            expert.nvfp4, expert.packed, expert.scales = 1, _desc(outputs[0]), _desc(outputs[1])
        else:
            expert.normed = _desc(outputs[0])
        return expert

    def _result(self, layer, b):
        return (self._rows("packed", b), self._rows("_scales_e4m3", b)) if self._nvfp4[layer] else self._rows(
            "normed", b)

    # -- the seed's API --

    def project(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """The pooler GEMM: this rank's [b, P / tp] columns into scratch (a view of `shard`)."""
        self._open("project")
        if _compiling():
            self._compiled_block = torch.ops.pooler.project(self._id, layer, x, self._token)
            return self._compiled_block
        self._check_layer(layer)
        b = self._check_x(x)
        block = _abi.Tensor()
        self._call("pooler_project", layer, x.data_ptr(), b, self._stream(), ctypes.byref(block))
        return self._rows("shard", b)

    def publish(self, b: int, block: Optional[torch.Tensor] = None) -> None:
        """Multicast the first b rows of the projected block (`block`: publish these BF16
        [b, P / tp] rows instead, as project_into or torch.compile left them)."""
        self._open("publish")
        if _compiling():
            source = block if block is not None else self._compiled_block
            torch.ops.pooler.publish(self._id, source[:b], self._token)
            return
        self._check_b(b)
        if block is None:
            self._call("pooler_publish", b, self._stream())
            return
        _check_tensor("block", block, torch.bfloat16, (b, self.width), self.device)
        self._call("pooler_publish_from", ctypes.byref(_desc(block)), self._stream())

    def prefetch_weights(self, layer: int) -> None:
        """Bring this rank's weight slice of `layer` into L2 ahead of its run(): a fire-and-forget
        kernel on the current stream (eager or inside a CUDA graph; not a torch.compile op). Changes
        no output; any layer, in any order."""
        self._open("prefetch_weights")
        if _compiling():
            raise RuntimeError("Pooler.prefetch_weights is not a torch.compile op: call it outside the compiled region")
        self._check_layer(layer)
        self._call("pooler_prefetch_weights", layer, self._stream())

    def gather(self, layer: int, b: int):
        """Consume the published blocks: the NVFP4 expert input (a, a_sf) for an NVFP4 layer,
        the normed BF16 rows for an edge layer."""
        self._open("gather")
        if _compiling():
            out = torch.ops.pooler.gather(self._id, layer, b, self._token)
            return (out[0], out[1]) if self._nvfp4[layer] else out[0]
        self._check_layer(layer)
        self._check_b(b)
        expert = _abi.ExpertInput()
        self._call("pooler_gather", layer, b, self._stream(), ctypes.byref(expert))
        return self._result(layer, b)

    def run(self, layer: int, x: torch.Tensor):
        """x BF16 [b, H] (the pre_ffn_norm output) -> the expert input: (a U8 [b, P / 2],
        a_sf float8_e4m3fn [b, P / 16]) for an NVFP4 layer, normed BF16 [b, P] for an edge layer."""
        self._open("run")
        if _compiling():
            out = torch.ops.pooler.run(self._id, layer, x, self._token)
            return (out[0], out[1]) if self._nvfp4[layer] else out[0]
        self._check_layer(layer)
        b = self._check_x(x)
        expert = _abi.ExpertInput()
        self._call("pooler_run", layer, x.data_ptr(), b, self._stream(), ctypes.byref(expert))
        return self._result(layer, b)

    def warm_up(self) -> None:
        """Collective: one call of each form per batch on zero rows, then a synchronisation.
        Every rank alike, before any CUDA-graph capture."""
        self._call("pooler_warm_up")

    # -- beyond the seed --

    def run_into(self, layer: int, x: torch.Tensor, outputs) -> None:
        """run() into the caller's tensors (`outputs()` makes them); what torch.ops.pooler.run does."""
        self._open("run_into")
        self._check_layer(layer)
        b = self._check_x(x)
        self._check_outputs(layer, b, outputs)
        expert = self._expert_input(layer, outputs)
        self._call("pooler_run_into", layer, x.data_ptr(), b, self._stream(), ctypes.byref(expert))

    def project_into(self, layer: int, x: torch.Tensor, block: torch.Tensor) -> None:
        self._open("project_into")
        self._check_layer(layer)
        b = self._check_x(x)
        _check_tensor("block", block, torch.bfloat16, (b, self.width), self.device)
        self._call("pooler_project_into", layer, x.data_ptr(), b, self._stream(), ctypes.byref(_desc(block)))

    def gather_into(self, layer: int, b: int, outputs) -> None:
        self._open("gather_into")
        self._check_layer(layer)
        self._check_b(b)
        self._check_outputs(layer, b, outputs)
        expert = self._expert_input(layer, outputs)
        self._call("pooler_gather_into", layer, b, self._stream(), ctypes.byref(expert))

    def _check_outputs(self, layer, b, outputs):
        if self._nvfp4[layer]:
            if len(outputs) != 2:
                raise ValueError(f"layer {layer} is an NVFP4 layer: expected outputs (packed, scales)")
            _check_tensor("packed", outputs[0], torch.uint8, (b, self.pooled // 2), self.device)
            _check_tensor("scales", outputs[1], torch.float8_e4m3fn, (b, self.pooled // 16), self.device)
        else:
            if len(outputs) != 1:
                raise ValueError(f"layer {layer} is a BF16 edge layer: expected outputs (normed,)")
            _check_tensor("normed", outputs[0], torch.bfloat16, (b, self.pooled), self.device)

    def check(self) -> None:
        """Raises pooler.PeerTimeout if a consumer recorded one (reads host memory; no sync), and
        PoolerError (status "POOLER_NCCL_ERROR", naming NCCL's code) if NCCL reports an asynchronous
        error on the communicator or it was aborted. Safe from a watchdog thread beside run()."""
        self._call("pooler_check")

    def abort(self) -> None:
        """The way out of a dead or stuck peer: ends this Pooler's communicator at once
        (pooler_comm_abort, ncclCommAbort), from any thread, also while another waits in
        warm_up or run on it, which then raises PoolerError. Not collective. Every later call
        raises PoolerError ("... was aborted"); close() then releases the Pooler without
        collectives. With an adopted `nccl_comm`, the engine's communicator is aborted (and freed)
        too: the engine must not use or destroy it afterwards. A second call does nothing."""
        comm = self._comm
        if self._closed or not comm.value:
            raise PoolerError("Pooler.abort: this Pooler is closed")
        call("pooler_comm_abort", comm)

    def last_projection(self, b: int) -> torch.Tensor:
        """This rank's projected block of the last run/project: the first b rows of `shard`
        (after run_into and torch.ops.pooler.run too); read it before the next call."""
        self._open("last_projection")
        return self._rows("shard", self._check_b(b))

    def is_nvfp4(self, layer: int) -> bool:
        self._open("is_nvfp4")
        return self._nvfp4[self._check_layer(layer)]

    @property
    def transport(self) -> str:
        """The transport construction took: "lamport" or "nccl" (never "auto")."""
        code = ctypes.c_int()
        self._call("pooler_get_transport", ctypes.byref(code))
        names = {_abi.CONSTANTS[constant]: name for name, constant in TRANSPORTS.items()}
        return names[code.value]

    @property
    def forms(self):
        """The compiled kernel forms, one line each, for logs."""
        count = ctypes.c_int()
        self._call("pooler_form_count", ctypes.byref(count))
        lines = []
        for index in range(count.value):
            line = ctypes.c_char_p()
            self._call("pooler_form", index, ctypes.byref(line))
            lines.append(line.value.decode())
        return lines
