# SPDX-License-Identifier: Apache-2.0
"""libpooler's lines into Python's logging, on logger "pooler".

Loading the library registers a callback (pooler_set_log_callback) that hands each line to
logging.getLogger("pooler") at the matching level (the library's trace as level 5), the
message prefixed with "[rank R pid P]" and the rank in the record's `pooler_rank`. The
callback asks for every line at or above POOLER_LOG_LEVEL when that is set, else for every
line from debug up, and the logger's own level and handlers decide. When POOLER_LOG_DEST is
set, the library writes there itself and nothing is routed. The callback is unregistered at
interpreter exit."""

import atexit
import ctypes
import logging
import os

from . import _abi

logger = logging.getLogger("pooler")

TRACE = 5  # the library's trace, below logging.DEBUG

_TO_PYTHON = {
    _abi.LOG_TRACE: TRACE,
    _abi.LOG_DEBUG: logging.DEBUG,
    _abi.LOG_INFO: logging.INFO,
    _abi.LOG_WARN: logging.WARNING,
    _abi.LOG_ERROR: logging.ERROR,
    _abi.LOG_CRITICAL: logging.CRITICAL,
}
_BY_NAME = {"trace": _abi.LOG_TRACE, "debug": _abi.LOG_DEBUG, "info": _abi.LOG_INFO, "warn": _abi.LOG_WARN,
            "warning": _abi.LOG_WARN, "error": _abi.LOG_ERROR, "err": _abi.LOG_ERROR,
            "critical": _abi.LOG_CRITICAL, "off": _abi.LOG_OFF}

# void (*)(void* user_data, int level, int rank, const char* message)
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_char_p)


def _deliver(_user_data, level, rank, message):
    try:
        python_level = _TO_PYTHON.get(level, logging.ERROR)
        if logger.isEnabledFor(python_level):
            text = message.decode(errors="replace") if message else ""
            logger.log(python_level, "[rank %s pid %d] %s", rank if rank >= 0 else "-", os.getpid(), text,
                       extra={"pooler_rank": rank})
    except Exception:  # noqa: BLE001 - nothing may propagate into the library's thread
        pass


# The library keeps the function pointer: this object must live as long as it is registered
# (for the process: module globals are never collected before the atexit hook below ran).
_callback = CALLBACK(_deliver)
_routed = False


def min_level():
    """The library's minimum level for the callback: POOLER_LOG_LEVEL's, else debug (an unknown name:
    warn, as the library itself takes it)."""
    text = os.environ.get("POOLER_LOG_LEVEL", "")
    if not text:
        return _abi.LOG_DEBUG
    return _BY_NAME.get(text, _abi.LOG_WARN)


def route(lib):
    """Registers the callback with `lib` unless POOLER_LOG_DEST is set; True when it did."""
    global _routed
    if os.environ.get("POOLER_LOG_DEST"):
        return False
    status = lib.pooler_set_log_callback(_callback, None, min_level())
    if status != _abi.OK:
        raise ImportError("pooler: pooler_set_log_callback failed: " +
                          (lib.pooler_last_error() or b"").decode(errors="replace"))
    if not _routed:
        atexit.register(_unroute, lib)
    _routed = True
    return True


def _unroute(lib):
    global _routed
    if _routed:
        lib.pooler_set_log_callback(CALLBACK(), None, _abi.LOG_OFF)
        _routed = False
