# SPDX-License-Identifier: Apache-2.0
"""Loading libpooler.so and calling it: every status becomes an exception that
carries the library's message (the value at fault and what was expected)."""

import ctypes
import importlib.util
import os
import threading
from pathlib import Path

from . import _abi, _logging
from ._build_info import VERSION


class PoolerError(RuntimeError):
    """A failed pooler call; `status` is the C status name ("POOLER_CUDA_ERROR", ...)."""

    def __init__(self, message, status="POOLER_OTHER"):
        super().__init__(message)
        self.status = status


class InvalidArgument(PoolerError, ValueError):
    """The library refused an argument (POOLER_INVALID_ARGUMENT); also a ValueError."""


class NoDriverError(PoolerError):
    """No usable CUDA driver (POOLER_NO_DRIVER)."""


class PeerTimeout(PoolerError):
    """A peer did not publish within the spin timeout. The Pooler refuses further
    calls: close it on every rank and build another."""

    def __init__(self, message, *, rank, missing_peer, layer, stage, elapsed_ns):
        super().__init__(message, "POOLER_PEER_TIMEOUT")
        self.rank, self.missing_peer, self.layer, self.stage = rank, missing_peer, layer, stage
        self.elapsed_ns = elapsed_ns


_handle, _out_handle = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
_int_p, _u64, _int, _stream = ctypes.POINTER(ctypes.c_int), ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p
_tensor_p, _input_p = ctypes.POINTER(_abi.Tensor), ctypes.POINTER(_abi.ExpertInput)

# Every function of include/pooler/pooler.h that the package calls, as declared there.
_SIGNATURES = {
    "pooler_device_count": [_int_p],
    "pooler_get_unique_id": [ctypes.POINTER(_abi.UniqueId)],
    "pooler_comm_init_rank": [_out_handle, _int, ctypes.POINTER(_abi.UniqueId), _int, _int],
    "pooler_comm_adopt": [_out_handle, ctypes.c_void_p],
    "pooler_comm_nccl": [_handle, ctypes.POINTER(ctypes.c_void_p)],
    "pooler_comm_destroy": [_handle],
    "pooler_comm_abort": [_handle],
    "pooler_options_init": [ctypes.POINTER(_abi.Options), ctypes.c_size_t],
    "pooler_create": [_out_handle, _handle, ctypes.POINTER(_abi.Options)],
    "pooler_destroy": [_handle],
    "pooler_warm_up": [_handle],
    "pooler_run": [_handle, _int, _u64, _int, _stream, _input_p],
    "pooler_project": [_handle, _int, _u64, _int, _stream, _tensor_p],
    "pooler_publish": [_handle, _int, _stream],
    "pooler_prefetch_weights": [_handle, _int, _stream],
    "pooler_gather": [_handle, _int, _int, _stream, _input_p],
    "pooler_run_into": [_handle, _int, _u64, _int, _stream, _input_p],
    "pooler_project_into": [_handle, _int, _u64, _int, _stream, _tensor_p],
    "pooler_publish_from": [_handle, _tensor_p, _stream],
    "pooler_gather_into": [_handle, _int, _int, _stream, _input_p],
    "pooler_scratch": [_handle, _tensor_p, _input_p],
    "pooler_last_projection": [_handle, _tensor_p],
    "pooler_check": [_handle],
    "pooler_peer_timeout": [_handle, ctypes.POINTER(_abi.PeerTimeoutInfo)],
    "pooler_info": [_handle, _int_p, _int_p, _int_p],
    "pooler_get_transport": [_handle, _int_p],
    "pooler_form_count": [_handle, _int_p],
    "pooler_form": [_handle, _int, ctypes.POINTER(ctypes.c_char_p)],
    "pooler_set_log_callback": [_logging.CALLBACK, ctypes.c_void_p, _int],
    "pooler_log": [_int, ctypes.c_char_p],
    # The seed's per-kernel entry points (_kernels.py) and what they read of a Pooler.
    "pooler_rows": [_handle, _tensor_p],
    "pooler_mailbox": [_handle, ctypes.POINTER(_abi.MailboxInfo)],
    "pooler_choose_gemm_shape": [_int, _int, _int, ctypes.POINTER(_abi.GemmShape)],
    "pooler_gemm_compile": [_out_handle, _int, _int, _int, _int, ctypes.POINTER(_abi.GemmShape), _int],
    "pooler_gemm_launch": [_handle, _u64, _u64, _u64, _stream],
    "pooler_gemm_info": [_handle, _int_p, _int_p, _int_p, ctypes.POINTER(_abi.GemmShape)],
    "pooler_gather_compile": [_out_handle, _int, _int, _int, _int, _int],
    "pooler_gather_launch": [_handle, ctypes.POINTER(_abi.MailboxInfo), _u64, _int, _stream],
    "pooler_norm_quant_compile": [_out_handle, _int, _int, _int, _int, ctypes.c_float, ctypes.c_float, _int],
    "pooler_norm_quant_launch": [_handle, ctypes.POINTER(_abi.MailboxInfo), _u64, _u64, _u64, _u64, _int, _stream],
    "pooler_kernel_form": [_handle, ctypes.POINTER(ctypes.c_char_p)],
    "pooler_kernel_destroy": [_handle],
}

_lock = threading.Lock()
_library = None


def library_path():
    """POOLER_LIBRARY if set (a development build), else the libpooler.so bundled with the package."""
    override = os.environ.get("POOLER_LIBRARY")
    return Path(override) if override else Path(__file__).with_name("libpooler.so")


# pooler's NCCL floor (symmetric memory, ncclTeamLsa) and the first torch on PyPI that ships it.
NCCL_FLOOR, TORCH_FLOOR = (2, 28), "2.11"


def _check_torch_nccl(torch):
    """ImportError naming the NCCL that torch loaded when it is older than pooler's floor: libpooler
    would bind to it and fail at the first symbol it lacks (undefined symbol: ncclTeamLsa)."""
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 (a torch without NCCL, a CPU build: libpooler finds its own)
        return
    if isinstance(version, int):  # older torch: 22807 for 2.28.7
        version = (version // 10000, version // 100 % 100, version % 100)
    if tuple(version[:2]) < NCCL_FLOOR:
        raise ImportError(f"pooler: torch {torch.__version__} loads NCCL {'.'.join(map(str, version))}; pooler needs "
                          f"NCCL {NCCL_FLOOR[0]}.{NCCL_FLOOR[1]} or newer (symmetric memory): install torch "
                          f"{TORCH_FLOOR} or newer (pip install 'torch>={TORCH_FLOOR}')")


def _load():
    path = library_path()
    # torch first, where installed: its libnccl.so.2 and CUDA libraries are then the
    # ones libpooler binds to (an engine's communicator must come from the same NCCL).
    if importlib.util.find_spec("torch") is not None:
        import torch

        _check_torch_nccl(torch)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as error:
        raise ImportError(
            f"pooler: cannot load {path}: {error}. libpooler.so links NCCL 2.28 or newer (libnccl.so.2, never in "
            "the wheel) and libcrypto (in a manylinux wheel's pooler.libs, else the system's): install torch 2.11 "
            "or newer (pooler imports it first, and so its NCCL), or put a folder holding libnccl.so.2 on "
            "LD_LIBRARY_PATH. The CUDA driver and NVRTC are opened later, at first use") from None
    lib.pooler_abi_version.argtypes, lib.pooler_abi_version.restype = [], ctypes.c_int
    lib.pooler_version.argtypes, lib.pooler_version.restype = [], ctypes.c_char_p
    lib.pooler_status_name.argtypes, lib.pooler_status_name.restype = [ctypes.c_int], ctypes.c_char_p
    lib.pooler_last_error.argtypes, lib.pooler_last_error.restype = [], ctypes.c_char_p
    abi = lib.pooler_abi_version()
    if abi != _abi.ABI_VERSION:
        raise ImportError(f"pooler: {path} implements C ABI {abi}; this package was built for ABI {_abi.ABI_VERSION}")
    version = lib.pooler_version().decode()
    if version != VERSION:
        raise ImportError(f"pooler: {path} is pooler {version}; this package is pooler {VERSION}")
    for name, argtypes in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
    _logging.route(lib)  # the library's lines into logging.getLogger("pooler"), unless POOLER_LOG_DEST is set
    return lib


def library():
    """libpooler.so, loaded and checked on first use."""
    global _library
    with _lock:
        if _library is None:
            _library = _load()
        return _library


def library_version():
    """pooler_version() of the loaded library."""
    return library().pooler_version().decode()


def call(name, *args, pooler=None):
    """Calls `name`; a status other than POOLER_OK raises. `pooler` (a handle)
    lets a PeerTimeout carry its fields."""
    lib = library()
    status = getattr(lib, name)(*args)
    if status == _abi.OK:
        return
    message = (lib.pooler_last_error() or b"").decode(errors="replace")
    status_name = lib.pooler_status_name(status).decode()
    if status == _abi.PEER_TIMEOUT and pooler is not None:
        info = _abi.PeerTimeoutInfo()
        if lib.pooler_peer_timeout(pooler, ctypes.byref(info)) == _abi.OK and info.occurred:
            raise PeerTimeout(message, rank=info.rank, missing_peer=info.missing_peer, layer=info.layer,
                              stage=info.stage, elapsed_ns=info.elapsed_ns)
    if status == _abi.INVALID_ARGUMENT:
        raise InvalidArgument(message, status_name)
    if status == _abi.NO_DRIVER:
        raise NoDriverError(message, status_name)
    raise PoolerError(f"{status_name}: {message}", status_name)


def device_count():
    """CUDA devices that libpooler sees (NoDriverError without a driver)."""
    count = ctypes.c_int()
    call("pooler_device_count", ctypes.byref(count))
    return count.value
